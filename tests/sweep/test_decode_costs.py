"""The dry run prices what it runs: a quantized decode step at the storage path's measured cost
(``evalkit/sweep/decode_costs.json``), a compiled run's first compile, each priced figure printed with
its source, its command and its error."""

from __future__ import annotations

import json

import pytest

from evalkit.sweep import throughput as T
from evalkit.sweep.estimate import estimate_sweep
from evalkit.sweep.grid import parse_grid
from evalkit.sweep.workload import workload

GRID = """name: sampled
models:
  - {name: meta-llama/Llama-3.1-8B-Instruct, dtype: bfloat16, device: cpu}
schemes: [auto, fp8_e4m3/tensor/dynamic, nvfp4]
evals:
  generation: {tasks: [evalkit_arith], samples: 2, temperature: 0.7, top_p: 0.95}
"""


def fixed_speed(compiled: bool) -> T.Speed:
    return T.Speed(1e11, 2e10, 0.01, 0.0, "measured device", "fixed for the test", compiled, 0.001, False, "cpu")


def measured(path: str) -> dict:
    return json.loads(T.DECODE_COSTS.read_text())["cpu"][path]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_sampled_quantized_run_is_priced_at_the_measured_storage_step(tmp_path, compiled):
    grid = parse_grid(tmp_path / "g.yaml", GRID)
    speed = fixed_speed(compiled)
    est = estimate_sweep(grid, grid.runs, tmp_path, tmp_path, speed_for=lambda spec, facts, speeds: speed)
    facts = est.priced["meta-llama/Llama-3.1-8B-Instruct"][0]
    entry = measured("compiled_step" if compiled else "eager_step")
    for scheme, key in (("fp8_e4m3/tensor/dynamic", "fp8_e4m3/tensor/dynamic"), ("nvfp4", "nvfp4")):
        run = next(r for r in grid.runs if r.scheme == scheme)
        row = next(r for r in est.runs if r.scheme == scheme)
        work = workload("generation", run.params, facts, "cpu")
        steps = [f for f in work.forwards if f.length == 1]
        assert steps and run.params["temperature"] == 0.7  # a sampled run, with decode steps to price
        plain_steps = sum(speed.seconds(f, facts) for f in steps)  # the plain cache's steps
        prefills = sum(speed.seconds(f, facts, T.stored_bytes(scheme, facts)) for f in work.forwards if f.length != 1)
        ratio = entry["ratio_to_plain"].get(key, entry["ratio_to_plain"][entry["default"]])
        compile_s = measured_file_compile() if compiled else 0.0
        assert row.seconds == pytest.approx(prefills + ratio * plain_steps + compile_s)
        assert ("compile" in row.extras) == compiled
    assert any(entry["source"] in line and entry["command"] in line and entry["error"] in line for line in est.costs)
    assert "step cost: " + ("compiled" if compiled else "eager") + " storage decode step on cpu" in est.text()


def measured_file_compile() -> float:
    return json.loads(T.DECODE_COSTS.read_text())["cpu"]["first_compile_s"]["value"]


def test_the_eager_fp8_step_costs_more_than_bytes_alone_price_it(tmp_path):
    """The point of measuring: on CPU the bytes-only model prices the FP8 storage step below the plain one
    (fewer bytes read); the measured step is 1.2x the plain one."""
    grid = parse_grid(tmp_path / "g.yaml", GRID)
    speed = fixed_speed(False)
    est = estimate_sweep(grid, grid.runs, tmp_path, tmp_path, speed_for=lambda spec, facts, speeds: speed)
    facts = est.priced["meta-llama/Llama-3.1-8B-Instruct"][0]
    run = next(r for r in grid.runs if r.scheme == "fp8_e4m3/tensor/dynamic")
    steps = [f for f in workload("generation", run.params, facts, "cpu").forwards if f.length == 1]
    bytes_only = sum(speed._seconds(f, facts, T.stored_bytes(run.scheme, facts)) for f in steps)
    priced = sum(speed.seconds(f, facts, T.stored_bytes(run.scheme, facts), run.scheme) for f in steps)
    assert priced > bytes_only
