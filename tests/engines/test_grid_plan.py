"""The engines' share of a grid, in one step (:func:`evalkit.engines.grid_plan.plan_engines`): every problem is
returned with the grid key it belongs to, none raised, and the plans equal what each piece gives alone."""

from __future__ import annotations

import pytest

from evalkit.engines.grid_plan import plan_engines
from evalkit.engines.registry import get_engine, get_profile
from evalkit.kv.scheme import Scheme, parse_scheme
from evalkit.sweep.spec import ModelSpec

MODELS = [ModelSpec(name="embedded")]


@pytest.fixture
def toy_engine():
    from tests.toy_engine import registered

    with registered() as engine:
        yield engine


def test_every_problem_comes_back_with_its_key_and_none_is_raised():
    head = parse_scheme("fp8_e4m3/head/dynamic")
    keys = {str(head): ("schemes", 1)}
    plans = plan_engines(
        ["emulation", "nope", "sglang"], {"nope": {"x": 1}}, "vllm-cpu", [Scheme(), head], MODELS, keys
    )
    by_key = {}
    for key, message in plans.problems:
        by_key.setdefault(key, []).append(message)
    assert by_key[("engine",)][0].startswith("unknown engine 'nope': use one of emulation")
    assert "evalkit models engine sglang but does not run it" in by_key[("engine",)][1]
    (refusal,) = by_key[("schemes", 1)]  # at the entry that gives the scheme
    assert refusal.startswith("vllm-cpu cannot run fp8_e4m3/head/dynamic") and "per-tensor" in refusal
    assert ("engine_options", "nope") not in by_key  # an engine that is refused has no options to type
    assert list(plans.schemes) == ["emulation"] and plans.schemes["emulation"] == [
        get_profile("vllm-cpu").apply(Scheme())
    ]


def test_options_are_typed_by_the_engine_and_an_unknown_one_is_a_problem(toy_engine):
    plans = plan_engines(["toy"], {"toy": {"workers": 2, "nope": 1}}, None, [Scheme()], MODELS, {})
    assert plans.problems == [
        (("engine_options", "toy"), "engine toy has no option 'nope': its options are workers, noise_floor")
    ]
    plans = plan_engines(["toy"], {"toy": {"workers": 2}}, None, [Scheme()], MODELS, {})
    assert plans.options == {"toy": get_engine("toy").option_values({"workers": 2})} and not plans.problems
    assert (
        plans.schemes["toy"] == get_engine("toy").hook("plan")([Scheme()], MODELS, None, plans.options["toy"]).schemes
    )
