"""The engine registry: a test-only engine (tests/toy_engine.py) appears in run, grids, conformance and
capacity with no file of the package changed; unknown engines and options are one line, exit 2."""

from __future__ import annotations

import json

import pytest

from evalkit.cli import main
from evalkit.engines import registry
from evalkit.errors import EvalkitError

from tests.cli_checks import one_line_exit_2


@pytest.fixture
def toy_engine():
    from tests.toy_engine import registered

    with registered() as engine:
        yield engine


def test_the_builtin_engines_are_declared_in_their_folders():
    engines = registry.engines()
    assert {"vllm", "llamacpp"} <= set(engines)
    for name in ("vllm", "llamacpp"):
        e = engines[name]
        assert registry._builtin_modules().count(f"evalkit.engines.{name}.engine") == 1
        for hook in ("backend", "plan", "conformance", "capacity"):
            assert callable(e.hook(hook)), (name, hook)
    assert registry.choices()[0] == "emulation"
    assert registry.get_engine("llama.cpp") is engines["llamacpp"]


def test_a_test_only_engine_is_in_every_list(toy_engine):
    assert "toy" in registry.choices() and registry.get_engine("toy") is toy_engine
    with pytest.raises(EvalkitError, match="registered twice"):
        registry.register_engine(registry.Engine("toy", "json", "", "other", "x:y", "x:y"))


def test_the_toy_engine_in_a_grid_with_its_option_in_the_run_id(toy_engine, tmp_path, tiny_llama_dir):
    from evalkit.sweep.grid import parse_grid

    def grid(extra: str):
        path = tmp_path / "g.yaml"
        path.write_text(
            f"models: ['{tiny_llama_dir}']\nschemes: [auto, fp8_e4m3/tensor/dynamic]\n"
            "evals: {perplexity: {max_windows: 1, window: 32, stride: 32}}\n" + extra
        )
        return parse_grid(path)

    g = grid("engine: [emulation, toy]\n")
    assert sorted({r.engine for r in g.runs}) == ["emulation", "toy"]
    with_option = grid("engine: [emulation, toy]\nengine_options: {toy: {workers: 3}}\n")
    toy_ids = {r.run_id for r in g.runs if r.engine == "toy"}
    opt_runs = [r for r in with_option.runs if r.engine == "toy"]
    assert {r.engine_options["workers"] for r in opt_runs} == {3}
    assert toy_ids.isdisjoint(r.run_id for r in opt_runs)  # the option is in the run id
    assert {r.run_id for r in g.runs if r.engine == "emulation"} == {
        r.run_id for r in with_option.runs if r.engine == "emulation"
    }  # and only in the engine's runs
    from evalkit.sweep.grid import RunSpec

    assert RunSpec.from_dict(opt_runs[0].to_dict()) == opt_runs[0]
    for extra, needle in (
        ("engine: toy\nengine_options: {toy: {wrokers: 3}}\n", "has no option 'wrokers'"),
        ("engine: toy\nengine_options: {toy: {workers: many}}\n", "must be a int"),
        ("engine: toy\nengine_options: {vllm: {tensor_parallel_size: 2}}\n", "does not name"),
        ("engine: nope\n", "unknown engine 'nope': use one of emulation"),
    ):
        with pytest.raises(EvalkitError, match=needle):
            grid(extra)
    path = tmp_path / "bad.yaml"
    path.write_text(
        f"models: ['{tiny_llama_dir}']\nschemes: [int4/token/dynamic]\nevals: {{perplexity: {{}}}}\nengine: toy\n"
    )
    with pytest.raises(EvalkitError, match="engine toy cannot run int4/token/dynamic: its kv_cache_dtypes run auto"):
        parse_grid(path)


def test_run_engine_toy_gives_the_emulations_numbers_under_its_name(toy_engine, tiny_llama_dir, tmp_path, capsys):
    common = [
        "run",
        "--model",
        str(tiny_llama_dir),
        "--eval",
        "perplexity",
        "--schemes",
        "fp8_e4m3/tensor/dynamic",
        "--perplexity-max-windows",
        "1",
        "--perplexity-window",
        "32",
        "--perplexity-stride",
        "32",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--json",
        "--no-progress",
    ]
    capsys.readouterr()
    assert main([*common, "--engine", "toy", "--engine-option", "workers=2"]) == 0
    toy = json.loads(capsys.readouterr().out)
    assert main(common) == 0
    emu = json.loads(capsys.readouterr().out)
    assert {r["info"]["backend"] for r in toy} == {"toy-engine 1.0"}
    assert {r["info"]["backend"] for r in emu} == {"emulation"}
    values = lambda rows: {(r["scheme"], r["metric"], r.get("label")): r["value"] for r in rows}  # noqa: E731
    floor = [r for r in toy if r["scheme"] == "auto (noise floor)"]  # the engine's noise floor: not the emulation's
    assert floor and all(r["info"]["noise_floor"] for r in floor)
    assert values([r for r in toy if r not in floor]) == values(emu)


def test_conformance_and_capacity_reach_the_toy_engine(toy_engine, capsys):
    capsys.readouterr()
    assert main(["conformance", "--engine", "toy", "--schemes", "auto"]) == 0
    assert "toy conformance: schemes auto" in capsys.readouterr().out
    assert main(["capacity", "--engine", "toy", "--model", "embedded"]) == 0  # no command: its declaration counted
    assert "engine toy 1.0 (counted from its declaration): auto = auto" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--engine", "nope", "--schemes", "fp8_e4m3/tensor/dynamic"],
        ["conformance", "--engine", "nope"],
        ["capacity", "--engine", "nope", "--model", "embedded"],
    ],
)
def test_an_unknown_engine_is_one_line(argv, capsys):
    one_line_exit_2(argv, capsys, "unknown engine 'nope'", "emulation", "vllm", "llamacpp")


def test_engine_options_are_refused_in_one_line(toy_engine, capsys):
    one_line_exit_2(["run", "--schemes", "auto", "--engine-option", "workers=2"], capsys, "add --engine NAME")
    one_line_exit_2(
        ["run", "--engine", "toy", "--schemes", "auto", "--engine-option", "nope=1"], capsys, "no option 'nope'"
    )
    one_line_exit_2(["run", "--engine", "toy", "--schemes", "auto", "--engine-option", "workers"], capsys, "KEY=VALUE")
