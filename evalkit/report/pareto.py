"""The Pareto figure of a report: quality loss against KV memory saved, one panel per model, and its
points as a table.

:func:`pareto_figure` draws |Δppl| % (or mean KL) of each quantized scheme against the KV memory it saves
against a bf16 cache, each point with its 95 % interval (the table's, :func:`loss_interval`: a Δppl
interval that crosses 0 folded at 0); the schemes on the Pareto :func:`frontier` (no other scheme saves
more memory for less loss, on the point estimates) are joined by a line, and the labels sit in a column
beside the panel, spread so that none overlap (:func:`spread_labels`). With ``metric`` set to the decode
evaluation's last-bucket KL it draws the ``pareto_decode`` twin: the one measure of the engine dtypes whose
one-chunk prefill reads raw K/V (vLLM's TurboQuant, UltraQuant), which sit at zero in the first.
:func:`pareto_data` is the same points as a table (``pareto.csv`` beside the figure). Saving, and the
store's other figures, are :mod:`evalkit.report.plots`.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.lines  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import pandas as pd  # noqa: E402

from evalkit.evals.decode.report import LAST as DECODE_KL  # noqa: E402  (the decode eval's last-bucket KL column)
from evalkit.evals.figures import add_footnote  # noqa: E402
from evalkit.kv.scheme import Scheme  # noqa: E402
from evalkit.report import marks  # noqa: E402
from evalkit.report.style import SchemeStyle  # noqa: E402


def frontier(points: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """Rows not dominated: no other row has x >= and y <= with one strict (maximize x, minimize y)."""
    keep = []
    for i, r in points.iterrows():
        dominated = ((points[x] >= r[x]) & (points[y] <= r[y]) & ((points[x] > r[x]) | (points[y] < r[y]))).any()
        if not dominated:
            keep.append(i)
    return points.loc[keep].sort_values(x)


def spread_labels(ys: list[float], gap: float, low: float = 0.0, high: float = 1.0) -> list[float]:
    """Label positions for points at heights ``ys`` (any order): each as close to its point as it can
    be, neighbours at least ``gap`` apart, all inside [low, high] (the gap shrinks if they cannot fit)."""
    order = sorted(range(len(ys)), key=lambda i: ys[i])
    if not order:
        return []
    gap = min(gap, (high - low) / max(len(ys) - 1, 1))
    pos = [min(max(ys[i], low), high) for i in order]
    for k in range(1, len(pos)):  # push up past the one below
        pos[k] = max(pos[k], pos[k - 1] + gap)
    pos[-1] = min(pos[-1], high)
    for k in range(len(pos) - 2, -1, -1):  # then down below the one above, where the top overflowed
        pos[k] = min(pos[k], pos[k + 1] - gap)
    out = [0.0] * len(ys)
    for k, i in enumerate(order):
        out[i] = pos[k]
    return out


PARETO_Y = {
    "ppl_delta_rel": ("|Δ perplexity| vs baseline (%)", "quality loss"),
    "kl_mean": ("mean KL to baseline (nats)", "quality loss"),
    DECODE_KL: ("decode KL to baseline (nats/token),\nlast position bucket", "decode KL"),
}


PARETO_BARS = {
    True: "bars: each point's 95 % interval, as the table's (|Δppl|: the Δppl interval folded at 0, so one that "
    "crosses 0 starts at 0)",
    False: "bars: each point's 95 % interval, as the table's",
}


def loss_interval(df: pd.DataFrame, metric: str, scale: float) -> tuple[pd.Series, pd.Series]:
    """The interval of each row's plotted loss, ``|metric| * scale``: the column's ``_lo`` / ``_hi`` folded
    at 0 (an interval that crosses 0 gives [0, the larger end]; one wholly below 0 is mirrored); NaN where
    the frame has no interval."""
    lo, hi = (df.get(f"{metric}_{end}", pd.Series(float("nan"), index=df.index)).astype(float) for end in ("lo", "hi"))
    a, b = lo.abs() * scale, hi.abs() * scale
    crosses = (lo <= 0) & (hi >= 0)
    low = a.where(a < b, b).where(~crosses, 0.0)
    high = a.where(a > b, b)
    return low.where(lo.notna() & hi.notna()), high.where(lo.notna() & hi.notna())


def pareto_figure(frame: pd.DataFrame, style: SchemeStyle | None = None, metric: str | None = None):
    """The Pareto figure of a summary frame (None when it has nothing to draw).

    One panel per model: the quantized schemes (the baseline is the origin: nothing saved, nothing
    lost), each in its own shade of its format's hue and with its granularity's marker
    (:mod:`evalkit.report.style`), the frontier joined by a line. Labels sit in a column right of
    the panel, each level with its point where there is room, joined to it by a thin line, so they
    never overlap; the x range is the schemes' own (they often differ by a fraction of a percent).
    The legend (formats, frontier) sits under the panels, off the data. Static schemes carry their
    short name (``.../static[1]``) and the scale files are named below; every label carries its table
    row's marks (``†``, ``≈n``), explained below too."""
    style = style if style is not None else marks.styled(SchemeStyle.of_frame(frame), frame)
    df = frame.copy()
    if metric is None:  # |Δppl| where measured, else mean KL
        metric = "ppl_delta_rel" if "ppl_delta_rel" in df and df["ppl_delta_rel"].notna().any() else "kl_mean"
    use_ppl = metric == "ppl_delta_rel"
    if metric not in df or "capacity_x" not in df:
        return None
    df["label"] = [style.label(s, m) for s, m in zip(df["scheme"], df["model"])]
    df = df[df[metric].notna() & df["capacity_x"].notna() & (df["scheme"] != str(Scheme()))]
    if df.empty:
        return None
    notes = style.notes(df["scheme"])
    df["saved"] = 100 * (1 - 1 / df["capacity_x"])
    df["loss"] = df[metric].abs() * (100 if use_ppl else 1)
    df["loss_lo"], df["loss_hi"] = loss_interval(df, metric, 100 if use_ppl else 1)
    df["family"] = [style.scheme(s).format for s in df["scheme"]]
    models = list(dict.fromkeys(df["model"]))
    rows = max(df.groupby("model").size())
    height = max(4.8, 1.6 + 0.22 * rows)  # room for one label line per scheme
    fig, axes = plt.subplots(1, len(models), figsize=(9.5 * len(models), height), squeeze=False, layout="constrained")
    fig.get_layout_engine().set(h_pad=0.1, w_pad=0.1)  # inches around the panels: the title keeps a margin
    for ax, model in zip(axes[0], models):
        g = df[df["model"] == model]
        for _, r in g.iterrows():
            line = style.line(r["scheme"])
            ax.scatter(
                r["saved"],
                r["loss"],
                color=line.color,
                marker=line.marker,
                zorder=3,
                s=30,
                edgecolors="0.2",
                linewidths=0.4,
            )
        for _, r in g[g["loss_lo"].notna() & g["loss_hi"].notna()].iterrows():  # each point's 95 % interval
            ax.errorbar(
                r["saved"],
                r["loss"],
                yerr=[[max(r["loss"] - r["loss_lo"], 0.0)], [max(r["loss_hi"] - r["loss"], 0.0)]],
                fmt="none",
                ecolor=style.line(r["scheme"]).color,
                elinewidth=0.9,
                capsize=2.5,
                alpha=0.8,
                zorder=2.5,
                label="_interval",
            )
        front = frontier(g, "saved", "loss")
        ax.plot(front["saved"], front["loss"], color="0.25", lw=1.2, ls="--", zorder=2)
        lo, hi = g["saved"].min(), g["saved"].max()
        pad = max(0.5, 0.08 * (hi - lo))
        ax.set_xlim(lo - pad, hi + pad)
        if (g["loss"] > 0).all() and g["loss"].max() / g["loss"].min() > 30:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        else:
            ax.set_ylim(
                0, max(g["loss"].max(), g["loss_hi"].max(skipna=True) if g["loss_hi"].notna().any() else 0) * 1.08
            )
        ax.set_xlabel("KV memory saved vs a bf16 cache (%)")
        ylabel, what = PARETO_Y[metric]
        ax.set_ylabel(ylabel)
        ax.set_title(f"{model}: {what} vs KV memory saved", fontsize=11)
        ax.grid(alpha=0.3)
    families = list(dict.fromkeys(f for f in style.families if f in set(df["family"])))
    handles = [matplotlib.lines.Line2D([], [], ls="", marker="o", color=style.family_color(f)) for f in families]
    handles.append(matplotlib.lines.Line2D([], [], color="0.25", lw=1.2, ls="--"))
    title = "colour: element format (one shade per scheme); " + style.legend_title(df["scheme"], lines=False)
    legend = (
        handles,
        [*(style.family_label(f) for f in families), "Pareto frontier"],
        dict(fontsize=8, title_fontsize=7, title=title),
    )
    if df["loss_hi"].notna().any():
        notes = [*notes, PARETO_BARS[use_ppl]]
    add_footnote(fig, notes, legend=legend)
    for ax, model in zip(axes[0], models):
        _label_column(fig, ax, df[df["model"] == model])
    return fig


def _label_column(fig, ax, g: pd.DataFrame, fontsize: float = 7.5) -> None:
    """Each point's label in a column just right of the axes, spread so that no two overlap."""
    fig.canvas.draw()  # fixes the axes' size and limits
    to_axes = ax.transAxes.inverted()
    points = [to_axes.transform(ax.transData.transform((x, y))) for x, y in zip(g["saved"], g["loss"])]
    height_px = ax.get_window_extent().height
    gap = 1.25 * fontsize * fig.dpi / 72 / height_px
    ys = spread_labels([float(p[1]) for p in points], gap, 0.0, 1.0)
    for (px, py), y, label in zip(points, ys, g["label"]):
        ax.annotate(
            label,
            xy=(px, py),
            xycoords="axes fraction",
            xytext=(1.04, y),
            textcoords="axes fraction",
            fontsize=fontsize,
            va="center",
            ha="left",
            annotation_clip=False,
            arrowprops=dict(arrowstyle="-", color="0.6", lw=0.6, shrinkA=0, shrinkB=3),
        )


PARETO_COLUMNS = (
    "model",
    "scheme",
    "bytes_per_token",
    "capacity_x",
    "ppl_delta_rel",
    "ppl_delta_rel_lo",
    "ppl_delta_rel_hi",
    "kl_mean",
    "kl_p50",
    "kl_p99",
    "kl_p999",
    "kl_max",
    "top1_agreement",
)


def pareto_data(frame: pd.DataFrame) -> pd.DataFrame:
    """The Pareto plot's points as a table (``pareto.csv`` beside the figure): per quantized scheme the
    memory saved against a bf16 cache (%), its quality numbers, and the per-token KL percentiles
    where the store has them, so a reader can look up what a point stands for."""
    df = frame[frame["scheme"] != str(Scheme())]
    out = df[[c for c in PARETO_COLUMNS if c in df]].copy()
    if "capacity_x" in out:
        out.insert(out.columns.get_loc("capacity_x") + 1, "memory_saved_pct", 100 * (1 - 1 / out["capacity_x"]))
    return out.reset_index(drop=True)
