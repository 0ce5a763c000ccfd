"""The runner's steps between loading a one-model grid's model and its first evaluation (``evalkit run``).

Once :class:`evalkit.sweep.one_model.OneModelExecutor` has the model (its weightless handle for an engine), two
things are known that no check before the load could know, and both are settled before time goes to the
baseline:

- :func:`check_loaded`: every scheme of the grid against the model's KV layout and config
  (:class:`~evalkit.integration.binding.BoundScheme`), against the grid's engine profile's kernels
  (``engine_profile``: head_dim and the like) and, through an engine, against the engine's own
  configuration of each scheme. The first problem is raised as one line; nothing has been written.
- :func:`size_note`: the run's estimated time on this machine (:mod:`evalkit.sweep.run_size`); over 10 min
  it prints one line on stderr with the CPU sizes to try, and never stops the run.

Both read the grid's runs (and its ``engine_profile``) alone, so nothing here calls back into the command
line that built it.
"""

from __future__ import annotations

import sys


def check_loaded(profile_name: str | None, runs, lm) -> None:
    """Every scheme of ``runs`` (a one-model grid's) bound to ``lm``: EvalkitError (one line) for the first
    that this model, the grid's engine profile (``profile_name``; None: none) or its engine cannot run."""
    from evalkit.integration.binding import BoundScheme

    profile = None
    if profile_name:
        from evalkit.engines.registry import get_profile

        profile = get_profile(profile_name)
    schemes = list(dict.fromkeys(r.scheme_value for r in runs))
    for scheme in schemes:
        BoundScheme(scheme, lm.layout, lm.config_hash)
        if profile is not None:
            profile.check(scheme, lm.layout)
    for engine in dict.fromkeys(r.engine for r in runs if r.engine != "emulation"):
        from evalkit.engines.registry import get_engine

        run = next(r for r in runs if r.engine == engine)
        options = {k: v for k, v in run.engine_options.items() if k != "noise_floor"}  # the floor's mark is no option
        get_engine(engine).hook("backend")(options).check(schemes, lm.layout)


def size_note(runs, lm, workdir) -> None:
    """One line on stderr before a run estimated at over 10 min on this machine: the estimate and the
    flags of the CPU sizes (:mod:`evalkit.sweep.run_size`); a run that cannot be sized runs all the same."""
    from evalkit.evals.base import get_eval
    from evalkit.sweep import run_size

    first = next((r for r in runs if not r.engine_options.get("noise_floor")), runs[0])
    cls = get_eval(first.eval)
    schemes = list(dict.fromkeys(r.scheme_value for r in runs))
    try:
        size = run_size.estimate_run(first.model, cls, first.params, schemes, first.engine, lm, workdir)
    except Exception:  # noqa: BLE001  (a run that cannot be sized runs all the same)
        return
    line = run_size.note(size, first.model.device, cls, schemes, first.engine)
    if line:
        print(f"evalkit: note: {line}", file=sys.stderr, flush=True)
