"""``evalkit run`` below the command line: a one-model, one-evaluation grid description, checked, made into a
grid by the sweep's own grid path and executed by the sweep's runner.

The command line turns its flags into a description once (:func:`run_description` keys: the keys a grid file
holds, its schemes already :class:`~evalkit.kv.scheme.Scheme` values, the baseline listed first) and hands it
here; nothing below calls back up. :func:`run_one` then makes, in order, every check that needs no model, each
one line (exit 2):

1. the machine: the results and cache folders writable, the model's device present (:mod:`.preflight`);
2. the engine and its options (:meth:`evalkit.engines.registry.Engine.option_values`);
3. the pre-flight report of the schemes on this model, engine profile and engine, and of the evaluation
   and its parameters on the engine's backend (an option or evaluation it cannot honour)
   (:func:`evalkit.sweep.preflight.commands.run_problems`: every problem printed, then exit 2);
4. the grid itself, by :func:`evalkit.sweep.grid.grid_from_data`, as ``evalkit sweep`` makes one from a file:
   the engine profile, the engine's plan, the evaluation's parameters and corpus files, the runs, and the
   engine's noise floor run.

Then :func:`run_model` hands the grid to the sweep's runner, :func:`evalkit.sweep.runner.run_sweep`, with
this module's :class:`OneModelExecutor`: the runner refuses a store that holds other runs (``--out``), the
executor loads the model once, checks every scheme against it, prints the size note of a long run and
prepares the evaluation before anything is written, and the runner writes each run as it completes.
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

    if print_problems(run_problems(data["schemes"], model, engine, options, profile, (name, params))):
        return None
    grid = _grid(data)
    from evalkit.runtime.runlog import log_sizes, logs_written
    from evalkit.sweep.store import ResultStore

    logs = Path(out) if out else Path(workdir) / "logs"  # libraries' chatter (lm-eval's warnings, bars) goes here
    before = log_sizes(logs)
    info = {"command": "evalkit run", "engine": engine, **({"engine_profile": profile} if profile else {})}
    store = ResultStore(out) if out else None  # refused by the runner, before the model loads, if it holds other runs
    done = run_model(grid, store, workdir, info=info, logs=logs, sized=True)
    from evalkit.evals.base import get_eval
    from evalkit.models.loading import embedded_name

    shown = embedded_name(model.name) or model.name
    return OneModelRun(grid, done, logs_written(logs, before), shown, get_eval(name).summary_metrics)


def run_model(
    grid,
    store,
    workdir: str | Path,
    *,
    info: dict | None = None,
    logs: Path | None = None,
    registry: dict[str, str] | None = None,
    sized: bool = False,
) -> list:
    """Execute a one-model grid as ``evalkit run`` does, by the sweep's runner
    (:func:`evalkit.sweep.runner.run_sweep`) with a :class:`OneModelExecutor`: the store (None: one that keeps
    nothing) is refused if it holds other runs, then nothing is written before the model is loaded, every
    scheme is checked against it and the evaluation is prepared, so bad input leaves no store behind; the
    first error propagates (the command line prints it as one line). Each run is appended to the store as it
    completes (``info`` added to its record), a new attempt when the store has it already. Returns each run
    with its rows. ``logs``: where libraries' chatter goes (default: each run's artifacts folder); ``sized``:
    a run estimated at over 10 min says so on stderr before its first evaluation."""
    from evalkit.sweep.runner import run_sweep
    from evalkit.sweep.store import NoStore

    executor = OneModelExecutor(grid.data.get("engine_profile"), workdir, registry, info=info, logs=logs, sized=sized)
    kept = NoStore() if store is None else store
    run_sweep(grid, kept, executor, rerun=True, workdir=workdir, registry=registry, progress=False)
    return executor.done


class OneModelExecutor:
    """The executor of ``evalkit run`` (:mod:`evalkit.sweep.executors` has the sweep's): one model, in this
    process. :meth:`start`, which the runner calls before it writes anything, loads the model (its weightless
    handle for an engine), checks every scheme against it (:func:`evalkit.sweep.loaded_checks.check_loaded`,
    with the grid's engine profile ``profile``), prints the size note of a long run (``sized``:
    :func:`evalkit.sweep.loaded_checks.size_note`) and prepares each evaluation; :meth:`execute` evaluates
    each run and yields its outcome, ``info`` added to its record. Unlike a sweep's executors, an error is
    not a failed outcome: it propagates, and the runs already yielded are in the store. :attr:`done` holds
    each run with its rows. ``workdir`` and ``registry`` are the runner's (the model is loaded in
    :meth:`start`, which is given only the runs)."""

    name = "one-model"

    def __init__(
        self,
        profile: str | None,
        workdir: str | Path,
        registry: dict[str, str] | None = None,
        *,
        info: dict | None = None,
        logs: Path | None = None,
        sized: bool = False,
    ):
        self.profile = profile
        self.workdir = Path(workdir)
        self.registry = registry
        self.info = info or {}
        self.logs = logs
        self.sized = sized
        self.done: list = []
        self._session = None

    def start(self, runs: list) -> None:
        from evalkit.runtime.runlog import run_folder
        from evalkit.sweep.loaded_checks import check_loaded, size_note
        from evalkit.sweep.run_order import plan
        from evalkit.sweep.runner import ModelSession

        (group,) = plan(list(runs))  # one model: one group
        self._session = session = ModelSession(group[0].model, self.workdir, self.registry)
        try:
            with run_folder(self.logs):
                lm = session.model(group[0])
                check_loaded(self.profile, group, lm)
                if self.sized:
                    size_note(group, lm, self.workdir)
                for run in group:
                    session.prepared(run, lm)
        except BaseException:  # the runner closes only an executor that started
            self.close()
            raise

    def execute(self, groups: list, store, workdir, registry, on_start):
        from evalkit.sweep.store import RunOutcome

        for group in groups:
            for run in group:
                on_start(run)
                if store.folder is None:  # a store that keeps nothing: no run id, no artifacts
                    rows, seconds = self._session.rows(run, None, {}, self.logs)
                    outcome = RunOutcome("", run.to_dict(), True, rows, seconds=seconds)
                else:
                    outcome = self._session.outcome(run, store.artifact_dir(run.run_id), {}, self.logs)
                    outcome.info.update(self.info)
                self.done.append((run, outcome.rows))
                yield run, outcome

    def close(self) -> None:
        if self._session is not None:
            self._session.close()


def _engine_options(engine: str, given: dict) -> dict:
    """The engine's options as typed values (one line for an unknown engine or option); none for the emulation."""
    if engine == "emulation":
        return {}
    from evalkit.engines.registry import get_engine

    return get_engine(engine).option_values(given)


def _grid(data: dict):
    """The grid of the description, by the sweep's grid path (the first problem raised, one line; it types the
    engine options as given, as it does a grid file's); its record (``spec.json``) names the command, as
    ``evalkit run`` stores have always done."""
    from evalkit.sweep.grid import grid_from_data
    from evalkit.sweep.located_yaml import Located

    engine = data.get("engine", "emulation")
    grid = grid_from_data(Located.given(data), data["name"])
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
