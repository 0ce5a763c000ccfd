"""Whether the planned schemes fit the engine profile and the engine, and whether the engine can run here.

- The engine profile (``--engine-profile NAME``, :mod:`evalkit.engines.profiles`): every scheme it
  cannot run, one line each, found by :meth:`~evalkit.engines.profiles.EngineProfile.apply` as the
  command then applies it (a derived scale table it writes goes to a temporary folder: a check leaves
  nothing behind). A grid's own ``engine_profile:`` key is applied, and checked, when the grid is parsed.
- The engine's plan (:class:`evalkit.engines.registry.Plan`) is made, and its problems listed, when the grid
  is parsed (:mod:`evalkit.engines.grid_plan`), ``run``'s one-model grid as a sweep's.
- Whether the engine can start on this machine (:func:`engine_ready`: its package, and vLLM's own
  start-up conditions), for runs made here; for runs planned for another machine (a dry run, Ray
  workers) it is a note.
- Whether the engine's backend can run each evaluation with its parameters
  (:func:`check_evals_on_engines`): the refusal it would give when the run starts, found before any model
  loads, for runs made here on an engine that can start.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence

from evalkit.errors import EvalkitError
from evalkit.kv.scheme import Scheme, parse_scheme
from evalkit.sweep.preflight.planned import PlannedRun, Problem, distinct


def profile_or_none(name: str | None):
    """The engine profile called ``name``, or None (no profile, or an unknown one: reported by
    :func:`check_engine_profiles`)."""
    from evalkit.engines.registry import get_profile

    try:
        return get_profile(name) if name else None
    except EvalkitError:
        return None


def applied(profile, scheme: Scheme) -> Scheme | None:
    """``scheme`` as ``profile`` runs it, or None when it cannot; nothing is left on disk."""
    try:
        return _apply(profile, scheme)
    except EvalkitError:
        return None


def _apply(profile, scheme: Scheme) -> Scheme:
    with tempfile.TemporaryDirectory(prefix="evalkit-preflight-") as scratch:
        return profile.apply(scheme, out_dir=scratch)


def check_engine_profiles(runs: Sequence[PlannedRun]) -> list[Problem]:
    """Every scheme an engine profile still to be applied cannot run (and an unknown profile, once)."""
    from evalkit.engines.registry import get_profile

    out: list[Problem] = []
    for run in distinct(runs, "engine_profile", "scheme"):
        if not run.engine_profile or run.profile_applied:
            continue
        try:
            profile = get_profile(run.engine_profile)
        except EvalkitError as exc:
            out.append(Problem(("engine_profile",), str(exc)))
            continue
        try:
            _apply(profile, parse_scheme(run.scheme))
        except EvalkitError as exc:
            out.append(Problem(run.scheme_key, str(exc)))
    return out


def engine_ready(name: str) -> None:
    """EvalkitError (one line, with the fix) unless engine ``name`` can start on this machine: installed,
    and for vLLM its own start-up conditions (an x86-64 CPU with AVX-512, no engine-core subprocess,
    torchvision/torchaudio/torchcodec builds that load), as ``run --engine`` needs them."""
    from evalkit.engines.registry import get_engine

    engine = get_engine(name)
    if name == "vllm":  # the package (with its install line) and beyond
        from evalkit.engines.vllm.install import check_companions, check_multiprocessing
        from evalkit.engines.vllm.kernel import check_vllm_available

        check_vllm_available()
        check_multiprocessing()
        check_companions()
    else:
        engine.require()


def check_engines(runs: Sequence[PlannedRun]) -> list[Problem]:
    """Each engine the runs use that cannot start here: a problem for runs made on this machine, a note
    for runs planned for another."""
    out: list[Problem] = []
    for name in dict.fromkeys(r.engine for r in runs if r.engine != "emulation"):
        group = [r for r in runs if r.engine == name]
        try:
            engine_ready(name)
        except EvalkitError as exc:
            if not any(r.here for r in group):
                out.append(Problem(("engine",), f"engine {name} cannot run on this machine: {exc}", note=True))
            elif group[0].command == "run":
                out.append(Problem(("engine",), f"--engine {name} cannot run here: {exc}"))
            else:
                out.append(
                    Problem(
                        ("engine",),
                        f"{len(group)} run(s) on engine {name}, which cannot run here: {exc} "
                        "(or drop the engine from the grid's engine:)",
                    )
                )
    return out


def check_evals_on_engines(runs: Sequence[PlannedRun]) -> list[Problem]:
    """Each evaluation, with its parameters, that its run's backend cannot honour, one line per engine, its
    options and the evaluation: an evaluation that measures another engine, or a request or option the
    engine's backend refuses (:func:`evalkit.evals.backend.use_backend`, reading the evaluation's declared
    ``request``). For the runs made on this machine whose engine can start here (one that cannot is
    :func:`check_engines`' problem); a run planned without its evaluation is not checked."""
    from evalkit.engines.registry import get_engine
    from evalkit.evals.backend import use_backend
    from evalkit.evals.base import get_eval

    out: list[Problem] = []
    ready: dict[str, bool] = {}
    for run in distinct(runs, "engine", "engine_options", "eval_name", "eval_params"):
        if not run.eval_name or not run.here:
            continue
        if run.engine != "emulation" and run.engine not in ready:
            try:
                engine_ready(run.engine)
                ready[run.engine] = True
            except EvalkitError:
                ready[run.engine] = False
        if run.engine != "emulation" and not ready[run.engine]:
            continue
        try:
            backend = None if run.engine == "emulation" else get_engine(run.engine).hook("backend")(run.options)
            use_backend(get_eval(run.eval_name)(json.loads(run.eval_params)), backend)
        except EvalkitError as exc:
            out.append(Problem(run.eval_key, str(exc)))
    return out
