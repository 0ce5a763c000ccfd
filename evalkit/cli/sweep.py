"""`evalkit sweep`: every (model x scheme x eval) of a grid, resumable, shardable, with progress.

    python -m evalkit sweep                       # sweeps/default.yaml
    python -m evalkit sweep --quick               # sweeps/quick.yaml (a minute or two on CPU)
    python -m evalkit sweep GRID.yaml --out DIR [--rerun] [--shard I/N] [--executor ray --ray-address ADDR]

Settings come from the :class:`SweepConfig` defaults, then the grid file (``out``, ``executor``),
then these flags. Everything is validated before the output folder is touched; a folder that
belongs to another grid is refused. The exit code is 1 when any run failed (see the summary).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, replace
from pathlib import Path

from evalkit.cli import COMMANDS
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
    p.add_argument("--shard", default=None, metavar="I/N", help="run only shard I of N (0-based), e.g. for a job array")
    p.add_argument("--executor", default=None, choices=("local", "ray"), help="where runs execute (default local)")
    p.add_argument("--ray-address", default=None, help="an existing Ray cluster (e.g. auto or ray://host:10001); default: start a local one")
    p.add_argument("--cache-dir", type=Path, default=None, help="where evaluations cache tokenized data and baselines")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from evalkit.sweep.executors import make_executor
    from evalkit.sweep.grid import parse_grid, resolve_grid
    from evalkit.sweep.runner import run_sweep
    from evalkit.sweep.shard import parse_shard
    from evalkit.sweep.store import ResultStore

    if args.quick and args.grid:
        raise EvalkitError("give either a grid or --quick, not both")
    shard = parse_shard(args.shard) if args.shard is not None else None
    path = resolve_grid(args.grid or ("quick" if args.quick else "default"))
    text = path.read_text()
    grid = parse_grid(path, text)
    cfg = SweepConfig().with_grid(grid).with_args(args)
    out = Path(cfg.out or Path("results") / grid.name)
    store = ResultStore(out)
    store.check(grid)  # read-only: a foreign folder is refused before anything is written
    executor = make_executor(cfg.executor, cfg.ray_address)
    if args.no_progress:
        os.environ["EVALKIT_PROGRESS"] = "0"  # the evaluations' own bars (retrieval, lm-eval requests) too
    summary = run_sweep(grid, store, executor, rerun=cfg.rerun, shard=shard, workdir=args.cache_dir,
                        progress=not args.no_progress, grid_text=text)
    print(summary.text(store))
    return 1 if summary.failures else 0
