"""The engine dry run's backend column and engine costs, and the small engine grid (issue 32: in
``sweep engine --dry-run`` an emulation run and its vLLM twin looked like duplicates; there was no
engine grid a CPU user runs in minutes). Priced from a datasheet (``--assume-device``) or fixed
speeds: nothing here is timed, and nothing needs vLLM."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from evalkit.cli import main
from evalkit.sweep.estimate import ENGINE_COSTS, engine_costs, estimate_sweep
from evalkit.sweep.grid import parse_grid

from tests.cli_checks import one_line_exit_2
from tests.engines.vllm_env import MISSING

REPO = Path(__file__).resolve().parents[2]
GRID = "models: [embedded]\nschemes: [auto, fp8_e4m3/tensor/unit+rounding=rtz]\nengine: {engine}\nevals:\n  perplexity: {{window: 128, max_windows: 2}}\n"


def _rows(text: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.startswith("embedded ")]


def test_an_engine_dry_run_has_a_backend_column(tmp_path, capsys):
    grid = tmp_path / "g.yaml"
    grid.write_text(GRID.format(engine="[emulation, vllm]"))
    assert main(["sweep", str(grid), "--dry-run", "--assume-device", "h200", "--out", str(tmp_path / "o")]) == 0
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if line.startswith("model "))
    assert re.split(r"\s{2,}", header.strip())[:4] == ["model", "scheme", "backend", "eval"]
    rows = _rows(text)
    keys = [(r[1], r[2], r[3]) for r in rows]
    # no row repeats another: the backend tells the twins apart; vLLM's noise floor (auto against auto) is its own row
    assert len(rows) == 5 and len(set(keys)) == 5 and ("auto (noise floor)", "vllm", "perplexity") in keys
    assert {r[2] for r in rows} == {"emulation", "vllm"}
    engine = [r for r in rows if r[2] == "vllm"]
    assert "engine start" in engine[0][-1] and "vllm import" in engine[0][-1]
    assert all("engine start" not in r[-1] for r in rows if r[2] == "emulation")
    assert not (tmp_path / "o").exists()


def test_an_emulation_dry_run_keeps_its_columns(tmp_path, capsys):
    grid = tmp_path / "g.yaml"
    grid.write_text(GRID.format(engine="emulation"))
    assert main(["sweep", str(grid), "--dry-run", "--assume-device", "h200", "--out", str(tmp_path / "o")]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("model "))
    assert "backend" not in header


def test_engine_runs_pay_the_engines_import_once_and_a_start_per_engine(tmp_path):
    from evalkit.sweep import throughput as T

    grid = parse_grid(tmp_path / "g.yaml", GRID.format(engine="[emulation, vllm]"))
    speed = T.Speed(1e12, 1e12, 0.0, 0.0, "probe", "fixed")
    est = estimate_sweep(grid, grid.runs, tmp_path, tmp_path, speed_for=lambda spec, facts, speeds: speed)
    floor = [r for r in est.runs if r.scheme == "auto (noise floor)"]
    # the engine's noise floor is a run of its own (its own options): its baseline pass and a second realisation
    assert len(floor) == 1 and floor[0].extras == ["baseline", "2 engine starts"]
    assert floor[0].seconds > 2 * ENGINE_COSTS["vllm"]["cpu"][1]
    by = {(r.engine, r.scheme == "auto"): r for r in est.runs if r not in floor}  # the engine's scheme: its profile's
    imp, start = ENGINE_COSTS["vllm"]["cpu"]
    # the baseline's engine and the import on the first engine run, one start on the scheme's
    assert by["vllm", True].seconds == pytest.approx(by["emulation", True].seconds + imp + start)
    assert by["vllm", False].seconds == pytest.approx(by["emulation", False].seconds + start)
    assert by["vllm", False].extras == ["1 engine start"]
    assert (
        engine_costs("emulation", "cpu") == (0.0, 0.0)
        and engine_costs("vllm", "cuda:1") == ENGINE_COSTS["vllm"]["cuda"]
    )


# -- sweeps/engine-small.yaml ------------------------------------------------------------------------------
def test_the_small_engine_grid_is_a_subset_of_the_engine_grid():
    small = parse_grid(REPO / "sweeps" / "engine-small.yaml")
    full = parse_grid(REPO / "sweeps" / "engine.yaml")
    assert small.name == "engine-small" and {r.engine for r in small.runs} == {"emulation", "vllm"}
    assert len(small.runs) == 14 and len(small.runs) < len(full.runs)  # 12 and vLLM's 2 noise floor runs
    assert {r.scheme for r in small.runs} <= {r.scheme for r in full.runs}  # the engine grid's own schemes
    assert {r.eval for r in small.runs} == {"perplexity", "decode", "serving"}
    for run in small.runs:  # the engine grid's CPU sizes, never more
        twin = next(r for r in full.runs if r.eval == run.eval and r.engine == run.engine)
        assert run.params == twin.params


def test_the_small_engine_grid_dry_run_shows_each_backend(tmp_path, capsys):
    assert main(["sweep", "engine-small", "--dry-run", "--assume-device", "h200", "--out", str(tmp_path / "o")]) == 0
    rows = _rows(capsys.readouterr().out)
    assert len(rows) == 14 and len({(r[1], r[2], r[3]) for r in rows}) == 14


@pytest.mark.skipif(MISSING is None, reason="vLLM is installed here")
def test_the_small_engine_grid_without_vllm_fails_at_validation(tmp_path, capsys):
    out = tmp_path / "out"
    one_line_exit_2(["sweep", "engine-small", "--out", str(out)], capsys, "8 run(s) on engine vllm", "cannot run here")
    assert not out.exists()


def test_a_bad_assumed_device_is_one_line(capsys, tmp_path):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["sweep", "engine-small", "--dry-run", "--assume-device", "h900", "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'h900'" in err and "Traceback" not in err
