"""The results store: one folder per sweep, an append-only ``results.jsonl`` that survives crashes.

Folder layout::

    OUT/spec.json        which grid this folder belongs to (identity hash, name, parsed grid)
    OUT/grid.yaml        a copy of the grid file as given
    OUT/results.jsonl    append-only records, one JSON object per line
    OUT/runs/<id16>/     per-run artifacts (plots, samples) written by the evals

Records (``type``): ``metric`` rows, one per (run, metric), with ``run_id``, ``model``,
``scheme`` (canonical string), ``eval``, ``metric``, ``value``, ``ci_low``, ``ci_high``,
``labels``, ``info``; then one ``complete`` record per run (with its spec, row count, time and
resource figures) or one ``failed`` record (with the error). All of a run's records go to the
file in ONE ``write()`` under an exclusive file lock, completion record last, then ``fsync``.
So a crash (even SIGKILL in the middle of the write) can leave at most one torn line at the very
end, and two writers (shards, Ray workers) can never interleave lines.

Readers count a run only when its completion record is present: rows of runs without one and an
undecodable (torn) line are ignored. Every record carries an ``attempt`` id, so after ``--rerun``
the latest attempt's rows are the ones that count. Before appending, a writer that finds the
file not ending in a newline (a torn tail) starts a new line, so the torn fragment stays an
ignorable line of its own and the next run's records are intact.

Nothing is lost silently. Every line starts with the keys that name its run (``type``, ``run_id``,
``attempt``, ``model``, ``scheme``, ``eval``; the rest sorted), so a torn fragment still says whose it
was. Reading the file back is :mod:`evalkit.sweep.store_records`: its :class:`StoreView` lists the torn
lines and the runs a crash cut off; ``evalkit report`` warns of each, and ``evalkit sweep`` re-runs them,
since a run counts as done only by its completion record.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock

from evalkit.sweep.grid import Grid, GridError
from evalkit.sweep.store_records import IDENTITY_KEYS, StoreView, read_records

RESULTS = "results.jsonl"
SPEC = "spec.json"
GRID_COPY = "grid.yaml"
LOCK = ".results.lock"


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _dumps(record: dict[str, Any]) -> str:
    """One record as a JSON line: the keys that name its run first (so even the first hundred bytes of
    a line torn by a crash say which run it belonged to), then the rest sorted."""
    head = json.dumps({k: record[k] for k in IDENTITY_KEYS if k in record}, default=str)
    rest = json.dumps({k: v for k, v in record.items() if k not in IDENTITY_KEYS}, sort_keys=True, default=str)
    return head if rest == "{}" else rest if head == "{}" else f"{head[:-1]}, {rest[1:]}"


@dataclass
class RunOutcome:
    """What executing one run produced; the store turns it into records."""

    run_id: str
    spec: dict[str, Any]  # RunSpec.to_dict()
    ok: bool
    rows: list[dict[str, Any]] = field(default_factory=list)  # MetricRow.to_dict() each
    error: str | None = None
    traceback: str | None = None
    seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, bytes] = field(default_factory=dict)  # relative path -> content (remote executors)


class ResultStore:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.results = self.folder / RESULTS
        self.spec_path = self.folder / SPEC
        self.lock = FileLock(str(self.folder / LOCK))

    # -- ownership -----------------------------------------------------------------------------
    def check(self, grid: Grid) -> None:
        """Refuse (read-only) a folder that holds another grid's results or is not a store."""
        if self.folder.exists() and not self.folder.is_dir():
            raise GridError(f"output {self.folder} exists and is not a folder: choose another --out")
        if self.spec_path.is_file():
            try:
                spec = json.loads(self.spec_path.read_text())
                identity = spec["grid_identity"]
            except (OSError, ValueError, KeyError):
                raise GridError(f"{self.spec_path} is not an evalkit sweep spec: choose another --out") from None
            if identity != grid.identity:
                raise GridError(
                    f"output folder {self.folder} belongs to a different grid ({spec.get('grid_name')!r} from "
                    f"{spec.get('grid_file')}): choose another --out, or delete that folder to start over"
                )
        elif self.results.is_file():
            raise GridError(
                f"{self.folder} has {RESULTS} but no {SPEC}: not a sweep folder of this grid, choose another --out"
            )

    def claim(self, grid: Grid, grid_text: str | None = None) -> None:
        """Check ownership, then write spec.json and the grid copy if this is a new store."""
        self.check(grid)
        self.folder.mkdir(parents=True, exist_ok=True)
        with self.lock:
            self.check(grid)  # another writer may have claimed it meanwhile
            if self.spec_path.is_file():
                return
            spec = {
                "grid_identity": grid.identity,
                "grid_name": grid.name,
                "grid_file": grid.path,
                "created": utc_now(),
                "runs": len(grid.runs),
                "grid": grid.data,
            }
            self.write_spec(spec, grid_text)

    def write_spec(self, spec: dict, grid_text: str | None = None) -> None:
        """Replace spec.json, and grid.yaml when given, each atomically (the caller holds :attr:`lock`)."""
        if grid_text is not None:
            _atomic_write(self.folder / GRID_COPY, grid_text.encode())
        _atomic_write(self.spec_path, (json.dumps(spec, indent=1, sort_keys=True, default=str) + "\n").encode())

    def adopt_spec(self, other: ResultStore) -> None:
        """Take another store's spec (merge): refuse if this one already belongs to a different grid."""
        theirs = json.loads(other.spec_path.read_text())
        self.folder.mkdir(parents=True, exist_ok=True)
        with self.lock:
            if self.spec_path.is_file():
                mine = json.loads(self.spec_path.read_text())
                if mine.get("grid_identity") != theirs["grid_identity"]:
                    raise GridError(
                        f"{self.folder} belongs to a different grid than {other.folder}: choose another output folder"
                    )
                return
            if (other.folder / GRID_COPY).is_file():
                _atomic_write(self.folder / GRID_COPY, (other.folder / GRID_COPY).read_bytes())
            _atomic_write(self.spec_path, other.spec_path.read_bytes())

    def artifact_dir(self, run_id: str) -> Path:
        return self.folder / "runs" / run_id[:16]

    # -- writing -------------------------------------------------------------------------------
    def append(self, outcome: RunOutcome, attempt: str | None = None) -> None:
        """Write one run's records (metric rows, then its completion or failure record) atomically."""
        attempt = attempt or uuid.uuid4().hex
        spec = outcome.spec
        base = {
            "run_id": outcome.run_id,
            "attempt": attempt,
            "model": spec["model"]["name"],
            "scheme": spec["scheme"],
            "eval": spec["eval"],
        }
        lines = []
        if outcome.ok:
            for row in outcome.rows:
                lines.append(
                    _dumps(
                        {
                            "type": "metric",
                            **base,
                            "metric": row["metric"],
                            "value": row["value"],
                            "ci_low": row.get("ci_low"),
                            "ci_high": row.get("ci_high"),
                            "labels": row.get("labels") or {},
                            "info": row.get("info") or {},
                        }
                    )
                )
            lines.append(
                _dumps(
                    {
                        "type": "complete",
                        **base,
                        "rows": len(outcome.rows),
                        "seconds": round(outcome.seconds, 3),
                        "finished": utc_now(),
                        "spec": spec,
                        "info": outcome.info,
                    }
                )
            )
        else:
            lines.append(
                _dumps(
                    {
                        "type": "failed",
                        **base,
                        "error": outcome.error,
                        "traceback": outcome.traceback,
                        "seconds": round(outcome.seconds, 3),
                        "finished": utc_now(),
                        "spec": spec,
                        "info": outcome.info,
                    }
                )
            )
        if outcome.artifacts:
            root = self.artifact_dir(outcome.run_id)
            for rel, content in outcome.artifacts.items():
                target = root / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content)
        self._append_text("".join(line + "\n" for line in lines))

    def _append_text(self, text: str) -> None:
        data = text.encode()
        self.folder.mkdir(parents=True, exist_ok=True)
        with self.lock:
            fd = os.open(self.results, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    data = b"\n" + data  # a torn tail from a crash: keep it on its own (ignored) line
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                os.fsync(fd)
            finally:
                os.close(fd)

    # -- reading -------------------------------------------------------------------------------
    def read(self) -> StoreView:
        return read_records(self.results)


class NoStore:
    """A results store that keeps nothing, for ``evalkit run`` without ``--out``: the sweep's runner
    (:func:`evalkit.sweep.runner.run_sweep`) runs against it as against a folder, it owns no folder, has no
    runs done, and its runs get no artifact folder and no run id (a run id hashes the model's weight files,
    and nothing would read it)."""

    folder = None

    def check(self, grid: Grid) -> None:
        """Nothing to own."""

    def claim(self, grid: Grid, grid_text: str | None = None) -> None:
        """Nothing to write."""

    def read(self) -> StoreView:
        return StoreView(rows=[], complete={}, failed={}, torn_lines=0, uncounted_rows=0)

    def append(self, outcome: RunOutcome, attempt: str | None = None) -> None:
        """Nothing is kept: the caller has the outcome."""


def load_results(folder: str | Path):
    """The counted metric rows of a sweep folder as a pandas DataFrame (for notebooks and reports)."""
    return ResultStore(folder).read().to_frame()


def merge_stores(out: str | Path, shards: list[str | Path]) -> dict[str, int]:
    """Copy every counted run (and every run that only failed) of shard folders into ``out``."""
    target = ResultStore(out)
    stores = []
    for s in shards:
        st = ResultStore(s)
        if not st.spec_path.is_file():
            raise GridError(f"{s} is not a sweep folder (no {SPEC}): give folders written by `evalkit sweep`")
        stores.append(st)
    identities = {json.loads(st.spec_path.read_text()).get("grid_identity") for st in stores}
    if len(identities) != 1:
        raise GridError("the shard folders belong to different grids: merge only shards of one grid")
    target.adopt_spec(stores[0])
    mine = target.read()
    have = set(mine.complete)
    merged = failed = 0
    failures: dict[str, tuple[ResultStore, dict]] = {}
    for st in stores:
        view = st.read()
        rows_by_run: dict[str, list[dict]] = {}
        for r in view.rows:
            rows_by_run.setdefault(r["run_id"], []).append(r)
        for run_id, rec in view.complete.items():
            if run_id in have:
                continue
            rows = [
                {k: r[k] for k in ("metric", "value", "ci_low", "ci_high", "labels", "info")}
                for r in rows_by_run.get(run_id, [])
            ]
            outcome = RunOutcome(
                run_id, rec["spec"], True, rows, seconds=rec.get("seconds", 0.0), info=rec.get("info", {})
            )
            src = st.artifact_dir(run_id)
            if src.is_dir() and src.resolve() != target.artifact_dir(run_id).resolve():
                shutil.copytree(src, target.artifact_dir(run_id), dirs_exist_ok=True)
            target.append(outcome, attempt=rec["attempt"])
            have.add(run_id)
            merged += 1
        for run_id, rec in view.failed.items():
            failures.setdefault(run_id, (st, rec))
    for run_id, (_store, rec) in failures.items():
        if run_id in have or run_id in mine.failed:
            continue
        target.append(
            RunOutcome(
                run_id,
                rec["spec"],
                False,
                error=rec.get("error"),
                traceback=rec.get("traceback"),
                seconds=rec.get("seconds", 0.0),
                info=rec.get("info", {}),
            ),
            attempt=rec["attempt"],
        )
        failed += 1
    return {"merged": merged, "already_present": len(mine.complete), "failed": failed, "shards": len(stores)}


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


__all__ = ["ResultStore", "RunOutcome", "load_results", "merge_stores", "utc_now"]
