"""The Pareto figure draws each point's 95 % interval: the table's Δppl interval folded at 0 for |Δppl| (one
that crosses 0 starts at 0), the KL interval as it is. SYNTHETIC store (hand-chosen values through the
store's own writer); the test reads back the bars drawn."""

from __future__ import annotations

import pytest

from evalkit.report import load_store, summary_frame
from evalkit.report.pareto import loss_interval, pareto_figure

from tests.report.test_recommend import E5, UNIT, ppl_rows, write

DYN = "fp8_e4m3/tensor/dynamic"


def _drawn(fig) -> list[tuple[float, float, float]]:
    """(x, low, high) of every interval bar of the figure's first panel."""
    out = []
    for container in fig.axes[0].containers:
        (bars,) = container.lines[2]
        for seg in bars.get_segments():
            out.append((round(float(seg[0][0]), 9), round(float(seg[0][1]), 9), round(float(seg[1][1]), 9)))
    return sorted(out)


def test_each_point_carries_its_folded_interval(tmp_path):
    runs = {
        "auto": ppl_rows(0, 0, 0),
        UNIT: ppl_rows(0.009, 0.01, half=0.004),  # [+0.5, +1.3] %
        E5: ppl_rows(0.001, 0.02, half=0.002),  # [-0.1, +0.3] %: crosses 0, so |Δppl| in [0, 0.3]
        DYN + "+skip=0": ppl_rows(-0.006, 0.005, half=0.002),  # [-0.8, -0.4] %: |Δppl| in [0.4, 0.8]
    }
    frame = summary_frame(load_store(write(tmp_path / "s", runs)))
    fig = pareto_figure(frame)
    rows = frame[frame["scheme"] != "auto"]
    saved = {s: round(100 * (1 - 1 / c), 9) for s, c in zip(rows["scheme"], rows["capacity_x"])}
    want = sorted(
        [
            (saved[UNIT], 0.5, 1.3),
            (saved[E5], 0.0, 0.3),
            (saved[DYN + "+skip=0"], 0.4, 0.8),
        ]
    )
    assert [(x, pytest.approx(lo, abs=1e-9), pytest.approx(hi, abs=1e-9)) for x, lo, hi in want] == _drawn(fig)
    assert any("95 % interval" in t.get_text() for t in fig.texts)


def test_the_folded_interval_written_out():
    import pandas as pd

    df = pd.DataFrame({"m": [0.01, 0.001, -0.006, 0.02], "m_lo": [0.005, -0.001, -0.008, None]})
    df["m_hi"] = [0.013, 0.003, -0.004, None]
    lo, hi = loss_interval(df, "m", 100)
    assert lo.tolist()[:3] == pytest.approx([0.5, 0.0, 0.4]) and hi.tolist()[:3] == pytest.approx([1.3, 0.3, 0.8])
    assert pd.isna(lo.iloc[3]) and pd.isna(hi.iloc[3])  # no interval: no bar
