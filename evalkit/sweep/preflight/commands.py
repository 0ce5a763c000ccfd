"""What each command plans and which checks it makes before any model loads (:mod:`.planned`).

:data:`COMMON_CHECKS` are made by ``run``, ``sweep`` and ``sweep --dry-run`` alike; the engine's plan is
made when the grid is parsed (:mod:`evalkit.engines.grid_plan`), ``run``'s as a sweep's. Whether the GPU a run is planned for can run
its ``kv_cache_dtype`` (``PlannedRun.gpu`` is ``--assume-device`` in a dry run, None where the run's own
device decides) is :mod:`.gpu_fit`. Another check is a callable ``(runs) -> list[Problem]`` appended to
:data:`COMMON_CHECKS`.

:func:`grid_problems` plans a grid's runs (one :class:`PlannedRun` per run, its scheme and model
located at the grid entry that gives them) and :func:`run_problems` the runs of ``evalkit run``'s one-model grid.
"""

from __future__ import annotations

from collections.abc import Callable

from evalkit.sweep.preflight.engines import (
    check_engine_profiles,
    check_engines,
    check_evals_on_engines,
)
from evalkit.sweep.preflight.gpu_fit import check_gpu_fit
from evalkit.sweep.preflight.kv_fit import check_kv_fit, with_longest
from evalkit.sweep.preflight.model_fit import check_model_fit
from evalkit.sweep.preflight.planned import Check, PlannedRun, Problem, find_problems, grid_locator
from evalkit.sweep.preflight.scale_files import check_scale_files
from evalkit.sweep.spec import canonical_json

COMMON_CHECKS: list[Check] = [
    check_engine_profiles,
    check_scale_files,
    check_model_fit,
    check_gpu_fit,
    check_engines,
    check_evals_on_engines,
    check_kv_fit,
]


def grid_checks() -> list[Check]:
    return list(COMMON_CHECKS)


def grid_problems(
    grid,
    runs,
    text: str,
    *,
    engine_profile: str | None = None,
    gpu: str | None = None,
    here: bool = True,
) -> tuple[list[Problem], Callable[[Problem], str]]:
    """Every problem of ``runs`` (a grid's :class:`~evalkit.sweep.spec.RunSpec` values) and how to place
    each (``FILE:LINE: KEY:`` from the grid file's ``text``). ``engine_profile``: a profile still to be
    applied to the runs (``sweep --engine-profile``); ``gpu``: the GPU the runs are planned for;
    ``here``: whether they run on this machine."""
    from evalkit.sweep.grid_entries import scheme_entries
    from evalkit.sweep.located_yaml import Located

    runs = list(runs)
    doc = Located(grid.path, text)
    entries = scheme_entries(doc)
    models = _model_entries(doc.value)
    planned = [
        _planned(
            r,
            engine_profile=engine_profile or grid.data.get("engine_profile"),
            profile_applied=engine_profile is None,
            gpu=gpu,
            here=here,
            scheme_key=entries.get(r.scheme, ("schemes",)),
            model_key=models.get(r.model.name, ("models",)),
            eval_key=("evals", r.eval),
        )
        for r in runs
    ]
    planned = with_longest(planned, runs)  # engine runs: their evaluation's longest request (the KV-fit check)
    problems = sorted(find_problems(planned, grid_checks()), key=lambda p: _line(doc, p.key))  # the file's order
    return problems, grid_locator(doc)


def _line(doc, key: tuple) -> int:
    """The grid line of ``key`` (or of the nearest key above it); 0 for a problem the file does not give."""
    while key and key not in doc.lines:
        key = key[:-1]
    return doc.lines.get(key, 0) if key else 0


def _model_entries(data) -> dict[str, tuple]:
    """model name -> the key path of the ``models`` entry that names it."""
    entries = data.get("models") if isinstance(data, dict) else None
    out: dict[str, tuple] = {}
    for i, m in enumerate(entries if isinstance(entries, list) else []):
        name = m if isinstance(m, str) else m.get("name") if isinstance(m, dict) else None
        if isinstance(name, str):
            out.setdefault(name, ("models", i) + (("name",) if isinstance(m, dict) else ()))
    return out


def run_problems(grid) -> list[Problem]:
    """Every problem of ``evalkit run``'s one-model grid (its runs' schemes as the grid's engine profile and
    engine plan made them, its evaluation with its parameters), each named for the flag that gives it; the
    same checks as a sweep's (:data:`COMMON_CHECKS`)."""
    planned = [
        _planned(
            r,
            engine_profile=grid.data.get("engine_profile"),
            scheme_key=("schemes", r.scheme),
            model_key=("model",),
            command="run",
            eval_key=("eval",),
        )
        for r in grid.runs
    ]
    return find_problems(planned, COMMON_CHECKS)  # not sized: the engine checks its KV cache fit as it starts


def _planned(run, **where) -> PlannedRun:
    """The :class:`PlannedRun` of a grid's run (a :class:`~evalkit.sweep.spec.RunSpec`): its model, scheme,
    engine and options and evaluation, with ``where`` (the profile, the machine, the keys that place it)."""
    return PlannedRun(
        model=run.model,
        scheme=run.scheme,
        engine=run.engine,
        engine_options=run.engine_options_json,
        eval_name=run.eval,
        eval_params=canonical_json(run.params),
        **where,
    )
