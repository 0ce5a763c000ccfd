"""``report --plots`` on a longcontext store: score by context length (and its paired change), each scheme
against the baseline with its intervals. The store is written from the longcontext evaluation's own row
function (``paired_rows``) on SYNTHETIC per-item scores; the tests read back the data the figure draws."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evalkit.cli import main
from evalkit.evals.longcontext.evaluation import paired_rows
from evalkit.report import load_store

from tests.report.test_recommend import CODE, LAYOUT

QUANT = "fp8_e4m3/tensor/unit"
LENGTHS = {"niah_single": ["4096", "8192", "16384"], "longbench_v2": ["short", "long"]}
ITEMS = 20


def items(drop_long: bool) -> list[dict]:
    rng = np.random.default_rng(11)
    out = []
    for task, lengths in LENGTHS.items():
        for k, length in enumerate(lengths):
            right = rng.random(ITEMS) < 0.9 - 0.1 * k
            for i in range(ITEMS):
                lost = drop_long and k == len(lengths) - 1 and i % 3 == 0  # the longest length loses a third
                out.append(
                    {
                        "task": task,
                        "doc_id": 100 * k + i,
                        "filter": "none",
                        "doc_hash": f"{task}{k}{i}",
                        "length": length,
                        "score": 0.0 if lost else float(right[i]),
                    }
                )
    return out


def write_store(folder: Path) -> Path:
    from evalkit.sweep.store import ResultStore, RunOutcome

    base = items(False)
    store = ResultStore(folder)
    for i, scheme in enumerate(("auto", QUANT)):
        mine = items(scheme == QUANT)
        rows = paired_rows(list(zip(base, mine)), {}, {}, {"configs": {}})
        info = {"kv_layout": LAYOUT, "dtype": "bfloat16", "versions": {"evalkit_code": CODE}}
        spec = {"model": {"name": "tiny"}, "scheme": scheme, "eval": "longcontext", "params": {"i": i}}
        store.append(RunOutcome(f"r{i}", spec, True, [r.to_dict() for r in rows], info=info))
    return folder


def _bars(ax) -> dict[str, list[float]]:
    out = {}
    for container in ax.containers:
        line, _, (bars,) = container.lines
        segs = bars.get_segments()
        out[container.get_label()] = [float(v) for y, s in zip(line.get_ydata(), segs) for v in (y, s[0][1], s[1][1])]
    return out


def _want(results, task: str, stat: str, scale: float = 1.0) -> list[float]:
    df = results.rows
    sel = df[(df["metric"] == f"{task}/{stat}") & (df["scheme"] == QUANT)]
    by = {r.labels["length"]: r for r in sel.itertuples()}
    return [
        scale * float(v) for length in LENGTHS[task] for v in (by[length].value, by[length].ci_low, by[length].ci_high)
    ]


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    from evalkit.evals.longcontext.plots import longcontext_figures
    from evalkit.report.plots import report_style
    from evalkit.report.tables import summary_frame

    results = load_store(write_store(tmp_path_factory.mktemp("lc") / "store"))
    return results, longcontext_figures(results, report_style(results, summary_frame(results)))


def test_score_by_length_against_the_baseline_with_intervals(drawn):
    results, figs = drawn
    fig = figs["longcontext_by_length_tiny"]
    panels = [a for a in fig.axes if a.get_visible() and a.containers]
    assert sorted(a.get_title() for a in panels if a.get_title()) == sorted(LENGTHS)
    for task in LENGTHS:
        top = next(a for a in panels if a.get_title() == task)
        spec = top.get_subplotspec()
        bottom = next(  # the panel below it: the paired change
            a
            for a in panels
            if a.get_subplotspec().rowspan.start == spec.rowspan.start + 1
            and a.get_subplotspec().colspan.start == spec.colspan.start
        )
        assert [t.get_text() for t in top.get_xticklabels()] == LENGTHS[task]  # token counts rising, not as text
        bars = _bars(top)
        quant = next(v for key, v in bars.items() if key.startswith(QUANT))
        assert quant == pytest.approx(_want(results, task, "score"))
        df = results.rows
        diffs = df[(df["metric"] == f"{task}/score_diff") & (df["scheme"] == QUANT)]
        by = {r.labels["length"]: r.info for r in diffs.itertuples()}
        base = [
            float(v) for length in LENGTHS[task] for v in (by[length]["baseline_score"], *by[length]["baseline_ci"])
        ]
        assert bars["baseline (unquantized)"] == pytest.approx(base)
        change = next(v for key, v in _bars(bottom).items() if key.startswith(QUANT))
        assert change == pytest.approx(_want(results, task, "score_diff", 100.0))  # in points
        assert change[-3] < 0 and change[-1] < 0  # the longest length's loss is resolved below 0
        assert not any(key.startswith("auto") for key in bars)  # the identity scheme is the baseline


def test_report_plots_writes_the_longcontext_figure(tmp_path):
    folder = write_store(tmp_path / "store")
    out = tmp_path / "figs"
    assert main(["report", str(folder), "--plots", str(out)]) == 0
    assert {"longcontext_by_length_tiny.png", "longcontext_by_length_tiny.svg"} <= {p.name for p in out.iterdir()}
