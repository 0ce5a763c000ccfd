"""Retrieval heatmaps: accuracy (or its difference from the baseline) by context length and depth.

One PNG per call, one panel per task: columns are context lengths, rows are needle depths, each
cell annotated with its value. Accuracy uses a sequential colour map on [0, 1]; differences a
diverging one on [-1, 1] centred at 0, so a collapse is red at a glance. Matplotlib's Agg backend
(no display needed); figures are closed after saving.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def heatmap(cells: pd.DataFrame, path: Path, title: str, diff: bool = False) -> Path:
    """``cells``: columns task, length, depth, value. Writes ``path`` and returns it."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(cells["task"]))
    n = len(tasks)
    ncols = min(n, 4)
    nrows = (n + ncols - 1) // ncols
    lengths = sorted(cells["length"].unique())
    panel_w = max(2.8, 0.9 * len(lengths) + 1.4)
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel_w * ncols + 1.2, 2.9 * nrows), squeeze=False,
                             constrained_layout=True)
    cmap, vmin, vmax = ("RdBu", -1.0, 1.0) if diff else ("viridis", 0.0, 1.0)
    image = None
    for ax, task in zip(axes.flat, tasks):
        grid = (cells[cells["task"] == task]
                .pivot_table(index="depth", columns="length", values="value", aggfunc="mean")
                .reindex(columns=lengths))
        image = ax.imshow(grid.to_numpy(dtype=float), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
        ax.set_xticks(range(len(grid.columns)), [f"{c // 1024}k" if c % 1024 == 0 else str(c) for c in grid.columns])
        ax.set_yticks(range(len(grid.index)), [f"{d:g}%" for d in grid.index])
        if ax in axes[-1] or n - list(axes.flat).index(ax) <= ncols:
            ax.set_xlabel("context length (tokens)")
        if ax in axes[:, 0]:
            ax.set_ylabel("needle depth")
        ax.set_title(task, fontsize=9)
        for (i, j), v in pd.DataFrame(grid.to_numpy()).stack().items():
            ax.text(j, i, f"{v:+.2f}" if diff else f"{v:.2f}", ha="center", va="center", fontsize=7,
                    color="black" if diff or v > 0.5 else "white")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="accuracy difference vs baseline" if diff else "accuracy")
    fig.suptitle(title, fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
