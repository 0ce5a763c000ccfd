"""Plots of a results store, each saved as PNG and SVG.

* :func:`pareto` -- quality loss (|Δppl| %, or mean KL) against KV memory saved, one panel per
  model; the schemes on the Pareto frontier (no other scheme saves more memory for less loss) are
  joined by a line.
* :func:`positions` -- Δppl % and KL by token-position bucket (``labels.bucket``), one line per scheme:
  where in the context the damage happens.
* :func:`decode` -- the decode evaluation's KL(baseline || scheme) against the position of the
  generated token (position buckets, log y), one line per scheme: how the error grows over a generation.
* :func:`retrieval` -- accuracy heatmaps (context length x needle depth) per model, task and scheme.
* :func:`sensitivity` -- per-layer sensitivity: any metric with a ``labels.layer`` (e.g. the KL of
  quantizing one layer at a time), one line per scheme.

Each function returns the paths written ([] when the store has nothing to draw).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from evalkit.report.results import Results  # noqa: E402
from evalkit.kv.scheme import Scheme  # noqa: E402


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:80]


def _save(fig, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.svg"]
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    for p in paths:
        fig.savefig(p, dpi=150)
    plt.close(fig)
    return paths


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


def pareto(frame: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """``frame``: :func:`evalkit.report.tables.summary_frame` output; see :func:`pareto_figure`."""
    fig = pareto_figure(frame)
    return [] if fig is None else _save(fig, Path(out_dir), "pareto")


def pareto_figure(frame: pd.DataFrame):
    """The Pareto figure of a summary frame (None when it has nothing to draw).

    One panel per model: the quantized schemes (the baseline is the origin: nothing saved, nothing
    lost) coloured by format, the frontier joined by a line. Labels sit in a column right of the
    panel, each level with its point where there is room, joined to it by a thin line, so they
    never overlap; the x range is the schemes' own (they often differ by a fraction of a percent).
    Static schemes carry their short name (``.../static[1]``) and the scale files are named below."""
    from evalkit.report.tables import scheme_labels

    df = frame.copy()
    use_ppl = "ppl_delta_rel" in df and df["ppl_delta_rel"].notna().any()
    metric = "ppl_delta_rel" if use_ppl else "kl_mean"
    if metric not in df or "capacity_x" not in df:
        return None
    df["label"], notes = scheme_labels(df)
    df = df[df[metric].notna() & df["capacity_x"].notna() & (df["scheme"] != str(Scheme()))]
    if df.empty:
        return None
    df["saved"] = 100 * (1 - 1 / df["capacity_x"])
    df["loss"] = df[metric].abs() * (100 if use_ppl else 1)
    df["format"] = df["scheme"].str.split("/").str[0]
    models = list(dict.fromkeys(df["model"]))
    rows = max(df.groupby("model").size())
    height = max(4.8, 1.6 + 0.22 * rows)  # room for one label line per scheme
    fig, axes = plt.subplots(1, len(models), figsize=(9.5 * len(models), height), squeeze=False, layout="constrained")
    fig.get_layout_engine().set(h_pad=0.1, w_pad=0.1)  # inches around the panels: the title keeps a margin
    colors = dict(zip(dict.fromkeys(df["format"]), plt.rcParams["axes.prop_cycle"].by_key()["color"] * 3))
    for ax, model in zip(axes[0], models):
        g = df[df["model"] == model]
        for fmt, f in g.groupby("format", sort=False):
            ax.scatter(f["saved"], f["loss"], color=colors[fmt], zorder=3, s=28, label=fmt)
        front = frontier(g, "saved", "loss")
        ax.plot(front["saved"], front["loss"], color="0.25", lw=1.2, ls="--", zorder=2, label="Pareto frontier")
        lo, hi = g["saved"].min(), g["saved"].max()
        pad = max(0.5, 0.08 * (hi - lo))
        ax.set_xlim(lo - pad, hi + pad)
        if (g["loss"] > 0).all() and g["loss"].max() / g["loss"].min() > 30:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        else:
            ax.set_ylim(0, g["loss"].max() * 1.08)
        ax.set_xlabel("KV memory saved vs a bf16 cache (%)")
        ax.set_ylabel("|Δ perplexity| vs baseline (%)" if use_ppl else "mean KL to baseline (nats)")
        ax.set_title(f"{model}: quality loss vs KV memory saved", fontsize=11)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        _label_column(fig, ax, g)
    if notes:
        fig.get_layout_engine().set(rect=(0, 0.05, 1, 0.95))
        fig.text(0.01, 0.01, "   ".join(notes), fontsize=7, color="0.3")
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
        ax.annotate(label, xy=(px, py), xycoords="axes fraction", xytext=(1.04, y), textcoords="axes fraction",
                    fontsize=fontsize, va="center", ha="left", annotation_clip=False,
                    arrowprops=dict(arrowstyle="-", color="0.6", lw=0.6, shrinkA=0, shrinkB=3))


def _bucket_start(text: str) -> float:
    m = re.match(r"\s*(\d+)", str(text))
    return float(m.group(1)) if m else math.nan


def positions(results: Results, out_dir: str | Path) -> list[Path]:
    df = results.rows
    df = df[(df["eval"] == "perplexity") & df["labels"].map(lambda d: "bucket" in d) & df["metric"].isin(["ppl_delta_rel", "kl_mean"])]
    df = df[df["scheme"] != str(Scheme())]
    if df.empty:
        return []
    df = df.assign(bucket=df["labels"].map(lambda d: d["bucket"]))
    df = df.assign(start=df["bucket"].map(_bucket_start))
    paths = []
    for model, g in df.groupby("model", sort=False):
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        for ax, metric, scale, label in ((axes[0], "ppl_delta_rel", 100, "Δ perplexity (%)"), (axes[1], "kl_mean", 1, "mean KL (nats)")):
            for scheme, s in g[g["metric"] == metric].groupby("scheme", sort=False):
                s = s.sort_values("start")
                x = np.arange(len(s))
                ax.plot(x, s["value"] * scale, marker="o", label=scheme)
                if s["ci_low"].notna().all():
                    ax.fill_between(x, s["ci_low"] * scale, s["ci_high"] * scale, alpha=0.15)
                ax.set_xticks(x, s["bucket"], rotation=30, fontsize=8)
            ax.set_xlabel("token position in the window")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes[0].axhline(0, color="k", lw=0.8)
        axes[1].legend(fontsize=7)
        fig.suptitle(f"{model}: degradation by position")
        paths += _save(fig, Path(out_dir), f"positions_{_slug(model)}")
    return paths


def decode(results: Results, out_dir: str | Path) -> list[Path]:
    """Decode KL per position bucket, one line per quantized scheme (x: the bucket's middle position,
    y: mean KL on a log axis, band: the 95 % interval); one figure per model. Buckets whose KL is not
    above zero cannot sit on a log axis and are left out."""
    from evalkit.report.tables import scheme_labels

    df = results.rows
    df = df[(df["eval"] == "decode") & (df["metric"] == "kl_mean") & df["labels"].map(lambda d: "bucket" in (d or {}))]
    df = df[(df["scheme"] != str(Scheme())) & (df["value"] > 0)]
    if df.empty:
        return []
    bounds = df["labels"].map(lambda d: [float(v) for v in re.findall(r"\d+", d["bucket"])[:2]])
    df = df.assign(mid=bounds.map(lambda b: (b[0] + b[-1]) / 2))
    paths = []
    for model, g in df.groupby("model", sort=False):
        schemes = list(dict.fromkeys(g["scheme"]))
        labels = dict(zip(schemes, scheme_labels(pd.DataFrame({"scheme": schemes}))[0]))
        colors = plt.get_cmap("tab20" if len(schemes) > 10 else "tab10").colors
        fig, ax = plt.subplots(figsize=(10, 5), layout="constrained")
        for i, scheme in enumerate(schemes):
            s = g[g["scheme"] == scheme].sort_values("mid")
            style = ":" if "/static" in scheme else "--" if "/unit" in scheme else "-"
            color = colors[i % len(colors)]
            ax.plot(s["mid"], s["value"], marker="o", ms=3, ls=style, color=color, label=labels[scheme])
            band = s[s["ci_low"].notna() & (s["ci_low"] > 0)]
            if len(band) > 1:
                ax.fill_between(band["mid"], band["ci_low"], band["ci_high"], color=color, alpha=0.12, lw=0)
        ax.set_yscale("log")
        ax.set_xlabel("position of the generated token (middle of its bucket)")
        ax.set_ylabel("mean KL(baseline || scheme), nats")
        ax.set_title(f"{model}: decode-time KL by position (teacher-forced through the stored KV cache)", fontsize=11)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), title="scheme (-- unit, : static)",
                  title_fontsize=7)
        paths += _save(fig, Path(out_dir), f"decode_kl_{_slug(model)}")
    return paths


def retrieval(results: Results, out_dir: str | Path) -> list[Path]:
    df = results.rows
    df = df[(df["eval"] == "retrieval") & (df["metric"] == "accuracy")
            & df["labels"].map(lambda d: {"task", "length", "depth"} <= set(d))]
    if df.empty:
        return []
    df = df.assign(task=df["labels"].map(lambda d: d["task"]), length=df["labels"].map(lambda d: int(d["length"])),
                   depth=df["labels"].map(lambda d: float(d["depth"])))
    paths = []
    for (model, task), g in df.groupby(["model", "task"], sort=False):
        schemes = list(dict.fromkeys(g["scheme"]))
        fig, axes = plt.subplots(1, len(schemes), figsize=(3.0 * len(schemes) + 1.5, 3.6), squeeze=False, sharey=True,
                                 layout="constrained")
        for ax, scheme in zip(axes[0], schemes):
            grid = g[g["scheme"] == scheme].pivot_table(index="depth", columns="length", values="value", aggfunc="mean")
            im = ax.imshow(grid.values, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="lower")
            ax.set_xticks(range(grid.shape[1]), [str(c) for c in grid.columns], fontsize=7)
            ax.set_yticks(range(grid.shape[0]), [f"{d:g}" for d in grid.index], fontsize=7)
            for (i, j), v in np.ndenumerate(grid.values):
                if not np.isnan(v):
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6)
            ax.set_title(scheme, fontsize=8)
            ax.set_xlabel("context length")
            ax.label_outer()
        axes[0][0].set_ylabel("needle depth")
        fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="accuracy")
        fig.suptitle(f"{model}: {task}")
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        name = f"retrieval_{_slug(model)}_{_slug(task)}"
        for p in (out_dir / f"{name}.png", out_dir / f"{name}.svg"):
            fig.savefig(p, dpi=150)
            paths.append(p)
        plt.close(fig)
    return paths


def sensitivity(results: Results, out_dir: str | Path) -> list[Path]:
    df = results.rows[results.rows["labels"].map(lambda d: "layer" in d)]
    if df.empty:
        return []
    df = df.assign(layer=df["labels"].map(lambda d: int(d["layer"])))
    paths = []
    for (model, metric), g in df.groupby(["model", "metric"], sort=False):
        fig, ax = plt.subplots(figsize=(8, 4))
        for scheme, s in g.groupby("scheme", sort=False):
            s = s.sort_values("layer")
            ax.plot(s["layer"], s["value"], marker="o", ms=3, label=scheme)
        ax.set_xlabel("layer")
        ax.set_ylabel(metric)
        ax.set_title(f"{model}: per-layer sensitivity ({metric}, one layer quantized at a time)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        paths += _save(fig, Path(out_dir), f"sensitivity_{_slug(model)}_{_slug(metric)}")
    return paths


def all_plots(results: Results, frame: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    return (pareto(frame, out_dir) + positions(results, out_dir) + decode(results, out_dir) + retrieval(results, out_dir)
            + sensitivity(results, out_dir))
