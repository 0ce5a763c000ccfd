"""Engine-native runs: a run or sweep through an engine loads no weights in evalkit.

The runner gives an engine run the model's weightless handle (config, tokenizer, KV layout) and the
engine loads the weights itself. The test-only engine (tests/toy_engine.py) loads them through its own
reference to the loader, so these tests make evalkit's loader raise and see the runs succeed, with the
numbers the emulation gives on the loaded model.
"""

from __future__ import annotations

import json

import pytest

from evalkit.cli import main
from evalkit.errors import EvalkitError

from tests.cli_checks import one_line_exit_2


@pytest.fixture
def toy_engine():
    from tests.toy_engine import registered

    with registered() as engine:
        yield engine


@pytest.fixture
def no_weights(monkeypatch):
    """evalkit's weight loader raises; the handles opened are counted."""
    import evalkit.models.handle as handle
    import evalkit.models.loading as loading

    def refuse(*args, **kwargs):
        raise AssertionError("evalkit loaded a model's weights")

    opened = []
    real_open = handle.open_model

    def counting_open(name, **options):
        opened.append(name)
        return real_open(name, **options)

    monkeypatch.setattr(loading, "load_model", refuse)
    monkeypatch.setattr(handle, "open_model", counting_open)
    return opened


def _argv(model_dir, tmp_path, *extra):
    return [
        "run",
        "--model",
        str(model_dir),
        "--schemes",
        "fp8_e4m3/tensor/dynamic,int8/token/dynamic",
        "--perplexity-max-windows",
        "2",
        "--perplexity-window",
        "32",
        "--perplexity-stride",
        "32",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--json",
        "--no-progress",
        *extra,
    ]


def _values(rows):
    return {(r["scheme"], r["metric"], r.get("label")): r["value"] for r in rows}


def test_run_through_an_engine_loads_no_weights_and_gives_the_loaded_models_numbers(
    toy_engine, tiny_llama_dir, tmp_path, capsys, monkeypatch
):
    import evalkit.models.loading as loading

    real_load = loading.load_model
    capsys.readouterr()
    assert main(_argv(tiny_llama_dir, tmp_path)) == 0  # the emulation, on the weights evalkit loads
    emulation = json.loads(capsys.readouterr().out)

    def refuse(*args, **kwargs):
        raise AssertionError("evalkit loaded a model's weights")

    monkeypatch.setattr(loading, "load_model", refuse)
    assert main(_argv(tiny_llama_dir, tmp_path, "--engine", "toy", "--out", str(tmp_path / "store"))) == 0
    toy = json.loads(capsys.readouterr().out)
    assert {r["info"]["backend"] for r in toy} == {"toy-engine 1.0"}
    toy = [r for r in toy if not r["info"].get("noise_floor")]  # the engine's own noise floor: no emulation twin
    assert len(toy) == len(emulation) and _values(toy) == _values(emulation)
    # the completion records describe the model from its handle as they do from a loaded model
    records = [json.loads(line) for line in (tmp_path / "store" / "results.jsonl").read_text().splitlines()]
    infos = [r["info"] for r in records if r["type"] == "complete"]
    assert len(infos) == 4, records  # the baseline, both schemes and the engine's noise floor
    loaded = real_load(str(tiny_llama_dir))
    for info in infos:
        assert info["dtype"] == "float32" and info["config_hash"] == loaded.config_hash
        assert info["kv_layout"]["num_kv_heads"] == loaded.layout.num_kv_heads
        assert info["command"] == "evalkit run" and info["engine"] == "toy"


def test_a_sweep_through_an_engine_loads_no_weights(toy_engine, no_weights, tiny_llama_dir, tmp_path):
    from evalkit.sweep.executors import LocalExecutor
    from evalkit.sweep.grid import parse_grid
    from evalkit.sweep.runner import run_sweep
    from evalkit.sweep.store import ResultStore

    path = tmp_path / "g.yaml"
    path.write_text(
        f"models: ['{tiny_llama_dir}']\nschemes: [auto, fp8_e4m3/tensor/dynamic]\n"
        "evals: {perplexity: {max_windows: 1, window: 32, stride: 32}}\nengine: toy\n"
    )
    grid = parse_grid(path)
    store = ResultStore(tmp_path / "store")
    summary = run_sweep(grid, store, LocalExecutor(), workdir=tmp_path / "work", progress=False)
    assert summary.failures == [] and summary.completed == 3  # auto, fp8 and the toy's noise floor
    assert no_weights == [str(tiny_llama_dir)]  # one handle for the model's runs, and no weights


def test_an_evaluation_the_engine_cannot_serve_is_one_line_before_anything_loads(
    toy_engine, no_weights, tiny_llama_dir, tmp_path, capsys
):
    argv = ["run", "--model", str(tiny_llama_dir), "--engine", "toy", "--eval", "decode", "--schemes", "auto"]
    one_line_exit_2([*argv, "--cache-dir", str(tmp_path)], capsys, "decode")
    assert no_weights == []


def test_a_sweep_refuses_an_evaluation_the_engine_cannot_serve_at_its_line_before_anything_loads(
    toy_engine, no_weights, tiny_llama_dir, tmp_path, capsys
):
    """The same refusal as ``run``'s, from the same pre-flight check, at the evaluation's line of the grid
    file: found before a model loads or the store is written, not as a failed run mid-sweep."""
    path = tmp_path / "g.yaml"
    path.write_text(
        f"models: ['{tiny_llama_dir}']\nschemes: [auto, fp8_e4m3/tensor/dynamic]\n"
        "evals:\n  perplexity: {max_windows: 1, window: 32, stride: 32}\n  decode: {prefill: 16, decode: 4}\n"
        "engine: toy\n"
    )
    out = tmp_path / "store"
    assert main(["sweep", str(path), "--out", str(out), "--cache-dir", str(tmp_path / "c"), "--no-progress"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"evalkit: error: {path}:5: evals.decode: "), lines
    assert "decode" in lines[0] and "Traceback" not in lines[0]
    assert no_weights == [] and not out.exists()


def test_the_handle_holds_what_the_loaded_model_says(tiny_llama_dir):
    from evalkit.models.handle import open_model
    from evalkit.models.loading import load_model

    handle, loaded = open_model(str(tiny_llama_dir)), load_model(str(tiny_llama_dir))
    assert handle.model is None
    for field in ("name", "path", "config_hash", "layout", "dtype", "device", "max_length"):
        assert getattr(handle, field) == getattr(loaded, field), field
    assert handle.config.architectures == loaded.config.architectures
    text = "the quick brown fox"
    assert handle.tokenizer(text)["input_ids"] == loaded.tokenizer(text)["input_ids"]
    assert handle.tokenizer.pad_token == loaded.tokenizer.pad_token


def test_a_model_with_no_config_is_one_line(tmp_path):
    from evalkit.models.handle import open_model

    (tmp_path / "empty").mkdir()
    with pytest.raises(EvalkitError, match="could not read model"):
        open_model(str(tmp_path / "empty"))


def test_run_hands_the_sweeps_runner_the_grid_a_sweep_makes_of_the_same_inputs(tiny_llama_dir, tmp_path, monkeypatch):
    """One execution path: ``run`` builds a one-model grid whose runs (and so run ids) are those of the
    equivalent grid file, and the sweep's runner executes it."""
    import evalkit.sweep.runner as runner
    from evalkit.sweep.grid import parse_grid

    handed = []
    real = runner.run_sweep

    def spy(grid, *args, **kwargs):
        handed.append(grid)
        return real(grid, *args, **kwargs)

    monkeypatch.setattr(runner, "run_sweep", spy)
    argv = _argv(tiny_llama_dir, tmp_path)
    assert main(argv) == 0
    (grid,) = handed
    path = tmp_path / "g.yaml"
    path.write_text(
        f"models: ['{tiny_llama_dir}']\nschemes: [auto, fp8_e4m3/tensor/dynamic, int8/token/dynamic]\n"
        "evals: {perplexity: {max_windows: 2, window: 32, stride: 32}}\n"
    )
    assert [r.run_id for r in grid.runs] == [r.run_id for r in parse_grid(path).runs]
    assert [r.scheme for r in grid.runs][0] == "auto" and {r.eval for r in grid.runs} == {"perplexity"}


def test_run_through_an_engine_carries_the_noise_floor_a_grid_does(
    toy_engine, no_weights, tiny_llama_dir, tmp_path, capsys, monkeypatch
):
    """``run --engine`` adds the engine's auto-vs-auto realisation as a grid does (the same runs, so the same run
    ids), prints it as ``auto (noise floor)``, stores it with ``info["noise_floor"]``, and the report's decision
    rule holds the scheme's effect to it."""
    import evalkit.sweep.runner as runner
    from evalkit.report.budget import Budget, verdicts
    from evalkit.report.results import load_store
    from evalkit.report.tables import summary_frame
    from evalkit.sweep.grid import parse_grid

    handed = []
    real = runner.run_sweep
    monkeypatch.setattr(runner, "run_sweep", lambda grid, *a, **k: handed.append(grid) or real(grid, *a, **k))
    store = tmp_path / "store"
    argv = [a for a in _argv(tiny_llama_dir, tmp_path, "--engine", "toy", "--out", str(store)) if a != "--json"]
    argv[argv.index("fp8_e4m3/tensor/dynamic,int8/token/dynamic")] = "fp8_e4m3/tensor/dynamic"
    capsys.readouterr()
    assert main(argv) == 0
    table = [line.split("|")[1].strip() for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert table[1:] == ["auto", "fp8_e4m3/tensor/dynamic", "auto (noise floor)"]
    (grid,) = handed
    path = tmp_path / "g.yaml"
    path.write_text(
        f"models: ['{tiny_llama_dir}']\nschemes: [auto, fp8_e4m3/tensor/dynamic]\n"
        "evals: {perplexity: {max_windows: 2, window: 32, stride: 32}}\nengine: toy\n"
    )
    assert sorted(r.run_id for r in grid.runs) == sorted(r.run_id for r in parse_grid(path).runs)

    records = [json.loads(line) for line in (store / "results.jsonl").read_text().splitlines()]
    done = [r for r in records if r["type"] == "complete"]
    (floor_id,) = [r["run_id"] for r in done if r["spec"].get("engine_options", {}).get("noise_floor")]
    assert [r["spec"]["scheme"] for r in done if r["run_id"] == floor_id] == ["auto"]
    metrics = [r for r in records if r["type"] == "metric"]
    floor = [r for r in metrics if r["run_id"] == floor_id]
    assert floor and all(r["info"]["noise_floor"] and r["info"]["backend"] == "toy-engine 1.0" for r in floor)
    assert not any(r["info"].get("noise_floor") for r in metrics if r["run_id"] != floor_id)

    # the report reads the floor beside the scheme's row, as it does for a grid's store: the largest magnitude of
    # the floor run's relative perplexity change and its interval ends (computed here from the stored row)
    (rel,) = [r for r in floor if r["metric"] == "ppl_delta_rel" and not r["labels"]]
    expected = max(abs(rel[k]) for k in ("value", "ci_low", "ci_high"))
    assert expected > 0  # the toy is not bit-reproducible across realisations
    frame = summary_frame(load_store(store))
    (row,) = frame[frame["scheme"] == "fp8_e4m3/tensor/dynamic"].to_dict("records")
    assert row["ppl_delta_rel_noise_floor"] == pytest.approx(expected)
    assert abs(row["ppl_delta_rel"]) < expected  # the scheme's effect is inside the engine's spread
    (ppl,) = [v for v in verdicts(row, Budget()) if v.name == "Δppl"]
    assert ppl.state == "unresolved" and "inside the engine's noise floor" in ppl.text
    without = {k: v for k, v in row.items() if not k.endswith("_noise_floor")}
    (ppl,) = [v for v in verdicts(without, Budget()) if v.name == "Δppl"]
    assert ppl.state != "unresolved"  # the interval alone decides it
