"""Reading a results store's ``results.jsonl``: which runs count, and what a crash left behind.

The writer (:mod:`evalkit.sweep.store`) puts all of a run's records in one write, completion record last,
and starts every line with the keys that name its run (:data:`IDENTITY_KEYS`). So a reader counts a run
only by its completion record (the latest attempt's, after ``--rerun``), ignores rows of attempts without
one, and keeps each undecodable line as a :class:`TornLine` with whatever identity keys are readable in
it. :class:`CutOffRun` names each run a crash cut off (rows or a fragment, no completion or failure
record, not finished by a later attempt): ``evalkit report`` warns of each, and ``evalkit sweep`` re-runs
them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

IDENTITY_KEYS = ("type", "run_id", "attempt", "model", "scheme", "eval")  # first on every line


@dataclass(frozen=True)
class TornLine:
    """An undecodable line of ``results.jsonl``: where it is, and what can still be read of it."""

    line: int  # 1-based
    last: bool  # the file's last line: a crash while the final run was being written
    fields: dict[str, str]  # the identity keys (IDENTITY_KEYS) readable in the fragment


@dataclass(frozen=True)
class CutOffRun:
    """A run whose records a crash cut off (metric rows or a torn line, no completion record), and
    that no later attempt completed: it is missing from every table until the sweep re-runs it."""

    run_id: str  # "" when no readable part of it names its run
    attempt: str
    model: str
    scheme: str
    eval: str
    rows: int  # its metric rows that were written whole
    torn_line: int | None  # the torn line holding the rest of it, if any
    last: bool  # it is the end of the file

    def describe(self) -> str:
        what = " ".join(x for x in (self.model, self.scheme, self.eval) if x)
        ident = f"run {self.run_id[:16]}" if self.run_id else f"a run (attempt {self.attempt[:12] or 'unreadable'})"
        return f"{ident} ({what})" if what else ident


@dataclass
class StoreView:
    """What a reader sees: the rows of counted runs, their completion records, and failures."""

    rows: list[dict[str, Any]]
    complete: dict[str, dict[str, Any]]  # run_id -> latest completion record
    failed: dict[str, dict[str, Any]]  # run_id -> latest failure record (runs whose latest attempt failed)
    torn_lines: int
    uncounted_rows: int  # rows of attempts without a completion record (crashed or superseded)
    torn: list[TornLine] = field(default_factory=list)
    cut_off: list[CutOffRun] = field(default_factory=list)  # runs lost to a crash, not yet re-run

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows)


_FIELD = re.compile('"(' + "|".join(IDENTITY_KEYS) + r')": "([^"\\]*)"')


def _fragment_fields(raw: bytes) -> dict[str, str]:
    """The identity keys readable in a torn line (the first occurrence of each)."""
    out: dict[str, str] = {}
    for key, value in _FIELD.findall(raw.decode("utf-8", "replace")):
        out.setdefault(key, value)
    return out


def read_records(path: Path) -> StoreView:
    records, numbers, torn = [], [], []
    if path.is_file():
        with open(path, "rb") as fh:
            lines = fh.read().split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()  # the newline that ends the last whole line
        for n, raw in enumerate(lines, 1):
            try:
                rec = json.loads(raw)
            except ValueError:
                rec = None
            if isinstance(rec, dict) and "type" in rec and "run_id" in rec:
                records.append(rec)
                numbers.append(n)
            elif raw.strip():
                torn.append(TornLine(n, n == len(lines), _fragment_fields(raw)))
    latest: dict[str, dict] = {}
    by_attempt: dict[tuple[str, str], list[dict]] = {}
    for rec in records:
        if rec["type"] == "metric":
            by_attempt.setdefault((rec["run_id"], rec["attempt"]), []).append(rec)
        elif rec["type"] in ("complete", "failed"):
            latest[rec["run_id"]] = rec
    complete, failed, rows, counted = {}, {}, [], 0
    for run_id, rec in latest.items():
        if rec["type"] == "failed":
            failed[run_id] = rec
            continue
        run_rows = by_attempt.get((run_id, rec["attempt"]), [])
        if len(run_rows) != rec["rows"]:
            continue  # cannot happen with one write per run; never count an inconsistent run
        complete[run_id] = rec
        rows.extend(run_rows)
        counted += len(run_rows)
    total_rows = sum(len(v) for v in by_attempt.values())
    view = StoreView(rows, complete, failed, len(torn), total_rows - counted, torn)
    view.cut_off = _cut_off(records, numbers, torn, set(complete) | set(failed))
    return view


def _cut_off(records: list[dict], lines: list[int], torn: list[TornLine], finished: set[str]) -> list[CutOffRun]:
    """Runs a crash cut off: attempts with metric rows or a torn line but no completion or failure
    record of that attempt, whose run no record finishes. A torn line naming no attempt belongs to
    the unfinished attempt on the line before it, if any (a completion record cut short)."""
    ended = {rec["attempt"] for rec in records if rec["type"] in ("complete", "failed")}
    found: dict[str, dict] = {}  # attempt (or "line N") -> what is known of it
    on_line: dict[int, str] = {}  # line -> the unfinished attempt whose metric row it holds
    for n, rec in zip(lines, records):
        if rec["type"] == "metric" and rec.get("attempt") not in ended:
            f = found.setdefault(rec.get("attempt", ""), {k: str(rec.get(k) or "") for k in IDENTITY_KEYS})
            f["rows"] = f.get("rows", 0) + 1
            on_line[n] = rec.get("attempt", "")
    for t in torn:
        attempt = t.fields.get("attempt") or on_line.get(t.line - 1) or f"line {t.line}"
        if attempt in ended:
            continue
        f = found.setdefault(attempt, {"attempt": t.fields.get("attempt", "")})
        for k, v in t.fields.items():
            if not f.get(k):
                f[k] = v
        f["torn"] = t
    out = []
    for f in found.values():
        if f.get("run_id") and f["run_id"] in finished:
            continue  # a later attempt finished the run, or failed it (then it is reported as failed)
        t = f.get("torn")
        out.append(
            CutOffRun(
                f.get("run_id", ""),
                f.get("attempt", ""),
                f.get("model", ""),
                f.get("scheme", ""),
                f.get("eval", ""),
                f.get("rows", 0),
                t.line if t else None,
                bool(t and t.last),
            )
        )
    return out
