"""Where ``run`` takes each evaluation's flags from (:func:`evalkit.evals.registry.flag_declarations`): a
built-in's folder ``params.py``, the very Params its evaluation class uses; a plugin's ``evalkit.eval_params``
entry point, without importing the plugin's evaluation module; a plugin that declares none is imported, as
before, and its class adds them."""

from __future__ import annotations

import argparse
import importlib.metadata as md
import sys
import textwrap

import pytest

from evalkit.evals import registry
from evalkit.evals.params import Params
from evalkit.evals.registry import ENTRY_POINTS, PARAMS_ENTRY_POINTS, _builtin, flag_declarations, get_eval


def flags_of(declared) -> str:
    parser = argparse.ArgumentParser(prog="run")
    declared.add_arguments(parser)
    return parser.format_help()


@pytest.mark.parametrize("name", list(_builtin()))
def test_a_builtin_declares_its_flags_in_its_folder_and_they_are_its_evaluations(name):
    declared = flag_declarations()[name]
    assert issubclass(declared, Params) and declared.__module__ == f"evalkit.evals.{name}.params"
    assert declared is get_eval(name).Params and declared.eval_name == name
    assert flags_of(declared) == flags_of(get_eval(name))  # what run --help shows, from either


@pytest.fixture
def plugin_package(tmp_path, monkeypatch):
    """A plugin evaluation in two modules (its light flags and its evaluation, which records its import),
    declared as entry points beside the installed distributions'; the registry's state is restored afterwards."""
    (tmp_path / "lightplug_params.py").write_text(
        textwrap.dedent(
            """
            from dataclasses import dataclass
            from evalkit.evals.params import Params, param

            @dataclass(frozen=True)
            class LightParams(Params):
                size: int = param(3, "how many (default 3)", low=1)
            """
        )
    )
    (tmp_path / "lightplug_eval.py").write_text(
        textwrap.dedent(
            """
            from evalkit.evals.base import Evaluation, register_eval
            from lightplug_params import LightParams

            @register_eval("lightplug")
            class LightEval(Evaluation):
                Params = LightParams
                def prepare(self, lm, workdir): ...
                def evaluate(self, lm, scheme, artifacts=None): return []
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("EVALKIT_EVALS", raising=False)

    ours = [
        md.EntryPoint("lightplug", "lightplug_eval", ENTRY_POINTS),
        md.EntryPoint("lightplug", "lightplug_params:LightParams", PARAMS_ENTRY_POINTS),
    ]

    def entry_points(**select):  # the installed distributions' and ours, as importlib.metadata gives them
        every = md.EntryPoints([*(ep for dist in md.distributions() for ep in dist.entry_points), *ours])
        return every.select(**select) if select else every

    monkeypatch.setattr(md, "entry_points", entry_points)
    saved, loaded = dict(registry._REGISTRY), set(registry._loaded_plugins)
    yield
    registry._REGISTRY.clear(), registry._REGISTRY.update(saved)
    registry._loaded_plugins.clear(), registry._loaded_plugins.update(loaded)
    for module in ("lightplug_params", "lightplug_eval"):
        sys.modules.pop(module, None)


def test_a_plugin_declaring_its_flags_light_is_not_imported_for_them(plugin_package):
    declared = flag_declarations()
    assert list(declared)[: len(_builtin())] == list(_builtin())  # built-ins first, as registry() orders them
    light = declared["lightplug"]
    assert light.__module__ == "lightplug_params" and light.eval_name == "lightplug"
    assert "--lightplug-size" in flags_of(light)
    assert "lightplug_eval" not in sys.modules  # its evaluation module: not imported for its flags
    assert get_eval("lightplug").Params is light  # run time imports it, and the class uses those very flags
    assert "lightplug_eval" in sys.modules


def test_a_plugin_without_a_light_declaration_is_imported_and_its_class_adds_the_flags(plugin_package, monkeypatch):
    installed = md.entry_points  # the fixture's, less the light declaration

    def entry_points(**select):
        every = md.EntryPoints([ep for ep in installed() if ep.group != PARAMS_ENTRY_POINTS])
        return every.select(**select) if select else every

    monkeypatch.setattr(md, "entry_points", entry_points)
    declared = flag_declarations()["lightplug"]
    assert "lightplug_eval" in sys.modules and declared is get_eval("lightplug")
    assert "--lightplug-size" in flags_of(declared)


def test_a_light_declaration_that_cannot_be_loaded_is_one_line(plugin_package, monkeypatch):
    from evalkit.errors import EvalkitError

    installed = md.entry_points  # the fixture's, with the light declaration naming a class that is not there

    def entry_points(**select):
        every = md.EntryPoints(
            [
                md.EntryPoint(ep.name, "lightplug_params:NoSuchParams", ep.group)
                if ep.group == PARAMS_ENTRY_POINTS and ep.name == "lightplug"
                else ep
                for ep in installed()
            ]
        )
        return every.select(**select) if select else every

    monkeypatch.setattr(md, "entry_points", entry_points)
    with pytest.raises(EvalkitError, match=r"evalkit\.eval_params entry point lightplug = .*NoSuchParams.* cannot be"):
        flag_declarations()
