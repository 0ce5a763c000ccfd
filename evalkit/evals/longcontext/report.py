"""What ``evalkit report`` shows of the longcontext evaluation: per task (or group), its score over all
lengths and its paired difference from the baseline with the test's p-value, as summary-frame columns
``<task>/score``, ``<task>/score_diff`` (``_lo`` / ``_hi`` bounds) and ``<task>/p_value``; per length
they stay in the store (``labels.length``)."""

from __future__ import annotations

import pandas as pd

STATS = ("score", "score_diff", "p_value")


def _overall(labels: dict, task_rows: set) -> bool:
    return labels.get("length") == "all" or (labels.get("task"), "all") not in task_rows


def frame(rows: pd.DataFrame, slot) -> None:
    """Each task's overall score, difference and p-value into ``slot(model, scheme)``."""
    have_all = {((r["labels"] or {}).get("task"), (r["labels"] or {}).get("length")) for _, r in rows.iterrows()}
    for _, r in rows.iterrows():
        task, _, stat = str(r["metric"]).rpartition("/")
        if stat not in STATS or not _overall(r["labels"] or {}, have_all):
            continue
        out = slot(r["model"], r["scheme"])
        key = f"{task}/{stat}"
        out[key], out[f"{key}_lo"], out[f"{key}_hi"] = r["value"], r["ci_low"], r["ci_high"]


def _missing(v) -> bool:
    return v is None or pd.isna(v)


def display(r: dict, base: bool) -> dict[str, str]:
    """``{heading: text}``: each task's score, and (not on the baseline row) its change in points with p."""
    tasks = list(dict.fromkeys(c.rsplit("/", 1)[0] for c in r if c.endswith("/score")))
    out = {}
    for task in tasks:
        v = r.get(f"{task}/score")
        out[f"{task} score"] = "" if _missing(v) else format(v, ".3f")
        p = r.get(f"{task}/p_value")
        d, lo, hi = (r.get(f"{task}/score_diff"), r.get(f"{task}/score_diff_lo"), r.get(f"{task}/score_diff_hi"))
        if base or _missing(d):
            out[f"{task} Δ pts"] = ""
            continue
        text = f"{100 * d:+.1f}"
        if not _missing(lo) and not _missing(hi):
            text += f" [{100 * lo:+.1f}, {100 * hi:+.1f}]"
        out[f"{task} Δ pts"] = text + ("" if _missing(p) else f" p={p:.2g}")
    return out
