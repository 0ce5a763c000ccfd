"""What ``evalkit report`` shows of the generation evaluation (declared in its ReportSpec): per task (and
filter) its accuracy, for MRCR tasks the AUC across lengths and the % recovery, the paired change from the baseline, flips both ways, McNemar's p, pass@k and the
first divergence, and for a traces file its decode KL, as summary-frame columns ``<task>/gen_<stat>``
(with ``_lo`` / ``_hi`` bounds), and per task the failure gates' rates (``<task>/gen_fail_<gate>``,
``<task>/gen_fail_any``: :mod:`evalkit.evals.generation.gates`). The budget criterion ``--max-task-drop``
reads ``<task>/gen_acc_delta``, ``--max-failure-rate`` reads ``<task>/gen_fail_any``.
"""

from __future__ import annotations

import pandas as pd

from evalkit.evals.generation.gates import ANY, GATES
from evalkit.units import value_with_interval

COLUMNS = {  # row metric -> summary column suffix
    "accuracy": "gen_acc",
    "accuracy_delta": "gen_acc_delta",
    "flip_right_to_wrong": "gen_r2w",
    "flip_wrong_to_right": "gen_w2r",
    "mcnemar_p": "gen_mcnemar_p",
    "divergence_share": "gen_diverged",
    "first_divergence": "gen_first_div",
    "kl_mean": "gen_kl",
    **{f"fail_{g}": f"gen_fail_{g}" for g in (*GATES, ANY)},
    "mrcr_auc": "gen_mrcr_auc",
    "mrcr_auc_delta": "gen_mrcr_auc_delta",
    "mrcr_recovery": "gen_mrcr_recovery",
}


def _prefix(labels: dict) -> str:
    filt = labels.get("filter", "none") or "none"
    return labels["task"] if filt == "none" else f"{labels['task']}[{filt}]"


def frame(rows: pd.DataFrame, slot) -> None:
    """Each task's (and the traces') unbucketed rows into ``slot(model, scheme)``."""
    for _, r in rows.iterrows():
        labels = r["labels"] or {}
        if "task" not in labels or "bucket" in labels:
            continue
        stat = str(r["metric"]).split("/", 1)[1].split("[", 1)[0]
        suffix = COLUMNS.get(stat) or (f"gen_{stat}" if stat.startswith("pass@") else None)
        if suffix is None:
            continue
        out = slot(r["model"], r["scheme"])
        key = f"{_prefix(labels)}/{suffix}"
        out[key], out[f"{key}_lo"], out[f"{key}_hi"] = r["value"], r["ci_low"], r["ci_high"]


def _missing(v) -> bool:
    return v is None or pd.isna(v)


def display(r: dict, base: bool) -> dict[str, str]:
    """``{heading: text}`` per task: accuracy [CI], Δ points [CI], flips right->wrong / wrong->right in %,
    McNemar p, pass@k, first divergence (median token, share of item-samples diverging)."""
    heads = ("/gen_acc", "/gen_diverged", f"/gen_fail_{ANY}")
    prefixes = list(dict.fromkeys(c.rsplit("/", 1)[0] for c in r if str(c).endswith(heads)))
    out = {}
    for t in prefixes:
        if not _missing(r.get(f"{t}/gen_acc")):
            out[f"{t} acc"] = value_with_interval(r, f"{t}/gen_acc", 1.0, ".3f")
        for key in (k for k in r if str(k).startswith(f"{t}/gen_pass@") and not str(k).endswith(("_lo", "_hi"))):
            out[f"{t} {key.rsplit('_', 1)[1]}"] = value_with_interval(r, key, 1.0, ".3f")
        if base:
            continue
        if not _missing(r.get(f"{t}/gen_acc_delta")):
            out[f"{t} Δacc pts"] = value_with_interval(r, f"{t}/gen_acc_delta", 100.0, "+.1f")
            out[f"{t} r→w/w→r %"] = f"{100 * r[f'{t}/gen_r2w']:.1f}/{100 * r[f'{t}/gen_w2r']:.1f}"
            out[f"{t} McNemar p"] = format(r[f"{t}/gen_mcnemar_p"], ".3g")
        if not _missing(r.get(f"{t}/gen_diverged")):
            first = r.get(f"{t}/gen_first_div")
            head = "-" if _missing(first) else format(first, ".0f")
            out[f"{t} first div."] = f"{head} ({100 * r[f'{t}/gen_diverged']:.0f}% diverge)"
        if not _missing(r.get(f"{t}/gen_kl")):
            out[f"{t} KL"] = value_with_interval(r, f"{t}/gen_kl", 1.0, ".3g")
        if not _missing(r.get(f"{t}/gen_fail_{ANY}")):
            out[f"{t} failures %"] = value_with_interval(r, f"{t}/gen_fail_{ANY}", 100.0, ".1f") + _which(r, t)
        if not _missing(r.get(f"{t}/gen_mrcr_auc")):
            out[f"{t} MRCR AUC"] = value_with_interval(r, f"{t}/gen_mrcr_auc", 1.0, ".3f")
        if not _missing(r.get(f"{t}/gen_mrcr_recovery")):
            out[f"{t} recovery %"] = value_with_interval(r, f"{t}/gen_mrcr_recovery", 1.0, ".1f")
    return out


def _which(r: dict, t: str) -> str:
    """The gates that fired, with their rates in %, e.g. `` (collapse 5.0, runaway 5.0)``; empty when none."""
    fired = [(g, r.get(f"{t}/gen_fail_{g}")) for g in GATES]
    fired = [f"{g} {100 * v:.1f}" for g, v in fired if not _missing(v) and v > 0]
    return f" ({', '.join(fired)})" if fired else ""


def notes(frame: pd.DataFrame) -> list[str]:
    """What the generation columns are, when the frame has any."""
    if not any(str(c).endswith(("/gen_acc", "/gen_diverged", f"/gen_fail_{ANY}")) for c in frame.columns):
        return []
    return [
        "generation: acc = share of item-samples answered right (95 % Wilson, the item as the unit); Δacc = "
        "paired change from the baseline in points (95 % Tango score interval, the item as the unit: never "
        "zero-width); r→w/w→r = item-samples whose answer flipped each way; McNemar p = exact test of those flips "
        "(one sample per item; with several, the exact sign-flip test over items); first div. = median index of the first generated token that differs from the "
        "baseline's, over the item-samples that diverge (and their share); traces KL = mean KL(baseline || scheme) "
        "along the baseline's own continuation; failures = share of item-samples on which a failure gate fires "
        "(the scheme's generation repeats tokens or n-grams, ends at its first token, collapses to one token, "
        "runs to the output budget or holds invalid UTF-8 where the baseline's does not; 95 % Wilson, the item "
        "as the unit), the gates that fired in brackets"
        "along the baseline's own continuation; MRCR AUC = trapezoid area under pass@1 (openai/mrcr's grade) "
        "against each length bucket's upper edge, divided by the span, and recovery = 100 x AUC / the "
        "baseline's (evalkit/evals/generation/mrcr.py)"
    ]
