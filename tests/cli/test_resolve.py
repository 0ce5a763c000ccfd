"""``sweep --resolve`` (evalkit.cli.resolve, resolve_straddles, resolve_price): the straddling criteria
found as the recommendation finds them, the stage planning on a small SYNTHETIC store, the report
reading a grown row's latest stage at the split level (against a plain computation), an end-to-end
resolve of a tiny grid (it grows the straddling criterion, stops resolved or with the budget named, and
resumes), and bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy import stats

from evalkit.cli import main
from evalkit.cli import resolve as R
from evalkit.cli import resolve_price as P
from evalkit.cli import resolve_straddles as S
from evalkit.errors import EvalkitError
from evalkit.planning.sequential import JACKKNIFE, look_level
from evalkit.report import resolved as ledgers
from evalkit.report.budget import Budget, _state_of_interval, verdicts
from evalkit.report.results import load_store
from evalkit.report.tables import summary_frame
from evalkit.sweep.grid import parse_grid
from evalkit.sweep.store import ResultStore, RunOutcome

from tests.report.synthetic import LAYOUT

ONLY_PPL = Budget(max_kl=None, max_dp_drop=None, max_retrieval_drop=None, max_flip_rate=None)
# scheme -> (Δppl, its 95 % interval, KL, its interval): A straddles |Δppl| <= 1 %, B is outside, C's KL straddles
SYNTH = {
    "auto": (0.0, (0.0, 0.0), 0.0, (0.0, 0.0)),
    "fp8_e4m3/tensor/unit": (0.009, (-0.001, 0.019), 0.005, (0.004, 0.006)),
    "fp8_e5m2/tensor/unit": (0.05, (0.04, 0.06), 0.03, (0.025, 0.035)),
    "int4/token/dynamic": (0.002, (0.001, 0.003), 0.019, (0.015, 0.023)),
}


def _grid(tmp_path: Path, model_dir, max_windows=4, schemes=tuple(SYNTH)):
    path = tmp_path / "g.yaml"
    path.write_text(
        f"name: resolvegrid\nmodels: ['{model_dir}']\nschemes: [{', '.join(schemes)}]\n"
        f"evals: {{perplexity: {{max_windows: {max_windows}, window: 32, stride: 32}}}}\n"
    )
    return parse_grid(path)


def _metric(metric, value, ci, n):
    info = {"ci": f"95% {JACKKNIFE} over windows", "n_windows": n}
    return {"metric": metric, "value": value, "ci_low": ci[0], "ci_high": ci[1], "labels": {}, "info": info}


def _synthetic_store(folder: Path, grid) -> ResultStore:
    """SYNTHETIC: the grid's runs with hand-made perplexity rows (their run ids and specs are the grid's)."""
    store = ResultStore(folder)
    store.claim(grid)
    for run in grid.runs:
        d, dci, kl, kci = SYNTH[run.scheme]
        rows = [_metric("ppl_delta_rel", d, dci, 4), _metric("kl_mean", kl, kci, 4)]
        info = {"kv_layout": LAYOUT, "dtype": "float32"}
        store.append(RunOutcome(run.run_id, run.to_dict(), True, rows, seconds=10.0, info=info))
    return store


def _frame(folder):
    results = load_store(folder)
    frame = summary_frame(results)
    frame.attrs["layouts"] = results.layouts
    return frame, results


def test_stage_planning_on_a_synthetic_store(tmp_path, tiny_llama_dir):
    grid = _grid(tmp_path, tiny_llama_dir)
    _synthetic_store(tmp_path / "s", grid)
    frame, results = _frame(tmp_path / "s")
    found = S.straddling(frame, Budget(max_dp_drop=None, max_retrieval_drop=None, max_flip_rate=None), engine=None)
    assert [(s.scheme, s.eval, s.criterion) for s in found] == [
        ("fp8_e4m3/tensor/unit", "perplexity", "Δppl"),
        ("int4/token/dynamic", "perplexity", "KL"),
    ]  # B is outside on Δppl: nothing of it is grown
    rows, why = S.rows_to_grow(grid, S.new_ledger(3), found, results.complete)
    assert not why and [r.entry["scheme"] for r in rows] == ["fp8_e4m3/tensor/unit", "int4/token/dynamic"]
    row = rows[0]
    assert row.knob == "max_windows" and [row.stage_n(k) for k in range(4)] == [4, 8, 16, 32]
    stage2 = S.grown(row.base, row.stage_n(2))
    assert stage2.params == {**row.base.params, "max_windows": 16} and stage2.run_id != row.base.run_id
    assert S.grown(row.base, 4).run_id == row.base.run_id  # stage 0 is the store's own run
    # priced from the store's measured times: 2 x the stage-0 run, plus the baseline (auto's 10 s) at 8 / 4
    assert P.measured_price(grid, row, 1, results.complete) == pytest.approx(2 * 10.0 + 10.0 * 8 / 4)


def test_the_report_reads_the_latest_stage_at_the_split_level(tmp_path, tiny_llama_dir):
    grid = _grid(tmp_path, tiny_llama_dir)
    store = _synthetic_store(tmp_path / "s", grid)
    frame, results = _frame(tmp_path / "s")
    found = S.straddling(frame, ONLY_PPL, engine=None)
    (row,), _ = S.rows_to_grow(grid, S.new_ledger(3), found, results.complete)
    run = S.grown(row.base, 8)
    value, lo, hi = 0.004, 0.001, 0.007  # stage 1's stored 95 % interval over 8 windows
    rows = [_metric("ppl_delta_rel", value, (lo, hi), 8), _metric("kl_mean", 0.005, (0.0045, 0.0055), 8)]
    store.append(RunOutcome(run.run_id, run.to_dict(), True, rows, info={"kv_layout": LAYOUT}))
    ledger = S.new_ledger(3)
    S.record(ledger, row, 1, run)
    ledgers.write_ledger(tmp_path / "s", ledger)

    frame, results = _frame(tmp_path / "s")
    mine = frame[frame["scheme"] == "fp8_e4m3/tensor/unit"]
    assert len(mine) == 1 and row.base.run_id not in results.complete  # stage 0 left out
    q = look_level(3)
    half = (hi - lo) / 2 * stats.t.ppf(1 - (1 - q) / 2, 7) / stats.t.ppf(0.975, 7)  # by hand
    got = mine.iloc[0]
    assert (got["ppl_delta_rel_lo"], got["ppl_delta_rel_hi"]) == pytest.approx((value - half, value + half))
    assert q == pytest.approx(0.9875) and half > (hi - lo) / 2
    assert any("stage 1 of 3 (max_windows 8)" in n and "98.75 %" in n for n in results.merge_notes)
    # resolved now (inside at 98.75 %): only C's KL still straddles
    assert [(s.scheme, s.criterion) for s in S.straddling(frame, Budget(max_dp_drop=None), engine=None)] == [
        ("int4/token/dynamic", "KL")
    ]


def test_a_stage_row_whose_interval_cannot_be_rederived_loses_it(tmp_path, tiny_llama_dir):
    grid = _grid(tmp_path, tiny_llama_dir)
    store = _synthetic_store(tmp_path / "s", grid)
    frame, results = _frame(tmp_path / "s")
    (row,), _ = S.rows_to_grow(grid, S.new_ledger(3), S.straddling(frame, ONLY_PPL, engine=None), results.complete)
    run = S.grown(row.base, 8)
    bad = {**_metric("ppl_delta_rel", 0.004, (0.001, 0.007), 8), "info": {"ci": "95% percentile bootstrap"}}
    store.append(RunOutcome(run.run_id, run.to_dict(), True, [bad], info={"kv_layout": LAYOUT}))
    ledger = S.new_ledger(3)
    S.record(ledger, row, 1, run)
    ledgers.write_ledger(tmp_path / "s", ledger)
    frame, results = _frame(tmp_path / "s")
    got = frame[frame["scheme"] == "fp8_e4m3/tensor/unit"].iloc[0].to_dict()
    v = next(v for v in verdicts(got, ONLY_PPL) if v.name == "Δppl")
    assert v.state == "unresolved" and "no interval" in v.text  # never judged on the 95 % interval
    assert any("not re-derivable, dropped: ppl_delta_rel" in n for n in results.merge_notes)


def _straddling_limit(lo: float, hi: float) -> float:
    """A |Δppl| limit the interval [lo, hi] straddles."""
    from evalkit.report import evals as report_evals

    c = next(c for c in report_evals.criteria() if c.column == "ppl_delta_rel")
    top = max(abs(lo), abs(hi))
    for i in range(1, 200):
        limit = top * i / 200
        if _state_of_interval(c, lo, hi, limit) == "unresolved":
            return limit
    raise AssertionError(f"no limit straddled by [{lo}, {hi}]")


@pytest.mark.slow
def test_resolve_grows_a_straddling_criterion_of_a_tiny_grid_end_to_end(tmp_path, tiny_llama_dir, capsys):
    from evalkit.sweep.executors import make_executor

    out, cache = tmp_path / "out", tmp_path / "cache"
    grid = _grid(tmp_path, tiny_llama_dir, max_windows=2, schemes=("auto", "int4/token/dynamic"))
    argv = ["sweep", str(grid.path), "--out", str(out), "--no-progress", "--cache-dir", str(cache)]
    assert main(argv) == 0
    frame, _ = _frame(out)
    r = frame[frame["scheme"] == "int4/token/dynamic"].iloc[0]
    budget = Budget(
        **{
            **{k: None for k in vars(ONLY_PPL)},
            "max_ppl_rel": _straddling_limit(r.ppl_delta_rel_lo, r.ppl_delta_rel_hi),
        }
    )
    store = ResultStore(out)

    def resolve(budget_s):
        return R.run_resolve(
            grid,
            store,
            make_executor("local", None),
            cache,
            budget_s=budget_s,
            stages=2,
            budget=budget,
            engine=None,
            price=lambda runs: {x.run_id: 1.0 for x in runs},
        )

    outcome = resolve(600)
    ledger = ledgers.read_ledger(out)
    (entry,) = ledger["entries"]
    assert entry["knob"] == "max_windows" and entry["criteria"] == ["Δppl"]
    assert [s["n"] for s in entry["stages"]][:2] == [2, 4] and outcome.added  # it grew
    complete = ResultStore(out).read().complete
    stage1 = complete[entry["stages"][1]["run_id"]]
    assert stage1["spec"]["params"]["max_windows"] == 4
    assert outcome.why in ("every criterion resolved", "the stages planned are all run")
    (state,) = outcome.states
    last = entry["stages"][-1]
    assert f"at max_windows {last['n']} (stage {last['stage']} of 2)" in state
    assert state.split(": ")[1].split(" at ")[0] in ("resolved inside", "resolved outside", "unresolved")
    # resumed: nothing left to run, the same final state
    again = resolve(600)
    assert again.states == outcome.states and all("priced" not in a or a for a in again.added)
    assert len(ResultStore(out).read().complete) == len(complete)
    # and the report says which stage it reads
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    assert f"is its stage {last['stage']} of 2 (max_windows {last['n']})" in capsys.readouterr().out


def test_resolve_stops_with_the_budget_named(tmp_path, tiny_llama_dir):
    from evalkit.sweep.executors import make_executor

    grid = _grid(tmp_path, tiny_llama_dir)
    store = _synthetic_store(tmp_path / "s", grid)
    outcome = R.run_resolve(
        grid,
        store,
        make_executor("local", None),
        tmp_path / "cache",
        budget_s=5.0,
        stages=3,
        budget=ONLY_PPL,
        engine=None,
        price=lambda runs: {x.run_id: 1.0 for x in runs},
    )
    assert outcome.why.startswith(
        "the budget is spent: no next stage fits (fp8_e4m3/tensor/unit perplexity max_windows 8 priced 40 s"
    )  # measured: 2 x 10 s + the baseline 10 s x 8 / 4
    assert not outcome.added
    (state,) = outcome.states  # the criterion never grown, at the units it has
    assert state.startswith("fp8_e4m3/tensor/unit Δppl: unresolved at max_windows 4 (stage 0 of 3, not grown): ")
    assert not (tmp_path / "s" / ledgers.LEDGER).exists()  # nothing planned was started


@pytest.mark.parametrize("text,seconds", [("30m", 1800), ("1.5h", 5400), ("90s", 90), ("45", 2700)])
def test_parse_budget(text, seconds):
    assert R.parse_budget(text) == seconds


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--resolve", "--resolve-budget", "nonsense"], "--resolve-budget 'nonsense' is not a time"),
        (["--resolve", "--resolve-budget", "0m"], "--resolve-budget '0m' is not a time"),
        (["--resolve-budget", "30m"], "--resolve-budget only sets --resolve"),
        (["--resolve", "--resolve-stages", "0"], "--resolve-stages 0: give 1 or more"),
        (["--resolve", "--shard", "0/2"], "--resolve runs its stages one by one"),
    ],
)
def test_bad_resolve_input_is_one_line_exit_2(argv, says, capsys, tmp_path):
    assert main(["sweep", "--quick", "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("evalkit: error: ") and says in err[0]
    assert not (tmp_path / "o").exists()


def test_a_resumed_resolve_refuses_other_stages(tmp_path, tiny_llama_dir):
    from evalkit.sweep.executors import make_executor

    grid = _grid(tmp_path, tiny_llama_dir)
    store = _synthetic_store(tmp_path / "s", grid)
    ledgers.write_ledger(tmp_path / "s", S.new_ledger(2))
    with pytest.raises(EvalkitError, match="resolved with --resolve-stages 2 .*resume with --resolve-stages 2"):
        R.run_resolve(grid, store, make_executor("local", None), tmp_path / "c", stages=3, engine=None)


@pytest.mark.slow
def test_dry_run_prints_the_plan(tmp_path, tiny_llama_dir, capsys):
    grid = _grid(tmp_path, tiny_llama_dir)
    _synthetic_store(tmp_path / "s", grid)
    text = R.plan_text(grid, tmp_path / "s", tmp_path / "c", budget_s=60, stages=2, budget=ONLY_PPL, engine=None)
    assert "every look at 98.33 % (alpha 0.05 over 3 looks, Bonferroni); budget 1 min 00 s" in text
    assert "fp8_e4m3/tensor/unit: |Δppl| ≤ 1% unresolved" in text
    lines = [x.strip() for x in text.splitlines() if x.strip().startswith("stage ")]
    assert [x.split(" (")[0] for x in lines] == [
        "stage 1: fp8_e4m3/tensor/unit perplexity max_windows 8",
        "stage 2: fp8_e4m3/tensor/unit perplexity max_windows 16",
    ]
    assert "the budget allows" in text and "of 2 stage runs" in text
    capsys.readouterr()
    assert main(["sweep", str(grid.path), "--out", str(tmp_path / "s"), "--dry-run", "--resolve"]) == 0
    assert "resolve plan: up to 3 stages" in capsys.readouterr().out
    assert json.loads((tmp_path / "s" / "spec.json").read_text())["grid_name"] == "resolvegrid" and math.isfinite(1)
