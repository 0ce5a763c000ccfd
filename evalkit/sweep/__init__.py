"""Sweeps: a declarative grid of (model x scheme x eval) runs, a crash-safe results store, and
executors that scale out (shards, Ray). See :mod:`evalkit.sweep.grid` for the grid file format."""

from evalkit.sweep.grid import Grid, GridError, ModelSpec, RunSpec, parse_grid, resolve_grid, versions
from evalkit.sweep.store import ResultStore, RunOutcome, load_results, merge_stores

__all__ = [
    "Grid",
    "GridError",
    "ModelSpec",
    "RunSpec",
    "ResultStore",
    "RunOutcome",
    "load_results",
    "merge_stores",
    "parse_grid",
    "resolve_grid",
    "versions",
]
