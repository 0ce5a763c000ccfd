"""Retrieval heatmaps: accuracy (or its difference from the baseline) by context length and depth.

:func:`heatmap_grid` draws one panel per key (a task, or a scheme in the report) on a grid that
wraps at :data:`MAX_COLUMNS` columns, so a figure stays the shape of a slide however many panels it
has: columns are context lengths, rows are needle depths, each cell annotated with its value (depth 0 %, the start
of the context, on top), one title over the figure and a line saying how many samples each cell averages. Accuracy uses a
sequential colour map on [0, 1] (viridis, readable in grey and by colour-blind readers); differences
a diverging one on [-1, 1] centred at 0, so a collapse is red at a glance. :func:`heatmap` is the
per-run artifact (one panel per task). Matplotlib's Agg backend (no display needed); figures are
closed after saving.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd

from evalkit.evals.figures import add_footnote, ordered, slug, wrap

MAX_COLUMNS = 4


PLOT = "evalkit.evals.retrieval.plots:retrieval_figures"  # how the evaluation declares this figure (ReportSpec.plots)


def samples_text(counts) -> str:
    """``each cell is 1 sample`` / ``each cell is the mean of 2-4 samples`` from the per-cell sample
    counts ('' without any): a reader must know a cell at 1.00 may be one lucky answer."""
    counts = sorted({int(c) for c in counts if pd.notna(c)})
    if not counts:
        return ""
    if counts == [1]:
        return "each cell is 1 sample"
    span = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"each cell is the mean of {span} samples"


def heatmap_grid(panels: dict[str, pd.DataFrame], title: str, diff: bool = False, subtitle: str = ""):
    """The figure (constrained layout) of ``panels``: panel title -> cells (columns length, depth, value)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    n = len(panels)
    ncols = max(1, min(n, MAX_COLUMNS))
    nrows = (n + ncols - 1) // ncols
    lengths = sorted({int(v) for cells in panels.values() for v in cells["length"]})
    depths = sorted({float(v) for cells in panels.values() for v in cells["depth"]})
    panel_w = max(2.4, 0.85 * len(lengths) + 1.2)
    panel_h = max(1.6, 0.3 * len(depths) + 1.0)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(panel_w * ncols + 1.3, panel_h * nrows + 0.9),
        squeeze=False,
        sharex=True,
        sharey=True,
        layout="constrained",
    )
    cmap, vmin, vmax = ("RdBu", -1.0, 1.0) if diff else ("viridis", 0.0, 1.0)
    image = None
    for k, (name, cells) in enumerate(panels.items()):
        ax = axes.flat[k]
        grid = cells.pivot_table(index="depth", columns="length", values="value", aggfunc="mean").reindex(
            index=depths, columns=lengths
        )
        image = ax.imshow(grid.to_numpy(dtype=float), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
        ax.set_xticks(range(len(lengths)), [f"{c // 1024}k" if c % 1024 == 0 else str(c) for c in lengths], fontsize=8)
        ax.set_yticks(range(len(depths)), [f"{d:g}%" for d in depths], fontsize=8)
        last_row = k + ncols >= n  # nothing drawn below this panel
        if last_row:
            ax.set_xlabel("context length (tokens)", fontsize=8)
            ax.xaxis.set_tick_params(labelbottom=True)
        if k % ncols == 0:
            ax.set_ylabel("needle depth", fontsize=8)
        ax.set_title(name, fontsize=8)
        for (i, j), v in pd.DataFrame(grid.to_numpy()).stack().items():
            ax.text(
                j,
                i,
                f"{v:+.2f}" if diff else f"{v:.2f}",
                ha="center",
                va="center",
                fontsize=7,
                color="black" if diff or v > 0.5 else "white",
            )
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    if image is not None:
        fig.colorbar(
            image,
            ax=axes,
            shrink=min(0.8, 0.35 + 0.15 * nrows),
            aspect=25,
            label="accuracy difference vs baseline" if diff else "accuracy",
        )
    heading = "\n".join(textwrap.wrap(title, 110))
    fig.suptitle(heading + (f"\n{subtitle}" if subtitle else ""), fontsize=10)
    return fig


def heatmap(cells: pd.DataFrame, path: Path, title: str, diff: bool = False) -> Path:
    """``cells``: columns task, length, depth, value (and optionally n, the samples per cell).
    One panel per task; writes ``path`` and returns it."""
    import matplotlib.pyplot as plt

    panels = {task: g for task, g in cells.groupby("task", sort=False)}
    subtitle = samples_text(cells["n"]) if "n" in cells else ""
    fig = heatmap_grid(panels, title, diff=diff, subtitle=subtitle)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def retrieval_figures(results, style) -> dict:
    """name -> figure: accuracy heatmaps (needle depth x context length), one figure per model and task,
    one panel per scheme on a grid of at most four columns, the title saying how many samples each cell
    holds, from the store's retrieval rows (``results.rows``); ``style``: the report's scheme style."""
    import math

    df = results.rows
    df = df[
        (df["metric"] == "accuracy")  # retrieval's rows
        & df["labels"].map(lambda d: {"task", "length", "depth"} <= set(d))
    ]
    if df.empty:
        return {}
    df = df.assign(
        task=df["labels"].map(lambda d: d["task"]),
        length=df["labels"].map(lambda d: int(d["length"])),
        depth=df["labels"].map(lambda d: float(d["depth"])),
        n=df["info"].map(lambda d: (d or {}).get("n", math.nan)),
    )
    figures = {}
    for (model, task), g in df.groupby(["model", "task"], sort=False):
        schemes = ordered(style, g["scheme"])
        panels = {wrap(style.label(s, model), 26): g[g["scheme"] == s] for s in schemes}
        fig = heatmap_grid(
            panels,
            f"{model}: {task} retrieval accuracy by needle depth and context length",
            subtitle=samples_text(g["n"]),
        )
        add_footnote(fig, style.notes(schemes, model))
        figures[f"retrieval_{slug(model)}_{slug(task)}"] = fig
    return figures
