"""The figure kit every evaluation's own figures share, and the report's: axis labels and scales of the
metrics, footnotes under a constrained-layout figure, panel titles wrapped, legends outside the panels,
interval bands drawn for at most :data:`MAX_BANDS` series unless asked, schemes in the style's order, file
names from free text.

An evaluation draws its figures in its own folder (``evals/<name>/plots.py``) and declares them in its
``ReportSpec.plots``; the report calls each with the store's rows of that evaluation and one
:class:`evalkit.report.style.SchemeStyle` (passed in, duck-typed here: ``style.schemes``, ``style.line``,
``style.label``, ``style.legend_title``, ``style.notes``), so a scheme looks alike in every figure and in the
table. Nothing here imports matplotlib at module import.
"""

from __future__ import annotations

import re
import textwrap

# readable axis labels for the metrics the figures draw (others fall back to the metric name)
METRIC_LABELS = {
    "kl_mean": "mean KL to baseline (nats/token)",
    "ppl_delta_rel": "Δ perplexity vs baseline (%)",
    "kl_mean_one_layer": "mean KL (nats/token),\nonly this layer quantized",
    "kl_mean_all_but_one": "mean KL (nats/token),\nall layers but this one quantized",
    "ppl_delta_rel_one_layer": "Δ perplexity (%),\nonly this layer quantized",
    "ppl_delta_rel_all_but_one": "Δ perplexity (%),\nall layers but this one quantized",
}
PERCENT_METRICS = ("ppl_delta_rel", "ppl_delta_rel_one_layer", "ppl_delta_rel_all_but_one")


def metric_label(metric: str) -> str:
    """The axis label of a metric, e.g. ``kl_mean_one_layer`` -> ``mean KL (nats/token), only this layer quantized``."""
    return METRIC_LABELS.get(metric, metric.replace("_", " "))


def metric_scale(metric: str) -> float:
    """What a metric's stored value is multiplied by on an axis labelled by :func:`metric_label` (100 for %)."""
    return 100.0 if metric in PERCENT_METRICS else 1.0


MAX_BANDS = 6  # more interval bands than this blur into one another: drawn only when asked


def slug(text: str) -> str:
    """A file-name-safe piece of ``text`` (at most 80 characters)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:80]


def ordered(style, schemes) -> list[str]:
    """``schemes`` in the style's order (baseline, then format, granularity, scale source), so every
    figure lists them alike."""
    have = set(schemes)
    return [s for s in style.schemes if s in have] + sorted(have - set(style.schemes))


def bands(asked: bool | None, n_series: int) -> bool:
    """Whether to draw the 95 % interval bands: as ``asked``, else only for at most :data:`MAX_BANDS` series."""
    return n_series <= MAX_BANDS if asked is None else bool(asked)


def band_note(drawn: bool, n_series: int, where: str) -> list[str]:
    """The footnote line that says whether the bands are drawn, and how to have them when not."""
    if drawn:
        return ["bands: 95 % intervals, as the table's"]
    return [f"95 % intervals not drawn ({n_series} series would blur together; {where} draws them with bands=True)"]


def legend_outside(fig, handles, labels, title: str, ncols: int = 1):
    """The figure's one legend, right of the panels (constrained layout makes room for it)."""
    return fig.legend(
        handles,
        labels,
        loc="outside right center",
        fontsize=7,
        ncols=ncols,
        title=title,
        title_fontsize=6.5,
        frameon=False,
        alignment="left",
    )


def add_footnote(fig, notes: list[str], fontsize: float = 7.0, width: int = 160, legend=None) -> None:
    """Notes under a constrained-layout figure, inside it: the panels shrink to leave them room.

    ``legend``: (handles, labels, kwargs) of a figure legend to set in one row above the notes,
    under the panels (off the data)."""
    lines = [w for note in notes for w in textwrap.wrap(note, width)]
    if not lines and legend is None:
        return
    height = fig.get_size_inches()[1]
    note_frac = (len(lines) * fontsize * 1.35 + 6) / 72 / height if lines else 0.0
    legend_frac = 0.0
    if legend is not None:
        handles, labels, kw = legend
        title_lines = len(str(kw.get("title") or "").splitlines())
        legend_frac = (title_lines * kw.get("title_fontsize", 7) * 1.4 + kw.get("fontsize", 8) * 2.0 + 8) / 72 / height
        fig.legend(
            handles,
            labels,
            loc="lower center",
            bbox_to_anchor=(0.5, note_frac),
            frameon=False,
            ncols=len(handles),
            **kw,
        )
    frac = min(0.45, note_frac + legend_frac)
    engine = fig.get_layout_engine()
    if engine is not None:
        engine.set(rect=(0, frac, 1, 1 - frac))
    if lines:
        fig.text(0.01, 0.005, "\n".join(lines), fontsize=fontsize, color="0.3", va="bottom", ha="left")


def wrap(text: str, width: int = 28) -> str:
    """A panel title on lines of at most ``width`` characters (split after ``/`` or ``+`` where it can)."""
    if len(text) <= width:
        return text
    parts, line = [], ""
    for piece in text.replace("/", "/\u0000").replace("+", "\u0000+").split("\u0000"):
        if line and len(line) + len(piece) > width:
            parts.append(line)
            line = ""
        line += piece
    return "\n".join(parts + [line])
