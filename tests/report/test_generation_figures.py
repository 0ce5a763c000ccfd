"""``report --plots`` on a generation store: accuracy by prompt length and the failure gates' rates by length,
each scheme against the baseline with its intervals. The store is written from the generation evaluation's
own row functions on SYNTHETIC per-item generations (a tokenizer of one id per character); the tests read
back the data each figure draws (matplotlib Agg), not its pixels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evalkit.cli import main
from evalkit.evals.generation.gates import ANY, GATES
from evalkit.evals.generation.rows import task_rows
from evalkit.report import load_store

from tests.report.test_recommend import CODE, LAYOUT

QUANT = "fp8_e4m3/tensor/unit"
E5 = "fp8_e5m2/tensor/unit"
N_ITEMS = 12


class Tok:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def records(texts: list[list[str]], correct: list[list[float]], cut: list[list[bool]]) -> dict:
    """One task, one filter; item i's prompt is 10 + 25 i characters (buckets 0-31 to 256-511)."""
    return {
        "arith": [
            {
                "doc_id": i,
                "filter": "none",
                "doc_hash": str(i),
                "prompt": "Q" * (10 + 25 * i),
                "samples": [
                    {"seed": 5 + j, "text": t, "answer": t[-1:], "correct": c, "tokens": len(t), "truncated": k}
                    for j, (t, c, k) in enumerate(zip(texts[i], correct[i], cut[i]))
                ],
            }
            for i in range(len(texts))
        ]
    }


def generations():
    rng = np.random.default_rng(7)
    clean = [[f"the sum is {i + j}" for j in range(2)] for i in range(N_ITEMS)]
    right = (rng.random((N_ITEMS, 2)) < 0.7).astype(float)
    base = records(clean, right.tolist(), [[False, False]] * N_ITEMS)
    broken = [row[:] for row in clean]
    cut = [[False, False] for _ in range(N_ITEMS)]
    for i in (8, 10, 11):  # long prompts collapse: "!" until the budget
        broken[i][0], cut[i][0] = "!" * 40, True
    broken[9][1] = ""  # first-token EOS
    lost = right.copy()
    lost[[8, 9, 10, 11], :] = 0.0
    same = records(clean, right.tolist(), [[False, False]] * N_ITEMS)
    return base, {QUANT: records(broken, lost.tolist(), cut), E5: same, "auto": same}


def write_store(folder: Path) -> Path:
    from evalkit.sweep.store import ResultStore, RunOutcome

    base, runs = generations()
    store = ResultStore(folder)
    for i, (scheme, mine) in enumerate(runs.items()):
        rows = [r.to_dict() for r in task_rows(base, mine, Tok(), {})]
        info = {"kv_layout": LAYOUT, "dtype": "bfloat16", "versions": {"evalkit_code": CODE}}
        spec = {"model": {"name": "tiny"}, "scheme": scheme, "eval": "generation", "params": {"i": i}}
        store.append(RunOutcome(f"r{i}", spec, True, rows, info=info))
    return folder


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    from evalkit.report.plots import report_style
    from evalkit.report.tables import summary_frame

    folder = write_store(tmp_path_factory.mktemp("gen") / "store")
    results = load_store(folder)
    from evalkit.evals.generation.plots import generation_figures

    return results, generation_figures(results, report_style(results, summary_frame(results)))


def _bars(ax) -> dict[str, list[tuple[float, float, float]]]:
    """label -> [(y, low, high)] of every errorbar series of an axes, in drawing order."""
    out = {}
    for container in ax.containers:
        line, _, (bars,) = container.lines
        segments = bars.get_segments()
        out[container.get_label()] = [
            (float(y), float(s[0][1]), float(s[1][1])) for y, s in zip(line.get_ydata(), segments)
        ]
    return out


def flat(points) -> list[float]:
    return [float(x) for p in points for x in p]


def _rows(results, metric: str, scheme: str) -> list[tuple[float, float, float]]:
    df = results.rows
    sel = df[(df["metric"] == metric) & (df["scheme"] == scheme)].copy()
    sel["start"] = sel["labels"].map(lambda d: int(d["bucket"].split("-")[0]))
    return [(r.value, r.ci_low, r.ci_high) for r in sel.sort_values("start").itertuples()]


def test_accuracy_by_length_draws_each_scheme_and_the_baseline_with_intervals(drawn):
    results, figs = drawn
    fig = figs["generation_accuracy_by_length_tiny"]
    (ax,) = [a for a in fig.axes if a.containers]
    bars = _bars(ax)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0-31", "32-63", "64-127", "128-255", "256-511"]
    assert len(bars) == 3 and "baseline (unquantized)" in bars
    assert sorted(k.split(" ")[0] for k in bars if k != "baseline (unquantized)") == [QUANT, E5]
    quant = next(v for k, v in bars.items() if k.startswith(QUANT))
    assert flat(quant) == pytest.approx(flat(_rows(results, "arith/accuracy_by_length", QUANT)))
    base = bars["baseline (unquantized)"]
    df = results.rows
    rows = df[(df["metric"] == "arith/accuracy_by_length") & (df["scheme"] == QUANT)].copy()
    rows["start"] = rows["labels"].map(lambda d: int(d["bucket"].split("-")[0]))
    want = [(i["baseline_accuracy"], *i["baseline_ci"]) for i in rows.sort_values("start")["info"]]
    assert flat(base) == pytest.approx(flat(want))
    assert all(lo <= y <= hi and hi > lo for y, lo, hi in base + quant)  # every point has its interval
    assert not any(k.startswith("auto") or "baseline (bfloat16)" in k for k in bars)  # identity not drawn twice


def test_failure_gates_by_length_draw_every_gate_with_its_interval(drawn):
    results, figs = drawn
    fig = figs["generation_failures_by_length_tiny"]
    panels = [a for a in fig.axes if a.containers]
    assert [a.get_title().split(": ")[-1] for a in panels] == [ANY, *GATES]
    for ax, gate in zip(panels, (ANY, *GATES)):
        bars = _bars(ax)
        quant = next(v for k, v in bars.items() if k.startswith(QUANT))
        assert flat(quant) == pytest.approx(flat(_rows(results, f"arith/fail_{gate}_by_length", QUANT))), gate
        e5 = next(v for k, v in bars.items() if k.startswith(E5))
        assert all(y == 0 and lo == 0 and hi > 0 for y, lo, hi in e5)  # a clean scheme: 0 with its width
    collapse = next(v for k, v in _bars(panels[1 + GATES.index("collapse")]).items() if k.startswith(QUANT))
    assert [y for y, _, _ in collapse] == pytest.approx(
        [0, 0, 0, 0.1, 0.5]
    )  # item 8 of 5 in 128-255, 10 and 11 of 2 in 256-511


def test_report_plots_writes_the_generation_figures(tmp_path):
    folder = write_store(tmp_path / "store")
    out = tmp_path / "figs"
    assert main(["report", str(folder), "--plots", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    for stem in ("generation_accuracy_by_length_tiny", "generation_failures_by_length_tiny"):
        assert {f"{stem}.png", f"{stem}.svg"} <= names
