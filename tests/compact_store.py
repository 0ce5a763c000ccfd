"""``python -m tests.compact_store DIR [DIR ...]``: drop a published store's superseded runs.

A resumed sweep that recomputes runs of other code (a bumped component's runs,
:func:`evalkit.sweep.code_identity.components`) keeps the older run of each spec in ``results.jsonl``; the
report leaves it out (:func:`evalkit.report.results.supersede`). A published store holds exactly its grid's
counted runs, so after such a partial re-make this removes every record of the superseded runs (their
metric rows and completion records), and nothing else.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from evalkit.report.results import RESULTS_FILE, supersede


def compact(folder: Path) -> tuple[int, int]:
    """(superseded runs dropped, records kept) of the store in ``folder``."""
    path = Path(folder) / RESULTS_FILE
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]
    complete = {r["run_id"]: r for r in records if r["type"] == "complete"}
    _, old = supersede(complete)
    keep = [line for line, r in zip(lines, records) if r.get("run_id") not in old]
    path.write_text("\n".join(keep) + "\n")
    return len(old), len(keep)


if __name__ == "__main__":
    for name in sys.argv[1:]:
        dropped, kept = compact(Path(name))
        print(f"{name}: {dropped} superseded runs dropped, {kept} records kept")
