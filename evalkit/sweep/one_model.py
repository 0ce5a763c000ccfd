"""``evalkit run`` below the command line: a one-model, one-evaluation grid description made into a grid by
the sweep's own grid path, checked by the sweep's pre-flight checks and executed by the sweep's runner.

The command line turns its flags into a description once (:func:`evalkit.cli.run.run_description`: the keys
and values a grid file holds, ``--schemes`` as written after the ``auto`` baseline) and hands it here;
nothing below calls back up. :func:`run_one` then makes, in order, every check that needs no model, each one
line (exit 2):

1. the machine: the results and cache folders writable, the model's device present (:mod:`.preflight`);
2. the grid, by :func:`evalkit.sweep.grid.grid_from_data`, as ``evalkit sweep`` makes one from a file: the
   schemes parsed, the engine profile applied, the engine's options typed and its plan made, the evaluation's
   parameters and corpus files checked, the runs and the engine's noise floor run (every problem printed);
3. the pre-flight report of the runs, the checks a sweep makes (:data:`evalkit.sweep.preflight.commands.
   COMMON_CHECKS`: scale files, the model's architecture, the GPU, the engine can start here, the evaluation
   on the engine's backend, the KV cache fit), each problem named for its flag
   (:func:`evalkit.sweep.preflight.commands.run_problems`: every problem printed, then exit 2).

Then :func:`run_model` hands the grid to the sweep's runner, :func:`evalkit.sweep.runner.run_sweep`, with
this module's :class:`OneModelExecutor`: the runner refuses a store that holds other runs (``--out``), the
executor loads the model once, checks every scheme against it, prints the size note of a long run and
prepares the evaluation before anything is written, and the runner writes each run as it completes.
:class:`OneModelRun` gives back what was done, its rows and their table (:mod:`evalkit.sweep.run_table`).
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

    def rows(self) -> list[dict]:
        """Every row, with its model, scheme and evaluation (:func:`evalkit.sweep.run_table.run_rows`)."""
        from evalkit.sweep.run_table import run_rows

        return run_rows(self.done, self.model_name)

    def table(self) -> str:
        """The rows as a table of the evaluation's summary metrics (:func:`evalkit.sweep.run_table.run_table`)."""
        from evalkit.sweep.run_table import run_table

        return run_table(self.rows(), self.metrics)


def run_one(
    data: dict, *, out: Path | None, cache_dir: Path | None, scales: tuple[str, str] | None = None
) -> OneModelRun | None:
    """Check and run the description ``data`` (one model, one evaluation; keys and values as in a grid file)
    with the results store ``out`` (None: no store), the cache folder ``cache_dir`` (None: evalkit's own) and
    ``scales`` (model, format) declared on every static scheme (``--scales-model``/``--scales-format``).
    Returns None when problems were printed (the command exits 2); raises EvalkitError (one line) for the
    machine's."""
    from evalkit.models.loading import cache_root
    from evalkit.sweep.grid import ModelSpec
    from evalkit.sweep.preflight import check_device, check_device_map, check_writable

    workdir = Path(cache_dir) if cache_dir is not None else cache_root() / "work"

    check_writable(out, "--out")  # the machine first: before the model loads, nothing written
    check_writable(workdir, "--cache-dir")
    (model,) = [ModelSpec(**m) for m in data["models"]]
    check_device(model.device, "--device")
    check_device_map(model.device_map, "--device-map")
    from evalkit.sweep.located_yaml import GridError
    from evalkit.sweep.preflight.commands import run_problems
    from evalkit.sweep.preflight.planned import Problem, print_problems

    try:
        grid = _grid(data, scales)
    except GridError as exc:  # every problem of the description, one line each
        print_problems([Problem((), p) for p in exc.problems])
        return None
    if print_problems(run_problems(grid)):
        return None
    from evalkit.runtime.runlog import log_sizes, logs_written
    from evalkit.sweep.store import ResultStore

    engine, profile = grid.data["engine"], grid.data.get("engine_profile")
    logs = Path(out) if out else Path(workdir) / "logs"  # libraries' chatter (lm-eval's warnings, bars) goes here
    before = log_sizes(logs)
    info = {"command": "evalkit run", "engine": engine, **({"engine_profile": profile} if profile else {})}
    store = ResultStore(out) if out else None  # refused by the runner, before the model loads, if it holds other runs
    done = run_model(grid, store, workdir, info=info, logs=logs, sized=True)
    from evalkit.evals.base import get_eval
    from evalkit.models.loading import embedded_name

    (name,) = grid.data["evals"]
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


def _grid(data: dict, scales: tuple[str, str] | None):
    """The grid of the description, by the sweep's grid path (GridError with every problem; the scheme strings
    parsed, the engine options typed and the engine planned there, as for a grid file); its record
    (``spec.json``) names the command, as ``evalkit run`` stores have always done."""
    from evalkit.sweep.grid import grid_from_data
    from evalkit.sweep.located_yaml import Located

    engine = data.get("engine", "emulation")
    grid = grid_from_data(Located.given(data), data["name"], scales=scales)
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
