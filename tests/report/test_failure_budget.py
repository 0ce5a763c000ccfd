"""The budget's failure criterion (``--max-failure-rate``): the generation evaluation's ``fail_any`` rate per
task, judged on its 95 % interval as every criterion is (inside when the whole interval is at most the
limit, outside when wholly above, unresolved across it), and named in ``report``'s recommendation.

The stores here are SYNTHETIC FIXTURES: hand-chosen values written through the store's own writer."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalkit.cli import main
from evalkit.report import Budget, load_store, recommend, summary_frame
from evalkit.report.budget import verdicts

from tests.report.test_recommend import CODE, LAYOUT, UNIT, _row, ppl_rows

E5 = "fp8_e5m2/tensor/unit"


def gen_rows(rate: float, lo: float, hi: float, task: str = "arith") -> list[dict]:
    labels = {"task": task}
    return [
        _row(f"{task}/fail_any", rate, lo, hi, labels, {"n_fired": int(rate * 40), "ci": "95% Wilson"}),
        _row(f"{task}/fail_collapse", rate, lo, hi, labels),
        _row(f"{task}/fail_runaway", 0.0, 0.0, 0.09, labels),
    ]


def write(folder: Path, runs: list[tuple[str, str, list[dict]]]) -> Path:
    """``runs``: (scheme, evaluation, rows), one completed run each."""
    from evalkit.sweep.store import ResultStore, RunOutcome

    store = ResultStore(folder)
    for i, (scheme, ev, rows) in enumerate(runs):
        info = {"kv_layout": LAYOUT, "dtype": "bfloat16", "versions": {"evalkit_code": CODE}}
        spec = {"model": {"name": "tiny"}, "scheme": scheme, "eval": ev, "params": {"i": i}}
        store.append(RunOutcome(f"r{i}", spec, True, rows, info=info))
    return folder


@pytest.mark.parametrize(
    "lo, hi, state",
    [(0.0, 0.04, "inside"), (0.06, 0.2, "outside"), (0.0, 0.16, "unresolved"), (0.05, 0.05, "inside")],
)
def test_the_failure_rate_is_judged_on_its_interval(lo, hi, state):
    row = {"arith/gen_fail_any": (lo + hi) / 2, "arith/gen_fail_any_lo": lo, "arith/gen_fail_any_hi": hi}
    (v,) = [v for v in verdicts(row, Budget(max_failure_rate=0.05)) if v.name == "arith failures"]
    assert v.state == state
    assert not [v for v in verdicts(row, Budget()) if v.name == "arith failures"]  # off by default


def test_the_recommendation_names_the_failure_criterion(tmp_path, capsys):
    folder = write(
        tmp_path / "s",
        [
            ("auto", "perplexity", ppl_rows(0, 0, 0)),
            (UNIT, "perplexity", ppl_rows(0.002, 0.01)),
            (E5, "perplexity", ppl_rows(0.003, 0.012)),
            ("auto", "generation", gen_rows(0.0, 0.0, 0.02)),
            (UNIT, "generation", gen_rows(0.2, 0.12, 0.3)),  # collapses on a fifth of the item-samples
            (E5, "generation", gen_rows(0.0, 0.0, 0.02)),
        ],
    )
    frame = summary_frame(load_store(folder))
    plain = recommend(frame, Budget(), engine="vllm-cuda")["tiny"]
    assert "use kv_cache_dtype=fp8_e4m3" in plain  # no failure criterion: the cheaper-sorted e4m3 is inside
    gated = recommend(frame, Budget(max_failure_rate=0.05), engine="vllm-cuda")["tiny"]
    assert "fails arith failure rate ≤ 5%: 20.0 [12.0, 30.0]%, over by 15.0 pts" in gated
    # the fixed sequence (most bytes first, then by name) stops at e4m3's failure: e5m2 is not tested
    assert "keep kv_cache_dtype=auto" in gated and "the sequence stopped at fp8_e4m3/tensor/unit (outside)" in gated
    assert "generation failures <= 5%" in gated
    assert main(["report", str(folder), "--max-failure-rate", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "generation failures <= 5%" in out  # the budget line names the criterion
    assert "arith failures %" in out and "20.0 [12.0, 30.0] (collapse 20.0)" in out  # the table's column
