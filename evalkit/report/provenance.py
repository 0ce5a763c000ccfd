"""What a reader of a report should know about where its rows came from: which code and which platforms
computed the counted runs (a note when more than one did, with the command that recomputes the others), how
many older runs were superseded, and a WARNING per run a crash cut off, with the command that re-runs it.

Apart from :mod:`evalkit.report.results`, which reads a store into :class:`~evalkit.report.results.Results`:
these are the notes the report prints under its tables, read from that value.
"""

from __future__ import annotations

import json
from pathlib import Path

from evalkit.report.results import RESULTS_FILE, UNRECORDED, Results


def provenance_notes(results: Results) -> list[str]:
    """Notes for a reader about which code computed the counted runs (empty when one code did). A run through
    a bumped component (a codec family's or an evaluation's numerics version) carries an identity of its own by
    design: code is mixed when runs through the same components carry different identities."""
    notes = []
    counts: dict[str, int] = {}
    by_parts: dict[str, set] = {}
    parts_of = results.components
    for run_id, code in results.codes.items():
        counts[code] = counts.get(code, 0) + 1
        by_parts.setdefault(parts_of.get(run_id, ""), set()).add(code)
    if any(len(codes) > 1 for codes in by_parts.values()):
        parts = ", ".join(
            f"{code[:15] if code != UNRECORDED else code}: {n} runs"
            for code, n in sorted(counts.items(), key=lambda kv: -kv[1])
        )
        notes.append(
            f"MIXED CODE: these runs were computed by {len(counts)} versions of evalkit's code ({parts}), so "
            f"rows may not be comparable; resume the sweep (`python -m evalkit sweep GRID --out {results.folder}`) "
            "with the current code to recompute the others"
        )
    elif counts and UNRECORDED in counts:
        notes.append(
            "these runs carry no code identity (written by an evalkit that did not record one): resume the "
            f"sweep (`python -m evalkit sweep GRID --out {results.folder}`) to recompute them with a recorded one"
        )
    platforms: dict[str, int] = {}
    for where in results.platforms.values():
        platforms[where] = platforms.get(where, 0) + 1
    if len(platforms) > 1:
        parts = "; ".join(f"{where}: {n} runs" for where, n in sorted(platforms.items(), key=lambda kv: -kv[1]))
        notes.append(
            f"MIXED PLATFORM: these runs were computed on {len(platforms)} platforms ({parts}); a quantized "
            "forward amplifies the float rounding that differs between them, so differences between rows of "
            "different platforms are partly numerical noise"
        )
    notes += results.merge_notes
    if results.superseded:
        notes.append(
            f"{len(results.superseded)} older runs of the same specs (other code or libraries) are superseded "
            "by newer ones and not shown"
        )
    return notes


def resume_command(folder: Path) -> str:
    """The command that re-runs a store's missing runs: its sweep (a run counts as done only by its
    completion record), or the ``evalkit run`` that wrote it."""
    import shlex

    try:
        spec = json.loads((Path(folder) / "spec.json").read_text())
    except (OSError, ValueError):
        spec = {}
    if spec.get("grid_file") == "evalkit run":
        return f"the same `python -m evalkit run ... --out {shlex.quote(str(folder))}` again"
    grid = spec.get("grid_file")
    if not grid or not Path(grid).is_file():
        grid = str(Path(folder) / "grid.yaml") if (Path(folder) / "grid.yaml").is_file() else "GRID"
    return f"`python -m evalkit sweep {shlex.quote(str(grid))} --out {shlex.quote(str(folder))}`"


def cut_off_warnings(results: Results) -> list[str]:
    """A WARNING per run a crash cut off (rows or a torn line of results.jsonl, no completion record):
    the run is in no table until it is re-run, and the line says with which command."""
    out = []
    for folder, run in results.cut_off:
        where = (
            f"the torn last line ({run.torn_line}) of {folder / RESULTS_FILE}"
            if run.last
            else f"a torn line ({run.torn_line}) of {folder / RESULTS_FILE}"
            if run.torn_line
            else f"{run.rows} rows of {folder / RESULTS_FILE} without a completion record"
        )
        out.append(
            f"WARNING: {run.describe()} was cut off by a crash while its records were written ({where}): "
            f"it is not in this table. Resume with {resume_command(folder)}: it re-runs every run without a "
            "completion record"
        )
    return out
