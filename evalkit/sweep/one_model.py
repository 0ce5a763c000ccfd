"""``evalkit run`` below the command line: a one-model, one-evaluation grid description, checked, made into a
grid by the sweep's own grid path and executed by the sweep's runner.

The command line turns its flags into a description once (:func:`run_description` keys: the keys a grid file
holds, its schemes already :class:`~evalkit.kv.scheme.Scheme` values, the baseline listed first) and hands it
here; nothing below calls back up. :func:`run_one` then makes, in order, every check that needs no model, each
one line (exit 2):

1. the machine: the results and cache folders writable, the model's device present (:mod:`.preflight`);
2. the engine and its options (:meth:`evalkit.engines.registry.Engine.option_values`);
3. the pre-flight report of the schemes on this model, engine profile and engine
   (:func:`evalkit.sweep.preflight.commands.run_problems`: every problem printed, then exit 2);
4. the evaluation's parameters against the engine's backend (an option or evaluation it cannot honour);
5. the grid itself, by :func:`evalkit.sweep.grid.grid_from_data`, as ``evalkit sweep`` makes one from a file:
   the engine profile, the engine's plan, the evaluation's parameters and corpus files, the runs, and the
   engine's noise floor run;
6. ``--out``: a store that holds other runs is refused (:meth:`evalkit.sweep.store.ResultStore.check`).

Then :func:`evalkit.sweep.runner.run_model` loads the model once, checks every scheme against it, prints the
size note of a long run, prepares the evaluation and writes each run as it completes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class OneModelRun:
    """What :func:`run_one` did: the grid it ran, each run with its rows, the libraries' logs it wrote to, the
    model's name as the loaded model names itself (``embedded`` for the embedded model's folder) and the
    evaluation's summary metrics (the columns a table of the rows shows)."""

    grid: object
    done: list
    logs: list[Path]
    model_name: str
    metrics: tuple[str, ...]


def run_one(data: dict, *, out: Path | None, cache_dir: Path | None) -> OneModelRun | None:
    """Check and run the description ``data`` (one model, one evaluation; keys as in a grid file) with the
    results store ``out`` (None: no store) and the cache folder ``cache_dir`` (None: evalkit's own). Returns
    None when the pre-flight report printed problems (the command exits 2); raises EvalkitError (one line)
    for anything else found before the model loads."""
    from evalkit.models.loading import cache_root
    from evalkit.sweep.grid import ModelSpec
    from evalkit.sweep.preflight import check_device, check_device_map, check_writable

    workdir = Path(cache_dir) if cache_dir is not None else cache_root() / "work"

    check_writable(out, "--out")  # the machine first: before the model loads, nothing written
    check_writable(workdir, "--cache-dir")
    (model,) = [ModelSpec(**m) for m in data["models"]]
    check_device(model.device, "--device")
    check_device_map(model.device_map, "--device-map")
    engine = data.get("engine", "emulation")
    profile = data.get("engine_profile")
    options = _engine_options(engine, (data.get("engine_options") or {}).get(engine, {}))
    (name, params), *_ = data["evals"].items()
    from evalkit.sweep.preflight.commands import run_problems
    from evalkit.sweep.preflight.planned import print_problems

    if print_problems(run_problems(data["schemes"], model, engine, options, profile)):
        return None
    _check_eval_on_engine(name, params, engine, options)
    grid = _grid(data, options)
    store = None
    if out:  # refused here, before the model loads, if it holds other runs
        from evalkit.sweep.store import ResultStore

        store = ResultStore(out)
        store.check(grid)
    from evalkit.runtime.runlog import log_sizes, logs_written
    from evalkit.sweep import runner

    logs = Path(out) if out else Path(workdir) / "logs"  # libraries' chatter (lm-eval's warnings, bars) goes here
    before = log_sizes(logs)
    info = {"command": "evalkit run", "engine": engine, **({"engine_profile": profile} if profile else {})}
    done = runner.run_model(grid, store, workdir, info=info, logs=logs, sized=True)
    from evalkit.evals.base import get_eval
    from evalkit.models.loading import embedded_name

    shown = embedded_name(model.name) or model.name
    return OneModelRun(grid, done, logs_written(logs, before), shown, get_eval(name).summary_metrics)


def _engine_options(engine: str, given: dict) -> dict:
    """The engine's options as typed values (one line for an unknown engine or option); none for the emulation."""
    if engine == "emulation":
        return {}
    from evalkit.engines.registry import get_engine

    return get_engine(engine).option_values(given)


def _check_eval_on_engine(name: str, params: dict, engine: str, options: dict) -> None:
    """The evaluation's parameters (one line for a bad one), and an evaluation or option the engine's backend
    cannot honour (one line), before the grid is made."""
    from evalkit.evals.backend import use_backend
    from evalkit.evals.base import get_eval

    cls = get_eval(name)
    backend = None
    if engine != "emulation":
        from evalkit.engines.registry import get_engine

        backend = get_engine(engine).hook("backend")(options)
    use_backend(cls(params), backend)


def _grid(data: dict, options: dict):
    """The grid of the description, by the sweep's grid path (the first problem raised, one line); its record
    (``spec.json``) names the command, as ``evalkit run`` stores have always done."""
    from evalkit.sweep.grid import grid_from_data
    from evalkit.sweep.located_yaml import Located

    engine = data.get("engine", "emulation")
    given = {**data, "engine_options": {engine: options}} if options else data
    grid = grid_from_data(Located.given(given), data["name"])
    (model,) = data["models"]
    record = {
        "name": grid.name,
        "models": [model["name"]],
        "schemes": list(dict.fromkeys(r.scheme for r in grid.runs if not r.engine_options.get("noise_floor"))),
        "evals": {r.eval: r.params for r in grid.runs[:1]},
        "command": "evalkit run",
        "engine": engine,
    }
    return replace(grid, path="evalkit run", data={**record, **_profile(data)})


def _profile(data: dict) -> dict:
    """The engine profile the runs were made with (read back by the runner's check against the loaded model)."""
    return {"engine_profile": data["engine_profile"]} if data.get("engine_profile") else {}
