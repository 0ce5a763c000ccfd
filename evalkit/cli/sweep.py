"""`evalkit sweep`: every (model x scheme x eval) of a grid, resumable, shardable, with progress.

    python -m evalkit sweep                       # sweeps/default.yaml
    python -m evalkit sweep --quick               # sweeps/quick.yaml (a minute or two on CPU)
    python -m evalkit sweep GRID.yaml --out DIR [--rerun] [--shard I/N] [--executor ray --ray-address ADDR]
    python -m evalkit sweep GRID.yaml --out DIR --grow   # DIR holds a smaller grid's runs: keep them, add the rest
    python -m evalkit sweep GRID.yaml --dry-run [--assume-device h200]   # runs, tokens, time, disk; runs nothing
    python -m evalkit sweep gpu --model ID_OR_FOLDER                      # the grid with another model
    python -m evalkit sweep --resolve [--resolve-budget 30m] [--dry-run]  # then grow what straddles its limit

Settings come from the :class:`SweepConfig` defaults, then the grid file (``out``, ``executor``),
then these flags. Everything is validated before the output folder is touched or a model loads.
First every problem of the grid file (one line each, exit 2; a model folder or corpus file that does
not exist is one of them); then, in one report, every problem of its runs (:mod:`evalkit.sweep.preflight`:
scale files, each scheme against its model's architecture read from its config, the schemes
``--engine-profile`` cannot run, whether the grid's ``engine:`` can start here), each at the grid line
that gives it. Then a folder that belongs to another grid is refused, so are a results or cache
folder this machine cannot write and a grid ``device:`` it does not have (local executor), and so is
a grid whose baselines, results and model downloads do not fit on the disk
(:mod:`evalkit.sweep.estimate`). ``--dry-run`` prints each run's tokens and estimated time and the
disk needed (:mod:`evalkit.sweep.estimate`), then the same problems (exit 2 when there are any; an
engine not installed here is a note, since a dry run plans for any machine), writes nothing and
evaluates nothing. The exit code is 1 when any run failed (see the summary).

``--resolve`` then grows the criteria whose interval straddles the budget's limit, stage by stage, up to
``--resolve-budget`` (:mod:`evalkit.cli.resolve`); with ``--dry-run`` it prints that plan, priced.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, replace
from pathlib import Path

from evalkit.cli import COMMANDS
from evalkit.cli.scales_flags import add_scales_arguments, declared
from evalkit.errors import EvalkitError


@dataclass(frozen=True)
class SweepConfig:
    out: str | None = None  # default: results/<grid name>
    executor: str = "local"
    ray_address: str | None = None
    shard: str | None = None
    rerun: bool = False

    def with_grid(self, grid) -> SweepConfig:
        return replace(self, out=grid.out or self.out, executor=grid.executor or self.executor)

    def with_args(self, args: argparse.Namespace) -> SweepConfig:
        cfg = self
        for key in ("out", "executor", "ray_address", "shard"):
            value = getattr(args, key)
            if value is not None:
                cfg = replace(cfg, **{key: str(value)})
        return replace(cfg, rerun=cfg.rerun or args.rerun)


def add_parser(sub):
    p = sub.add_parser("sweep", help=COMMANDS["sweep"])
    p.add_argument("grid", nargs="?", default=None, help="grid YAML file, or a name in sweeps/ (default: 'default')")
    p.add_argument("--quick", action="store_true", help="run sweeps/quick.yaml (a minute or two on CPU)")
    p.add_argument("--out", default=None, help="results folder (default: the grid's 'out', else results/<grid name>)")
    p.add_argument("--rerun", action="store_true", help="run finished runs again (default: skip them)")
    p.add_argument(
        "--grow",
        action="store_true",
        help="let --out, a store of another grid, follow this grid when it only gained runs: its finished runs are "
        "kept (each must be a run of this grid, same id) and its spec records the growth",
    )
    p.add_argument("--shard", default=None, metavar="I/N", help="run only shard I of N (0-based), e.g. for a job array")
    p.add_argument("--executor", default=None, choices=("local", "ray"), help="where runs execute (default local)")
    p.add_argument(
        "--ray-address",
        default=None,
        help="an existing Ray cluster (e.g. auto or ray://host:10001); default: start a local one",
    )
    p.add_argument("--cache-dir", type=Path, default=None, help="where evaluations cache tokenized data and baselines")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--engine-profile",
        default=None,
        metavar="NAME",
        help="run every scheme as that engine's kernels do (vllm-cpu, vllm-cuda, vllm-rocm, sglang, "
        "tensorrt-llm): its rounding and scale rules; a scheme it cannot run is refused",
    )
    p.add_argument(
        "--model",
        default=None,
        metavar="ID_OR_FOLDER",
        help="replace the grid's models by this one (hub id, folder or 'embedded'; the grid's dtype and device kept)",
    )
    add_scales_arguments(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="list the runs with their tokens, estimated wall time and the disk needed; run and write nothing",
    )
    p.add_argument(
        "--assume-device",
        default=None,
        choices=("h100", "h200", "a100"),
        help="with --dry-run: time from this GPU's datasheet peaks instead of a probe on this machine",
    )
    p.add_argument(
        "--resolve",
        action="store_true",
        help="after the grid's runs, grow the windows, sequences or items of the criteria whose interval straddles "
        "the budget's limit, in stages, each look at a Bonferroni-split level (docs/statistics.md#runs-that-resolve); "
        "with --dry-run: print the plan",
    )
    p.add_argument(
        "--resolve-budget",
        default=None,
        metavar="TIME",
        help="wall time --resolve may spend on this machine: 90s, 45m, 1.5h (default 30m)",
    )
    p.add_argument(
        "--resolve-stages",
        type=int,
        default=None,
        metavar="K",
        help="growth stages planned, each doubling the units (default 3: up to 8x); fixed by a store's first --resolve",
    )
    p.set_defaults(handler=run)


def _read_grid(path: Path, text: str):
    """The parsed grid, or None when the file has several problems: each is printed on its own line."""
    import sys

    from evalkit.sweep.grid import GridError, parse_grid

    try:
        return parse_grid(path, text)
    except GridError as exc:
        if len(exc.problems) < 2:
            raise
        for problem in exc.problems:
            print(f"evalkit: error: {problem}", file=sys.stderr)
        return None


def run(args: argparse.Namespace, *, free_space=None) -> int:
    """``free_space(folder) -> bytes`` replaces the real free-space query (tests)."""
    from evalkit.models.loading import cache_root
    from evalkit.sweep.estimate import check_disk, disk_free, estimate_sweep
    from evalkit.sweep.grid import resolve_grid, with_engine_profile, with_model
    from evalkit.sweep.grow import check_growable, grow_store
    from evalkit.sweep.preflight.commands import grid_problems
    from evalkit.sweep.preflight.planned import print_problems
    from evalkit.sweep.shard import parse_shard, select
    from evalkit.sweep.store import ResultStore

    if args.quick and args.grid:
        raise EvalkitError("give either a grid or --quick, not both")
    if args.assume_device and not args.dry_run:
        raise EvalkitError("--assume-device only sizes a dry run: add --dry-run, or drop --assume-device")
    resolve = _resolve_settings(args)
    shard = parse_shard(args.shard) if args.shard is not None else None
    path = resolve_grid(args.grid or ("quick" if args.quick else "default"))
    text = grid_text = path.read_text()  # grid_text: the file as written, for the lines of its problems
    grid = _read_grid(path, text)
    if grid is None:
        return 2  # like any user error
    if args.model:
        import yaml

        from evalkit.models.loading import embedded_name, is_path_like, local_folder

        if not embedded_name(args.model) and is_path_like(args.model):
            local_folder(args.model)  # a missing folder: one line now, not when the first run loads it
        grid = with_model(grid, args.model)
        text = f"# {path} with --model {args.model}\n" + yaml.safe_dump(grid.data, sort_keys=False)
    pair = declared(args)
    if pair is not None:  # --scales-model/--scales-format: on every static scheme of the grid
        from evalkit.sweep.grid import with_scales_declared

        grid = with_scales_declared(grid, *pair)
    cfg = SweepConfig().with_grid(grid).with_args(args)
    out = Path(cfg.out or Path("results") / grid.name)
    workdir = Path(args.cache_dir) if args.cache_dir is not None else cache_root() / "work"
    free_space = free_space or disk_free
    store = ResultStore(out)
    here = not args.dry_run and cfg.executor == "local"  # a dry run plans for any machine; Ray workers bring their own
    problems, locate = grid_problems(
        grid, select(grid.runs, shard), grid_text, engine_profile=args.engine_profile, gpu=args.assume_device, here=here
    )
    errors = [p for p in problems if not p.note]
    if args.engine_profile and not errors:
        grid = with_engine_profile(grid, args.engine_profile)
    if args.dry_run:  # the estimate, then every problem: a dry run with problems exits 2
        estimate = estimate_sweep(
            grid, select(grid.runs, shard), out, workdir, assume_device=args.assume_device, free_space=free_space
        )
        print(estimate.text(), flush=True)
        from evalkit.planning.decision_sizing import decision_text  # accuracy tasks: items to resolve a drop
        from evalkit.sweep.store import ResultStore

        pilot = ResultStore(out).read().rows if (Path(out) / "results.jsonl").is_file() else []
        decisions = decision_text(grid, estimate.priced, pilot, args.assume_device or "as priced above")
        if decisions:
            print(decisions, flush=True)
        if resolve is not None:
            from evalkit.cli.resolve import plan_text

            print(
                "\n"
                + plan_text(
                    grid, out, workdir, budget_s=resolve[0], stages=resolve[1], assume_device=args.assume_device
                ),
                flush=True,
            )
        code = print_problems(problems, locate)
        if args.assume_device is None:
            check_disk(estimate)  # a grid that does not fit: the report's last line
        else:  # sized for another machine: this machine's disk is no reason to refuse the plan
            _note_disk(estimate, args.assume_device)
        return code
    if print_problems(problems, locate):
        return 2  # nothing written
    vouched = _resolve_stage_runs(out)
    if not (args.grow and check_growable(store, grid, vouched)):
        _check_store(store, grid, vouched)  # read-only: a foreign folder is refused before anything is written
    _check_machine(grid, store, shard, cfg, out, workdir)
    _check_disk_before(grid, store, shard, cfg.rerun, out, workdir, free_space)
    from evalkit.sweep.executors import make_executor
    from evalkit.sweep.runner import run_sweep

    executor = make_executor(cfg.executor, cfg.ray_address)
    if args.grow:
        growth = grow_store(store, grid, text, vouched)  # the checks above passed: the store follows this grid
        if growth is not None:
            print(f"evalkit: grew {out} from {growth['from_runs']} to {len(grid.runs)} runs ({grid.name})", flush=True)
    if args.no_progress:
        os.environ["EVALKIT_PROGRESS"] = "0"  # the evaluations' own bars (retrieval, lm-eval requests) too
    summary = run_sweep(
        grid,
        store,
        executor,
        rerun=cfg.rerun,
        shard=shard,
        workdir=workdir,
        progress=not args.no_progress,
        grid_text=text,
    )
    print(summary.text(store))
    if summary.failures:
        return 1
    if resolve is not None:  # the grid's runs are all in: grow what straddles
        from evalkit.cli.resolve import run_resolve

        outcome = run_resolve(grid, store, executor, workdir, budget_s=resolve[0], stages=resolve[1])
        print(outcome.text())
        return 1 if outcome.why.startswith("a stage run failed") else 0
    return 0


def _check_store(store, grid, vouched) -> None:
    """``store.check``, its line naming ``--grow`` when the folder's grid differs but every finished run
    of it is a run of this grid."""
    from evalkit.sweep.grid import GridError
    from evalkit.sweep.grow import check_growable

    try:
        store.check(grid)
    except GridError as exc:
        try:
            growable = check_growable(store, grid, vouched)
        except GridError:
            raise exc from None
        if growable:
            raise GridError(f"{exc}; or add --grow: every finished run there is a run of this grid") from None
        raise


def _resolve_stage_runs(out: Path) -> tuple[str, ...]:
    """The run ids of ``--resolve``'s stage runs in ``out`` (its ledger): finished runs outside the grid that
    ``--grow`` keeps."""
    from evalkit.report.resolved import read_ledger

    ledger = read_ledger(out) or {}
    return tuple(
        stage["run_id"]
        for entry in ledger.get("entries", [])
        for stage in entry.get("stages", [])
        if stage.get("run_id")
    )


def _resolve_settings(args: argparse.Namespace) -> tuple[float, int] | None:
    """(budget in seconds, stages) of --resolve, None without it; one line for a bad value."""
    from evalkit.cli import resolve as R

    if not args.resolve:
        for flag, value in (("--resolve-budget", args.resolve_budget), ("--resolve-stages", args.resolve_stages)):
            if value is not None:
                raise EvalkitError(f"{flag} only sets --resolve: add --resolve, or drop {flag}")
        return None
    if args.shard is not None or args.executor == "ray":
        raise EvalkitError("--resolve runs its stages one by one on this machine: drop --shard and --executor ray")
    stages = R.DEFAULT_STAGES if args.resolve_stages is None else args.resolve_stages
    if stages < 1:
        raise EvalkitError(f"--resolve-stages {stages}: give 1 or more growth stages (default {R.DEFAULT_STAGES})")
    budget = R.DEFAULT_BUDGET_S if args.resolve_budget is None else R.parse_budget(args.resolve_budget)
    return budget, stages


def _pending(grid, store, shard, rerun: bool) -> list:
    from evalkit.sweep.shard import select

    done = set() if rerun else set(store.read().complete)
    return [r for r in select(grid.runs, shard) if r.run_id not in done]


def _check_machine(grid, store, shard, cfg: SweepConfig, out: Path, workdir: Path) -> None:
    """One line, before the first run: a results folder this machine cannot write, and with the local
    executor a cache folder it cannot write or a grid ``device:`` it does not have (Ray workers bring
    their own disks and devices; whether the grid's engine can start here is a check of
    :mod:`evalkit.sweep.preflight`)."""
    from evalkit.sweep.preflight import check_grid_devices, check_writable

    check_writable(out, "--out")  # the store is written here, whichever executor runs the runs
    if cfg.executor == "local":
        check_writable(workdir, "--cache-dir")
        pending = _pending(grid, store, shard, cfg.rerun)
        check_grid_devices([r.model for r in pending], grid.path)


def _note_disk(estimate, device: str) -> None:
    """The disk check of a dry run sized for ``device`` (--assume-device), said as a note: the sweep will
    run on that machine, whose disk this one cannot see."""
    import sys

    from evalkit.sweep.estimate import DiskSpaceError, check_disk

    try:
        check_disk(estimate)
    except DiskSpaceError as exc:
        where = f"the sweep on the {device} checks its own disk before it starts"
        print(f"evalkit: note: this machine's disk: {exc}; {where}", file=sys.stderr)


def _check_disk_before(grid, store, shard, rerun: bool, out: Path, workdir: Path, free_space) -> None:
    """Refuse (one line) a sweep whose pending runs do not fit on the disk; sizing problems never block it."""
    from evalkit.sweep.estimate import DiskSpaceError, check_disk, estimate_sweep

    pending = _pending(grid, store, shard, rerun)
    if not pending:
        return
    try:
        estimate = estimate_sweep(grid, pending, out, workdir, timing=False, free_space=free_space)
        check_disk(estimate)
    except DiskSpaceError:
        raise
    except Exception as exc:  # noqa: BLE001  (the evaluations report their own problems when they run)
        import sys

        print(
            f"evalkit: note: disk needs not checked, the sweep could not be sized ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''})",
            file=sys.stderr,
        )
