"""How the engines of a grid take its schemes, in one step: the engine profile applied, each engine's
options typed and each engine's plan made (:class:`~evalkit.kv.scheme.Scheme` values in and out).

The grid path (:func:`evalkit.sweep.grid.grid_from_data`, for ``evalkit sweep``'s files and ``evalkit run``'s
flags alike) reads the description's shape, then hands what it read here once, and turns the problems
returned into located lines: every problem is ``(grid key path, message)``, found before anything runs,
none raised, so one report lists them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from evalkit.errors import EvalkitError

EMULATION = "emulation"


@dataclass
class EnginePlans:
    """What the engines make of a grid: each engine's schemes (the emulation's: the profile's), each engine's
    typed options (:meth:`~evalkit.engines.registry.Engine.option_values`) and every problem found."""

    schemes: dict[str, list] = field(default_factory=dict)  # engine -> Scheme values, each once
    options: dict[str, dict] = field(default_factory=dict)  # engine -> its options as set (typed)
    problems: list[tuple[tuple, str]] = field(default_factory=list)


def plan_engines(
    engines: list[str],
    given: Mapping[str, dict],
    profile: str | None,
    schemes: list,
    models: list,
    scheme_keys: Mapping[str, tuple],
) -> EnginePlans:
    """The plans of ``engines`` (names: the emulation, or engines evalkit runs through) for ``schemes``
    (Scheme values) on ``models``: each name found first (an unknown one, or an engine evalkit models but does
    not run, is a problem at ``engine``), then the engine profile named ``profile`` applied (a scheme it cannot
    run is a problem at its entry, ``scheme_keys``: canonical scheme -> the key path of the entry that gives
    it), then each
    engine's options as ``given`` (engine -> its options as written) typed, then each engine's plan."""
    from evalkit.engines.registry import get_engine

    out = EnginePlans()
    found = {}  # engine -> (the engine, its plan); an unknown name, or an engine evalkit does not run, is a problem
    for name in engines:
        if name != EMULATION:
            try:
                engine = get_engine(name)
                found[name] = engine, engine.hook("plan")
            except EvalkitError as exc:
                out.problems.append((("engine",), str(exc)))
    if profile is not None and schemes:
        schemes = _profiled(profile, schemes, scheme_keys, out.problems)
    for name, options in given.items():
        if name in found:
            try:
                out.options[name] = found[name][0].option_values(options)
            except EvalkitError as exc:
                out.problems.append((("engine_options", name), str(exc)))
    for name in engines:
        if name == EMULATION:
            out.schemes[name] = schemes
        elif name in found:
            plan = found[name][1](schemes, models, profile, out.options.get(name, {}))
            out.problems += list(plan.problems)
            out.schemes[name] = plan.schemes
    return out


def _profiled(name: str, schemes: list, scheme_keys: Mapping[str, tuple], problems: list) -> list:
    """``schemes`` as engine profile ``name`` runs them (:mod:`evalkit.engines.profiles`), each once; a scheme it
    cannot run, or an unknown profile, is a problem."""
    from evalkit.engines.registry import get_profile

    try:
        profile = get_profile(name)
    except EvalkitError as exc:
        problems.append((("engine_profile",), str(exc)))
        return schemes
    out: list = []
    for scheme in schemes:
        try:
            out.append(profile.apply(scheme))
        except EvalkitError as exc:
            problems.append((scheme_keys.get(str(scheme), ("schemes",)), str(exc)))
    return list(dict.fromkeys(out))
