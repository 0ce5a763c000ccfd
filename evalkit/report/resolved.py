"""The runs ``sweep --resolve`` grew, as the report reads them: the latest stage counts, at its level.

``sweep --resolve`` (:mod:`evalkit.cli.resolve`) keeps a ledger in the store, ``resolve.json``:
the alpha and the number of growth stages it planned, and per (model, scheme, evaluation) it grew,
the knob it doubled (``max_windows``, ``sequences``, ``samples``, ``limit``), the criteria that
straddled, and each stage's value of the knob and run id. The stage runs are ordinary runs of the
store (their parameters differ from the grid's only in the knob), so a killed resolve loses nothing.

Here, for each ledger entry, the latest stage whose run completed replaces the entry's other stage
runs in the rows (one run per model, scheme and evaluation, as everywhere in the report), and every
interval of that run is re-derived at the look's level ``1 - alpha / (stages + 1)``
(:mod:`evalkit.planning.sequential`; a KL mean's high end skew-calibrated at that level, as
:mod:`evalkit.report.kl_bound` does at 95 % for every other KL row); an interval that cannot be
re-derived is dropped (its criterion reads unresolved), and its row's ``info["ci"]`` says which. A note
under the table names each grown row, its stage, the knob's value and the level.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from evalkit.planning.sequential import is_skewed_kl_row, look_level
from evalkit.report import kl_bound

LEDGER = "resolve.json"


def ledger_path(folder: str | Path) -> Path:
    return Path(folder) / LEDGER


def read_ledger(folder: str | Path) -> dict | None:
    """The store's resolve ledger, or None when it has none."""
    path = ledger_path(folder)
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def write_ledger(folder: str | Path, ledger: dict) -> None:
    """Write the ledger whole, then rename it into place (a kill leaves the old one or the new one)."""
    path = ledger_path(folder)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(ledger, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def latest_stage(entry: dict, complete) -> dict | None:
    """The entry's stage with the highest number whose run completed (None: none did)."""
    done = [s for s in entry["stages"] if s["run_id"] in complete]
    return max(done, key=lambda s: s["stage"]) if done else None


def apply(rows: list[dict], complete, folder: str | Path) -> tuple[list[dict], list[str], set[str]]:
    """(the rows with each grown run's latest stage counted at its level, a note per grown row, the run ids
    of the earlier stages left out)."""
    from evalkit.planning.sequential import relevel

    ledger = read_ledger(folder)
    if not ledger or not ledger.get("entries"):
        return rows, [], set()
    level = look_level(int(ledger["stages"]), float(ledger["alpha"]))
    drop, latest, notes = set(), {}, []
    for entry in ledger["entries"]:
        last = latest_stage(entry, complete)
        if last is None:
            continue
        drop |= {s["run_id"] for s in entry["stages"] if s["run_id"] != last["run_id"]}
        latest[last["run_id"]] = (entry, last)
    out, lost = [], {}
    for r in rows:
        if r["run_id"] in drop:
            continue
        if r["run_id"] in latest and r.get("ci_low") is not None and is_skewed_kl_row(r):
            r = kl_bound.skewed(r, level)  # the report's KL bound, at the look's level
            if r.get("ci_high") is None:
                lost.setdefault(r["run_id"], []).append(r["metric"])
            else:
                r["info"]["ci"] += f"; re-derived at {100 * level:.2f} % (resolve stage)"
        elif r["run_id"] in latest and r.get("ci_low") is not None:
            ci = relevel(r, level)
            info = dict(r.get("info") or {})
            if ci is None:
                lost.setdefault(r["run_id"], []).append(r["metric"])
                info["ci"] = f"{info.get('ci', '')}; not re-derived at the resolve level {100 * level:.2f} %: dropped"
                r = {**r, "ci_low": None, "ci_high": None, "info": info}
            else:
                info["ci"] = f"{info.get('ci', '')}; re-derived at {100 * level:.2f} % (resolve stage)"
                r = {**r, "ci_low": ci[0], "ci_high": ci[1], "info": info}
        out.append(r)
    k = int(ledger["stages"])
    for run_id, (entry, last) in latest.items():
        missing = lost.get(run_id)
        dropped = f"; intervals not re-derivable, dropped: {', '.join(sorted(set(missing)))}" if missing else ""
        notes.append(
            f"resolve: {entry['scheme']} {entry['eval']} is its stage {last['stage']} of {k} "
            f"({entry['knob']} {last['n']}); its intervals are at {100 * level:.2f} % (alpha {ledger['alpha']:g} "
            f"split over {k + 1} looks, Bonferroni; see docs/statistics.md#runs-that-resolve){dropped}"
        )
    return out, notes, drop
