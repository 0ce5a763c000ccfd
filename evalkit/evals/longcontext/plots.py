"""The longcontext evaluation's figure: score by context length, the curve a RULER, MRCR or LongBench v2 study
is read from, each scheme against the baseline with its intervals (declared in
:attr:`LongContextEval.report <evalkit.evals.longcontext.evaluation.LongContextEval>`, ``plots``; drawn with the
report's scheme style, :mod:`evalkit.evals.figures`).

``longcontext_by_length_<model>``: per task (a leaf task or a group of them) two panels, one above the other:

* the score (``<task>/score``) at each context length, one series per quantized scheme, and the baseline's
  score on the same items (black, from the ``score_diff`` rows' ``baseline_score`` / ``baseline_ci``), every
  point with its 95 % interval;
* the paired change from the baseline in points (``<task>/score_diff``), with its paired 95 % interval
  (Tango's for 0/1 scores, Student's t otherwise): narrower than the two scores' intervals side by side,
  since the items are the same; the zero line is the baseline.

Lengths are categorical, in :func:`evalkit.evals.longcontext.items.length_order` (token counts rising, then
LongBench v2's short / medium / long); the pooled ``all`` length is the table's and is not drawn. A task
wraps at :data:`MAX_COLUMNS` columns. Cells whose protocol measures nothing under a scheme (value NaN,
``not_measured``) are left out. The identity scheme is the baseline and not drawn again.
"""

from __future__ import annotations

import pandas as pd

from evalkit.evals.figures import add_footnote, legend_outside, ordered, slug, wrap
from evalkit.kv.scheme import Scheme

PLOT = "evalkit.evals.longcontext.plots:longcontext_figures"  # how the evaluation declares it (ReportSpec.plots)
MAX_COLUMNS = 4
SPAN = 0.6  # of a length's width, shared by the series' points
BASELINE = dict(color="black", marker="s", linestyle="-", label="baseline (unquantized)")


def _offsets(n: int) -> list[float]:
    return [0.0] * n if n <= 1 else [-SPAN / 2 + SPAN * i / (n - 1) for i in range(n)]


def _errorbar(ax, x, y, lo, hi, scale: float = 1.0, **kw):
    y, lo, hi = (pd.Series(list(v), dtype=float) * scale for v in (y, lo, hi))
    err = [(y - lo).clip(lower=0).fillna(0).tolist(), (hi - y).clip(lower=0).fillna(0).tolist()]
    return ax.errorbar(list(x), y.tolist(), yerr=err, capsize=2.5, ms=4, lw=1.2, elinewidth=1.0, **kw)


def length_frame(results) -> pd.DataFrame:
    """The store's per-length score and score_diff rows (not ``all``), with ``task``, ``stat`` and ``length``
    columns (empty when it has none)."""
    df = results.rows
    if df.empty:
        return df
    df = df[df["labels"].map(lambda d: "length" in (d or {}) and (d or {}).get("length") != "all")].copy()
    df["stat"] = df["metric"].map(lambda m: str(m).rpartition("/")[2])
    df = df[df["stat"].isin(("score", "score_diff")) & df["value"].notna()].copy()
    df["task"] = df["labels"].map(lambda d: d["task"])
    df["length"] = df["labels"].map(lambda d: str(d["length"]))
    return df


def longcontext_figures(results, style) -> dict:
    """name -> figure: score and its paired change by context length, per model (module docstring)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from evalkit.evals.longcontext.items import length_order

    df = length_frame(results)
    if df.empty:
        return {}
    figures = {}
    for model, g in df.groupby("model", sort=False):
        tasks = list(dict.fromkeys(g["task"]))
        lengths = {t: sorted(set(g[g["task"] == t]["length"]), key=length_order) for t in tasks}
        figures[f"longcontext_by_length_{slug(model)}"] = _figure(g, model, tasks, lengths, style)
    return figures


def _figure(g: pd.DataFrame, model: str, tasks: list[str], lengths: dict, style):
    import matplotlib.pyplot as plt

    schemes = ordered(style, [s for s in g["scheme"].unique() if s != str(Scheme())])
    cols = min(MAX_COLUMNS, len(tasks))
    blocks = -(-len(tasks) // cols)
    fig, axes = plt.subplots(
        2 * blocks, cols, figsize=(3.8 * cols + 2.5, 5.2 * blocks + 1.4), squeeze=False, layout="constrained"
    )
    for i in range(blocks * cols):
        top, bottom = axes[2 * (i // cols)][i % cols], axes[2 * (i // cols) + 1][i % cols]
        if i >= len(tasks):
            top.set_visible(False)
            bottom.set_visible(False)
            continue
        task = tasks[i]
        t = g[g["task"] == task]
        pos = {length: k for k, length in enumerate(lengths[task])}
        offsets = _offsets(len(schemes) + 1)
        diffs = t[t["stat"] == "score_diff"].drop_duplicates("length")
        base = [(pos[r["length"]], *(_baseline(r["info"]))) for _, r in _by_length(diffs).iterrows()]
        if base:
            x, y, lo, hi = zip(*base)
            _errorbar(top, [v + offsets[0] for v in x], y, lo, hi, **BASELINE)
        bottom.axhline(0.0, color="black", lw=1.0)
        for off, scheme in zip(offsets[1:], schemes):
            kw = style.line(scheme, model).kw()
            for ax, stat, scale in ((top, "score", 1.0), (bottom, "score_diff", 100.0)):
                s = _by_length(t[(t["scheme"] == scheme) & (t["stat"] == stat)])
                if not s.empty:
                    x = [pos[v] + off for v in s["length"]]
                    _errorbar(ax, x, s["value"], s["ci_low"], s["ci_high"], scale, **kw)
        for ax, ylabel in ((top, "score"), (bottom, "Δ score vs baseline (pts)")):
            ax.set_xticks(range(len(pos)), list(pos), fontsize=8, rotation=30 if len(pos) > 4 else 0)
            ax.set_xlim(-0.6, len(pos) - 0.4)
            ax.set_xlabel("context length (tokens; LongBench v2: its length class)", fontsize=8)
            ax.set_ylabel(ylabel, fontsize=9)
            ax.grid(alpha=0.3, axis="y")
        top.set_title(wrap(task, 40), fontsize=9)
        top.set_ylim(-0.02, 1.02)
    handles, labels = axes[0][0].get_legend_handles_labels()
    legend_outside(fig, handles, labels, style.legend_title(schemes))
    fig.suptitle(f"{model}: long-context score by context length, each scheme against the baseline", fontsize=11)
    add_footnote(
        fig,
        style.notes(schemes, model)
        + [
            "bars: 95 % intervals; top: each scheme's score and the baseline's on the same items (Wilson for 0/1 "
            "scores, Student's t otherwise); bottom: the paired change (Tango's score interval for 0/1 scores, "
            "paired t otherwise), the zero line the baseline"
        ],
    )
    return fig


def _baseline(info) -> tuple:
    info = info or {}
    ci = info.get("baseline_ci") or [None, None]
    return info.get("baseline_score"), ci[0], ci[1]


def _by_length(df: pd.DataFrame) -> pd.DataFrame:
    from evalkit.evals.longcontext.items import length_order

    order = sorted(range(len(df)), key=lambda k: length_order(str(df["length"].iloc[k])))
    return df.iloc[order]
