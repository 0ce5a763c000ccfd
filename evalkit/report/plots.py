"""Plots of a results store, each saved as PNG and SVG.

* :func:`pareto` -- quality loss (|Δppl| %, or mean KL) against KV memory saved, one panel per
  model (drawn in :mod:`evalkit.report.pareto`), and where the store has decode runs its decode-KL twin
  (``pareto_decode``).
* :func:`positions` -- Δppl % and KL by token-position bucket (``labels.bucket``), one line per scheme:
  where in the context the damage happens.
* :func:`decode` and :func:`retrieval` -- the decode and retrieval evaluations' own figures (drawn in their
  folders, :mod:`evalkit.evals.decode.plots`, :mod:`evalkit.evals.retrieval.plots`), saved from a whole
  store with the report's style.
* :func:`sensitivity` -- per-layer sensitivity: any metric with a ``labels.layer`` (e.g. the KL of
  quantizing one layer at a time), one line per scheme.

Each function returns the paths written ([] when the store has nothing to draw); its
``*_figures`` twin returns name -> figure (the test reads those back), and :func:`figures` draws
them all with one :class:`~evalkit.report.style.SchemeStyle`, so every figure labels, footnotes,
colours and draws a scheme as the table and the other figures do, the table's marks included (``†``
hypothetical, ``≈n`` order unresolved: :func:`report_style`). Legends sit outside the panels;
interval bands are drawn for at most :data:`MAX_BANDS` series unless ``bands=True``; figures use
constrained layout and are saved with a tight bounding box, so no title is cut.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import pandas as pd  # noqa: E402

from evalkit.errors import EvalkitError  # noqa: E402
from evalkit.evals.decode.report import LAST as DECODE_KL  # noqa: E402  (the decode eval's last-bucket KL column)
from evalkit.evals.figures import (  # noqa: E402
    MAX_BANDS,  # noqa: F401 (re-exported: the report's figures and the evaluations' share it)
    add_footnote,
    band_note,
    legend_outside,
    metric_label,
    metric_scale,
    ordered,
    slug,
)
from evalkit.evals.figures import bands as draw_bands  # noqa: E402
from evalkit.kv.scheme import Scheme  # noqa: E402
from evalkit.report import marks  # noqa: E402
from evalkit.report.pareto import pareto_figure  # noqa: E402
from evalkit.report.results import Results  # noqa: E402
from evalkit.report.style import SchemeStyle  # noqa: E402


def _save(fig, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.svg"]
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    for p in paths:
        fig.savefig(p, dpi=150, bbox_inches="tight", pad_inches=0.08)  # nothing outside the canvas is cut
    plt.close(fig)
    return paths


def _write(figs: dict, out_dir: str | Path) -> list[Path]:
    paths = []
    for name, fig in figs.items():
        paths += _save(fig, Path(out_dir), name)
    return paths


def report_style(results: Results, frame: pd.DataFrame | None = None) -> SchemeStyle:
    """The style of every figure of a store: its schemes (:meth:`SchemeStyle.of_store`) and the marks of
    its table (``frame``, :func:`evalkit.report.tables.summary_frame`; made here when not given), so a
    figure labels each scheme exactly as the table's row does (``† hypothetical``, ``≈n``)."""
    style = SchemeStyle.of_store(results)
    if frame is None:
        from evalkit.report.tables import summary_frame

        try:
            frame = summary_frame(results, engine_profile=None)
        except EvalkitError:  # nothing the table shows: no row, no marks
            return style
    return marks.styled(style, frame)


def _style(results: Results, style: SchemeStyle | None) -> SchemeStyle:
    return style if style is not None else report_style(results)


def pareto(frame: pd.DataFrame, out_dir: str | Path, style: SchemeStyle | None = None) -> list[Path]:
    """``frame``: :func:`evalkit.report.tables.summary_frame` output; see :func:`pareto_figure` (and its
    decode-KL twin where the frame has one)."""
    paths = []
    for name, metric in (("pareto", None), ("pareto_decode", DECODE_KL)):
        fig = pareto_figure(frame, style, metric)
        paths += [] if fig is None else _save(fig, Path(out_dir), name)
    return paths


def _declaring(results: Results, figure: str) -> Results:
    """The store's rows of the evaluations that declare the report's ``figure`` (a name of
    :data:`evalkit.report.evals.FIGURES`) among their plots (what the report's dispatch hands the figure's
    function), for a direct call on a whole store."""
    from evalkit.report.evals import declaring

    return declaring(results, figure)


def _bucket_start(text: str) -> float:
    m = re.match(r"\s*(\d+)", str(text))
    return float(m.group(1)) if m else math.nan


def positions(
    results: Results, out_dir: str | Path, style: SchemeStyle | None = None, bands: bool | None = None
) -> list[Path]:
    """Δppl % and mean KL per token-position bucket, one line per quantized scheme, two panels per
    model. ``bands``: draw the 95 % intervals (default: only when at most :data:`MAX_BANDS` series)."""
    return _write(positions_figures(_declaring(results, "positions"), _style(results, style), bands), out_dir)


def positions_figures(results: Results, style: SchemeStyle | None = None, bands: bool | None = None) -> dict:
    """name -> figure of :func:`positions`."""
    df = results.rows
    df = df[
        df["labels"].map(lambda d: "bucket" in d) & df["metric"].isin(["ppl_delta_rel", "kl_mean"])
    ]  # perplexity's rows
    df = df[df["scheme"] != str(Scheme())]
    if df.empty:
        return {}
    style = _style(results, style)
    df = df.assign(bucket=df["labels"].map(lambda d: d["bucket"]))
    df = df.assign(start=df["bucket"].map(_bucket_start))
    figures = {}
    for model, g in df.groupby("model", sort=False):
        schemes = ordered(style, g["scheme"])
        drawn = draw_bands(bands, len(schemes))
        buckets = sorted(set(g["bucket"]), key=_bucket_start)
        where = {b: i for i, b in enumerate(buckets)}
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), layout="constrained")
        for ax, metric in zip(axes, ("ppl_delta_rel", "kl_mean")):
            scale = metric_scale(metric)
            for scheme in schemes:
                s = g[(g["metric"] == metric) & (g["scheme"] == scheme)].sort_values("start")
                if s.empty:
                    continue
                x = s["bucket"].map(where).to_numpy()
                line = style.line(scheme, model)
                ax.plot(x, s["value"] * scale, ms=4, lw=1.4, **line.kw())
                if drawn and s["ci_low"].notna().all():
                    ax.fill_between(x, s["ci_low"] * scale, s["ci_high"] * scale, color=line.color, alpha=0.12, lw=0)
            ax.set_xticks(range(len(buckets)), buckets, fontsize=8)
            ax.margins(x=0.06)
            ax.set_xlabel("token position in the window (bucket)")
            ax.set_ylabel(metric_label(metric))
            ax.grid(alpha=0.3)
        axes[0].axhline(0, color="k", lw=0.8)
        handles, labels = axes[0].get_legend_handles_labels()
        legend_outside(fig, handles, labels, style.legend_title(schemes))
        fig.suptitle(f"{model}: degradation by token position", fontsize=11)
        add_footnote(fig, style.notes(schemes, model) + band_note(drawn, len(schemes), "plots.positions"))
        figures[f"positions_{slug(model)}"] = fig
    return figures


def decode(
    results: Results, out_dir: str | Path, style: SchemeStyle | None = None, bands: bool | None = None
) -> list[Path]:
    """Decode KL per position bucket, one line per quantized scheme (x: the bucket's middle position,
    y: mean KL on a log axis); one figure per model. ``bands``: the 95 % intervals (default: only when
    at most :data:`MAX_BANDS` series). Buckets whose KL is not above zero cannot sit on a log axis
    and are left out."""
    from evalkit.evals.decode.plots import PLOT, decode_figures

    return _write(decode_figures(_declaring(results, PLOT), _style(results, style), bands), out_dir)


def retrieval(results: Results, out_dir: str | Path, style: SchemeStyle | None = None) -> list[Path]:
    """Accuracy heatmaps (needle depth x context length), one figure per model and task, one panel
    per scheme on a grid of at most four columns; the title says how many samples each cell holds."""
    from evalkit.evals.retrieval.plots import PLOT, retrieval_figures

    return _write(retrieval_figures(_declaring(results, PLOT), _style(results, style)), out_dir)


def sensitivity(results: Results, out_dir: str | Path, style: SchemeStyle | None = None) -> list[Path]:
    """Per-layer sensitivity: any metric with a ``labels.layer``, one line per scheme, one figure per
    model and metric (y: the metric's readable name, % for relative perplexity changes)."""
    return _write(sensitivity_figures(results, style), out_dir)


def sensitivity_figures(results: Results, style: SchemeStyle | None = None) -> dict:
    """name -> figure of :func:`sensitivity`."""
    df = results.rows[results.rows["labels"].map(lambda d: "layer" in d)]
    if df.empty:
        return {}
    style = _style(results, style)
    df = df.assign(layer=df["labels"].map(lambda d: int(d["layer"])))
    figures = {}
    for (model, metric), g in df.groupby(["model", "metric"], sort=False):
        schemes = ordered(style, g["scheme"])
        scale = metric_scale(metric)
        fig, ax = plt.subplots(figsize=(9, 4.2), layout="constrained")
        for scheme in schemes:
            s = g[g["scheme"] == scheme].sort_values("layer")
            ax.plot(s["layer"], s["value"] * scale, ms=3.5, lw=1.3, **style.line(scheme, model).kw())
        ax.set_xlabel("layer")
        ax.set_ylabel(metric_label(metric), fontsize=9)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_title(f"{model}: per-layer sensitivity", fontsize=11)
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        legend_outside(fig, handles, labels, style.legend_title(schemes))
        add_footnote(fig, style.notes(schemes, model))
        figures[f"sensitivity_{slug(model)}_{slug(metric)}"] = fig
    return figures


def figures(results: Results, frame: pd.DataFrame, bands: bool | None = None) -> dict:
    """name -> figure, every figure of a store, all with one :class:`SchemeStyle`: a scheme has the
    same label (the table row's, marks included), colour and line in each of them and in the table. The
    caller closes them (:func:`all_plots` saves and closes)."""
    style = report_style(results, frame)
    out = {}
    for name, metric in (("pareto", None), ("pareto_decode", DECODE_KL)):
        fig = pareto_figure(frame, style, metric)
        if fig is not None:
            out[name] = fig
    from evalkit.report.evals import figures as eval_figures  # each evaluation's declared plots, on its own rows

    return {**out, **eval_figures(results, style=style, bands=bands), **sensitivity_figures(results, style)}


def all_plots(results: Results, frame: pd.DataFrame, out_dir: str | Path, bands: bool | None = None) -> list[Path]:
    """Every figure of :func:`figures`, saved as PNG and SVG under ``out_dir``."""
    return _write(figures(results, frame, bands), out_dir)
