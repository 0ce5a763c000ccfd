"""Plots of a results store, each saved as PNG and SVG.

* :func:`pareto` -- quality loss (|Δppl| %, or mean KL) against KV memory saved, one panel per
  model, each point with its 95 % interval (the table's); the schemes on the Pareto frontier (no other
  scheme saves more memory for less loss, on the point estimates) are joined by a line. Where the store has decode runs, a second figure (``pareto_decode``) puts the
  decode KL of the last position bucket against memory saved: the one measure of the engine dtypes
  whose one-chunk prefill reads raw K/V (vLLM's TurboQuant, UltraQuant), which sit at zero in the first.
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
import matplotlib.lines  # noqa: E402
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


def pareto(frame: pd.DataFrame, out_dir: str | Path, style: SchemeStyle | None = None) -> list[Path]:
    """``frame``: :func:`evalkit.report.tables.summary_frame` output; see :func:`pareto_figure` (and its
    decode-KL twin where the frame has one)."""
    paths = []
    for name, metric in (("pareto", None), ("pareto_decode", DECODE_KL)):
        fig = pareto_figure(frame, style, metric)
        paths += [] if fig is None else _save(fig, Path(out_dir), name)
    return paths


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
