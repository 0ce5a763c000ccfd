"""What ``evalkit report`` shows of the lmeval evaluation (declared in its ReportSpec): per task,
its first score lm-eval reports (``acc``, ``acc_norm``, ``exact_match``, ``word_perplexity``) and
its flip rates against the baseline, as summary-frame columns ``<task>/<stat>`` (with ``_lo`` /
``_hi`` interval bounds), shown as ``<task> <score>`` and ``<task> flips %``."""

from __future__ import annotations

import pandas as pd

SCORES = ("acc", "acc_norm", "exact_match", "word_perplexity")  # the first a task has is its column
FLIPS = ("flip_rate", "flip_right_to_wrong", "flip_wrong_to_right", "flip_wrong_to_wrong")


def frame(rows: pd.DataFrame, slot) -> None:
    """Each task's scores and flip rates (filter ``none``) into ``slot(model, scheme)``."""
    for _, r in rows.iterrows():
        task, _, stat = str(r["metric"]).rpartition("/")
        if not task or (r["labels"] or {}).get("filter", "none") not in ("none", None):
            continue
        if stat in SCORES or stat in FLIPS:
            out = slot(r["model"], r["scheme"])
            key = f"{task}/{stat}"
            out[key], out[f"{key}_lo"], out[f"{key}_hi"] = r["value"], r["ci_low"], r["ci_high"]


def _missing(v) -> bool:
    return v is None or pd.isna(v)


def _with_interval(r: dict, key: str, fmt: str) -> str:
    v = r.get(key)
    if _missing(v):
        return ""
    text = format(v, fmt)
    lo, hi = r.get(f"{key}_lo"), r.get(f"{key}_hi")
    if not _missing(lo) and not _missing(hi):
        text += f" [{format(lo, fmt)}, {format(hi, fmt)}]"
    return text


def display(r: dict, base: bool) -> dict[str, str]:
    """``{heading: text}`` for one summary row: each task's score with its interval, and its flips in %."""
    tasks = list(dict.fromkeys(c.rsplit("/", 1)[0] for c in r if "/" in c and not c.endswith(("_lo", "_hi"))))
    out = {}
    for task in tasks:
        score = next((s for s in SCORES if f"{task}/{s}" in r and not _missing(r[f"{task}/{s}"])), None)
        if score:
            out[f"{task} {score}"] = _with_interval(
                r, f"{task}/{score}", ".2f" if score.endswith("perplexity") else ".3f"
            )
        if f"{task}/flip_rate" in r:
            flips = r[f"{task}/flip_rate"]
            out[f"{task} flips %"] = "" if base or _missing(flips) else format(100 * flips, ".1f")
    return out
