"""An evaluation that measures an engine itself (``serving``: vLLM's allocator, scheduler and speed)
names the engines it runs on (its class's ``engines``): a grid runs it on those of its engines only,
a grid with none of them is refused at the eval's line, and the command line refuses it on the
emulation in one line. It is found through the ``evalkit.evals`` entry point, with no EVALKIT_EVALS."""

from __future__ import annotations

import pytest

from evalkit.cli import main

GRID = """
models: [embedded]
schemes: [auto, fp8_e4m3/tensor/unit]
evals:
  perplexity: {{window: 64, max_windows: 1}}
  serving: {{budget_gib: 0.0164794921875, context: 256}}
{engine}"""


def test_serving_is_registered_through_the_entry_point(monkeypatch):
    from importlib.metadata import entry_points

    from evalkit.evals.base import PLUGINS_ENV, eval_names, get_eval

    monkeypatch.delenv(PLUGINS_ENV, raising=False)
    assert "serving" in {ep.name for ep in entry_points(group="evalkit.evals")}, (
        "pip install --no-deps -e . (entry-point metadata)"
    )
    assert "serving" in eval_names() and get_eval("serving").engines == ("vllm",)


def test_a_grid_runs_serving_on_vllm_only(tmp_path):
    from evalkit.sweep.grid import parse_grid

    grid = parse_grid(tmp_path / "g.yaml", GRID.format(engine="engine: [emulation, vllm]\n"))
    by_eval = {}
    for r in grid.runs:
        by_eval.setdefault(r.eval, set()).add(r.engine)
    assert by_eval == {"perplexity": {"emulation", "vllm"}, "serving": {"vllm"}}
    # perplexity: 2 schemes x 2 engines and vLLM's noise floor (auto against auto); serving: 2 schemes on vllm
    assert len(grid.runs) == 2 * 2 + 1 + 2
    (floor,) = [r for r in grid.runs if r.engine_options.get("noise_floor")]
    assert (floor.eval, floor.scheme, floor.engine) == ("perplexity", "auto", "vllm")
    assert len({r.run_id for r in grid.runs}) == len(grid.runs)  # its own run id


@pytest.mark.parametrize("engine", ["", "engine: emulation\n"])
def test_a_grid_without_the_engine_refuses_serving_at_its_line(tmp_path, engine):
    from evalkit.sweep.grid import GridError, parse_grid

    with pytest.raises(GridError) as info:
        parse_grid(tmp_path / "g.yaml", GRID.format(engine=engine))
    (problem,) = info.value.problems
    assert problem.startswith(f"{tmp_path / 'g.yaml'}:6: evals.serving:") and "add engine: vllm" in problem, problem


def test_run_refuses_serving_on_the_emulation_in_one_line(capsys):
    assert main(["run", "--eval", "serving", "--schemes", "fp8_e4m3/tensor/unit"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "eval serving runs on engine vllm only: add --engine vllm" in err, err
