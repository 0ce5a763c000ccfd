"""`--shard I/N`: a deterministic partition of a grid's runs, for Slurm or any job array.

Every shard computes the same partition from the full list of runs (not from what is already
done), so N jobs started with I = 0..N-1 cover every run exactly once, with no coordination.
A model's runs stay together where possible, so each shard loads each of its models once:

* with at least N models, whole models are assigned to shards, largest first, each to the shard
  with the fewest runs so far (ties: lowest shard index); models are ordered by run count and
  then by the hash of their settings, so the result does not depend on the grid's order;
* with fewer models than shards, the runs (models in hash order, each model's runs sorted by run
  id) are dealt round-robin over the shards, so each shard loads each model at most once and
  shard sizes differ by at most one run.
"""

from __future__ import annotations

import hashlib
import re

from evalkit.errors import EvalkitError
from evalkit.sweep.grid import RunSpec


class ShardError(EvalkitError):
    pass


def parse_shard(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m:
        raise ShardError(f"shard {text!r} is not I/N: write e.g. --shard 0/4 (I counts from 0)")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or i >= n:
        raise ShardError(
            f"shard {text!r} is out of range: I must be between 0 and N-1 (e.g. 0/{max(n, 2)} .. {max(n, 2) - 1}/{max(n, 2)})"
        )
    return i, n


def _key_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def assign(runs: list[RunSpec] | tuple[RunSpec, ...], n: int) -> list[list[RunSpec]]:
    """Partition ``runs`` into ``n`` lists (in the runs' original order within each shard)."""
    groups: dict[str, list[RunSpec]] = {}
    for r in runs:
        groups.setdefault(r.model.key, []).append(r)
    chosen: dict[str, int] = {}
    if len(groups) >= n:
        load = [0] * n
        for key in sorted(groups, key=lambda k: (-len(groups[k]), _key_hash(k))):
            target = min(range(n), key=lambda s: (load[s], s))
            load[target] += len(groups[key])
            for r in groups[key]:
                chosen[r.run_id] = target
    else:
        dealt = 0
        for key in sorted(groups, key=_key_hash):
            for r in sorted(groups[key], key=lambda r: r.run_id):
                chosen[r.run_id] = dealt % n
                dealt += 1
    shards: list[list[RunSpec]] = [[] for _ in range(n)]
    for r in runs:
        shards[chosen[r.run_id]].append(r)
    return shards


def select(runs, shard: tuple[int, int] | None) -> list[RunSpec]:
    if shard is None:
        return list(runs)
    i, n = shard
    return assign(runs, n)[i]
