"""The generation evaluation's figures, per model, from its by-length rows (declared in
:attr:`GenerationEval.report <evalkit.evals.generation.evaluation.GenerationEval>`, ``plots``; the report draws
them with its scheme style, :mod:`evalkit.evals.figures`):

* ``generation_accuracy_by_length_<model>``: accuracy per bucket of the item's prompt length
  (``accuracy_by_length``), one panel per task (and filter, and the traces file), each quantized scheme
  against the baseline (black; the baseline's accuracy and interval on the same item-samples, from the
  rows' info), every point with its 95 % interval;
* ``generation_failures_by_length_<model>``: the failure gates' rates per prompt-length bucket
  (``fail_<gate>_by_length``, :mod:`evalkit.evals.generation.gates`), a panel per task and gate (``any``
  first; a task's panels wrap at :data:`MAX_COLUMNS` columns), each scheme with its 95 % Wilson interval. A gate counts only what a scheme adds
  to the baseline, so the baseline's own rate of each shape is drawn as a grey dashed line for scale
  (a count over item-samples, no interval).

The x axis is categorical (the buckets 0-31, 32-63, 64-127, ... tokens present in the rows), the schemes
side by side within a bucket so that no two intervals overlap. A bucket is fixed before the scheme acts
(the prompt's length), the same items for every scheme. The identity scheme is the baseline and not
drawn again.
"""

from __future__ import annotations

import re

import pandas as pd

from evalkit.evals.figures import add_footnote, legend_outside, ordered, slug, wrap
from evalkit.kv.scheme import Scheme

PLOT = "evalkit.evals.generation.plots:generation_figures"  # how the evaluation declares this figure (ReportSpec.plots)
GATE_METRIC = re.compile(r"^(?P<task>[^/]+)/fail_(?P<gate>\w+?)_by_length$")
BASELINE = dict(color="black", marker="s", linestyle="-", label="baseline (unquantized)")
SPAN = 0.7  # of a bucket's width, shared by the schemes' points
MAX_COLUMNS = 4  # gate panels per row (a task's panels wrap), so the figure keeps a slide's shape


def _key(labels: dict) -> str:
    filt = labels.get("filter") or "none"
    return labels["task"] if filt == "none" else f"{labels['task']}[{filt}]"


def _start(bucket: str) -> int:
    return int(str(bucket).split("-", 1)[0])


def _offsets(n: int) -> list[float]:
    if n <= 1:
        return [0.0] * n
    return [-SPAN / 2 + SPAN * i / (n - 1) for i in range(n)]


def _errorbar(ax, x, y, lo, hi, **kw):
    y, lo, hi = (pd.Series(v, dtype=float).reset_index(drop=True) for v in (y, lo, hi))
    err = [(y - lo).clip(lower=0).fillna(0).tolist(), (hi - y).clip(lower=0).fillna(0).tolist()]
    return ax.errorbar(list(x), y.tolist(), yerr=err, capsize=2.5, ms=4, lw=1.2, elinewidth=1.0, **kw)


def by_length_frame(results) -> pd.DataFrame:
    """The store's by-length rows of the generation evaluation, with ``key`` (task[filter]), ``kind``
    (``accuracy`` or the gate), ``bucket`` and ``start`` columns (empty when it has none)."""
    df = results.rows
    if df.empty:
        return df
    bucketed = df[df["labels"].map(lambda d: "bucket" in (d or {}) and "task" in (d or {}))].copy()
    kinds = []
    for metric in bucketed["metric"]:
        base = str(metric).split("[", 1)[0]
        m = GATE_METRIC.match(base)
        kinds.append("accuracy" if base.endswith("/accuracy_by_length") else m.group("gate") if m else None)
    bucketed["kind"] = kinds
    bucketed = bucketed[bucketed["kind"].notna()]
    bucketed["key"] = bucketed["labels"].map(_key)
    bucketed["bucket"] = bucketed["labels"].map(lambda d: d["bucket"])
    bucketed["start"] = bucketed["bucket"].map(_start)
    return bucketed


def generation_figures(results, style) -> dict:
    """name -> figure: accuracy and the failure gates' rates by prompt length, per model (module docstring).
    ``style``: the report's :class:`~evalkit.report.style.SchemeStyle`."""
    import matplotlib

    matplotlib.use("Agg", force=False)

    df = by_length_frame(results)
    if df.empty:
        return {}
    figures = {}
    for model, g in df.groupby("model", sort=False):
        acc = g[g["kind"] == "accuracy"]
        if not acc.empty:
            figures[f"generation_accuracy_by_length_{slug(model)}"] = _accuracy_figure(acc, model, style)
        gates = g[g["kind"] != "accuracy"]
        if not gates.empty:
            figures[f"generation_failures_by_length_{slug(model)}"] = _gates_figure(gates, model, style)
    return figures


def _buckets(g: pd.DataFrame) -> list[str]:
    return list(g.drop_duplicates("bucket").sort_values("start")["bucket"])


def _accuracy_figure(df: pd.DataFrame, model: str, style):
    import matplotlib.pyplot as plt

    keys = list(dict.fromkeys(df["key"]))
    schemes = ordered(style, [s for s in df["scheme"].unique() if s != str(Scheme())])
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys) + 2.5, 4.6), squeeze=False, layout="constrained")
    for ax, key in zip(axes[0], keys):
        g = df[df["key"] == key]
        buckets = _buckets(g)
        pos = {b: i for i, b in enumerate(buckets)}
        offsets = _offsets(len(schemes) + 1)
        base = g.drop_duplicates("bucket").sort_values("start")
        ci = base["info"].map(lambda i: (i or {}).get("baseline_ci") or [None, None])
        _errorbar(
            ax,
            [pos[b] + offsets[0] for b in base["bucket"]],
            base["info"].map(lambda i: (i or {}).get("baseline_accuracy")),
            ci.map(lambda c: c[0]),
            ci.map(lambda c: c[1]),
            **BASELINE,
        )
        for off, scheme in zip(offsets[1:], schemes):
            s = g[g["scheme"] == scheme].sort_values("start")
            _errorbar(
                ax,
                [pos[b] + off for b in s["bucket"]],
                s["value"],
                s["ci_low"],
                s["ci_high"],
                **_kw(style, scheme, model),
            )
        _axes(ax, buckets, wrap(key, 40), "accuracy (share of item-samples right)")
        ax.set_ylim(-0.02, 1.02)
    handles, labels = axes[0][0].get_legend_handles_labels()
    legend_outside(fig, handles, labels, style.legend_title(schemes))
    fig.suptitle(f"{model}: generation accuracy by prompt length, each scheme against the baseline", fontsize=11)
    add_footnote(
        fig,
        style.notes(schemes, model)
        + [
            "bars: 95 % intervals (Wilson, the item as the unit); buckets by the item's prompt length in tokens, "
            "fixed before the scheme acts (the same items for every scheme)"
        ],
    )
    return fig


def _gates_figure(df: pd.DataFrame, model: str, style):
    import matplotlib.pyplot as plt

    from evalkit.evals.generation.gates import ANY, DEFINITIONS, GATES

    keys = list(dict.fromkeys(df["key"]))
    gates = [g for g in (ANY, *GATES) if g in set(df["kind"])]
    schemes = ordered(style, [s for s in df["scheme"].unique() if s != str(Scheme())])
    cols = min(MAX_COLUMNS, len(gates))
    per_task = -(-len(gates) // cols)  # rows of panels per task
    fig, axes = plt.subplots(
        len(keys) * per_task,
        cols,
        figsize=(3.4 * cols + 2.5, 2.9 * len(keys) * per_task + 1.6),
        squeeze=False,
        layout="constrained",
    )
    for r, key in enumerate(keys):
        top = max(0.05, float(df[df["key"] == key]["ci_high"].max()) * 1.08)
        buckets = _buckets(df[df["key"] == key])
        pos = {b: i for i, b in enumerate(buckets)}
        for c in range(per_task * cols):
            ax = axes[r * per_task + c // cols][c % cols]
            if c >= len(gates):
                ax.set_visible(False)
                continue
            gate = gates[c]
            g = df[(df["key"] == key) & (df["kind"] == gate)]
            own = g.groupby("bucket", sort=False)["info"].first()
            base_rate = [
                (pos[b], own[b]["baseline_count"] / own[b]["n_item_samples"]) for b in buckets if b in own.index
            ]
            if base_rate:
                ax.plot(
                    *zip(*base_rate),
                    color="0.55",
                    ls="--",
                    lw=1.0,
                    marker=".",
                    label="baseline's own rate of the shape",
                )
            for off, scheme in zip(_offsets(len(schemes)), schemes):
                s = g[g["scheme"] == scheme].sort_values("start")
                _errorbar(
                    ax,
                    [pos[b] + off for b in s["bucket"]],
                    s["value"],
                    s["ci_low"],
                    s["ci_high"],
                    **_kw(style, scheme, model),
                )
            _axes(ax, buckets, f"{wrap(key, 30)}: {gate}", "share of item-samples" if c % cols == 0 else "")
            ax.set_ylim(-0.01, top)
    handles, labels = axes[0][0].get_legend_handles_labels()
    legend_outside(fig, handles, labels, style.legend_title(schemes))
    fig.suptitle(
        f"{model}: failure gates by prompt length (where the scheme fails and the baseline did not)", fontsize=11
    )
    add_footnote(
        fig,
        style.notes(schemes, model)
        + [f"{g}: {DEFINITIONS[g]}" for g in gates]
        + [
            "bars: 95 % Wilson intervals, the item as the unit (0 fired still has its width); grey dashed: the "
            "baseline's own rate of the shape (no interval), which a gate does not count against the scheme"
        ],
        width=170,
    )
    return fig


def _kw(style, scheme: str, model: str) -> dict:
    return style.line(scheme, model).kw()


def _axes(ax, buckets: list[str], title: str, ylabel: str) -> None:
    ax.set_xticks(range(len(buckets)), buckets, fontsize=8, rotation=30 if len(buckets) > 4 else 0)
    ax.set_xlim(-0.6, len(buckets) - 0.4)
    ax.set_xlabel("prompt length (tokens)", fontsize=8)
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=9)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, axis="y")
