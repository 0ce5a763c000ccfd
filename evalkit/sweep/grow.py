"""Growing a results store to a grid that gained runs (``evalkit sweep GRID --out DIR --grow``).

A store belongs to one grid: ``spec.json`` holds the grid's identity, and a sweep of another grid is
refused (:meth:`ResultStore.check`). A published store still has to follow its grid when the grid only
*gains* runs: a new scheme an engine release brings, a new evaluation. Re-making every run for that
would throw away hours of finished, still-current results. Growing keeps them, and only them:

- every finished run of the store must be a run of the new grid, by run id. A run id hashes the run's
  model, scheme, evaluation, parameters and the code identity of the numerics it uses, so a run whose
  settings or code changed has a new id and refuses the growth (re-make that store instead); stale rows
  never pass as current ones. The only finished runs allowed outside the grid are those the caller
  vouches for (``sweep --resolve``'s stage runs, listed in the store's ledger).
- ``spec.json`` takes the new grid's identity, name, file, run count and parsed grid; ``created`` stays,
  and a ``grown`` list records each growth (when, the identity and run count it grew from), so a store
  says that its grid changed. ``grid.yaml`` becomes the new grid file.
The rewrite happens under the store's lock, each file replaced atomically; a growth to the grid the
store already has changes nothing, so shards of a job array can all ask for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from evalkit.sweep.grid import Grid, GridError
from evalkit.sweep.store import ResultStore, utc_now


def check_growable(store: ResultStore, grid: Grid, vouched: Iterable[str] = ()) -> bool:
    """Read-only: True when ``store`` must be grown to ``grid`` (it belongs to another grid whose finished
    runs are all runs of this one), False when it is new or already this grid's; GridError (one line)
    when it holds finished runs the grid lacks or is not a store."""
    if store.folder.exists() and not store.folder.is_dir():
        raise GridError(f"output {store.folder} exists and is not a folder: choose another --out")
    if not store.spec_path.is_file():
        store.check(grid)  # a results file without a spec: refused as any sweep refuses it
        return False
    spec = _spec(store)
    if spec["grid_identity"] == grid.identity:
        return False
    ids = {r.run_id for r in grid.runs} | set(vouched)
    lacking = [rec for run_id, rec in store.read().complete.items() if run_id not in ids]
    if lacking:
        first = lacking[0]
        raise GridError(
            f"--grow: {store.folder} holds {len(lacking)} finished run(s) that grid {grid.name!r} lacks (e.g. "
            f"{first.get('model')} {first.get('scheme')} {first.get('eval')}); growing keeps every finished run, "
            "and a run whose settings or numerics code changed has a new id: re-make the store in a new --out"
        )
    return True


def grow_store(store: ResultStore, grid: Grid, grid_text: str | None, vouched: Iterable[str] = ()) -> dict | None:
    """Rewrite ``store``'s spec (and grid copy) for ``grid`` when it must grow; return the growth record
    (None when nothing changed). Checks again under the lock, as another shard may have grown it."""
    vouched = tuple(vouched)
    if not check_growable(store, grid, vouched):
        return None
    with store.lock:
        if not check_growable(store, grid, vouched):
            return None
        old = _spec(store)
        growth = {"at": utc_now(), "from_identity": old["grid_identity"], "from_runs": old.get("runs")}
        spec = dict(
            old,
            grid_identity=grid.identity,
            grid_name=grid.name,
            grid_file=grid.path,
            runs=len(grid.runs),
            grid=grid.data,
            grown=[*old.get("grown", []), growth],
        )
        store.write_spec(spec, grid_text)
    return growth


def _spec(store: ResultStore) -> dict:
    try:
        spec = json.loads(store.spec_path.read_text())
        spec["grid_identity"]
    except (OSError, ValueError, KeyError, TypeError):
        raise GridError(f"{store.spec_path} is not an evalkit sweep spec: choose another --out") from None
    return spec
