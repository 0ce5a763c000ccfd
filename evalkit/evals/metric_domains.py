"""The values each evaluation's metrics can take, and an interval held inside them.

A Student's t interval is symmetric about the mean, so at a handful of windows or sequences it can reach
past what the metric can be: a KL below 0, a perplexity below 0, a share above 1. Clipping the interval at
the bound keeps every value it covered that the metric can take, so its coverage is unchanged, and nothing
prints an impossible number. The stores keep the evaluation's interval as computed; the report clips on
reading (:func:`evalkit.report.domains.clip_to_domains`) and ``evalkit run``'s table as it prints
(:mod:`evalkit.sweep.run_table`), both by :func:`clip_interval`.
"""

from __future__ import annotations

import math

NON_NEGATIVE = (0.0, math.inf)
SHARE = (0.0, 1.0)

DOMAINS: dict[str, tuple[float, float]] = {  # metric name (lm-eval's: the part after "TASK/") -> [low, high]
    "ppl": NON_NEGATIVE,
    "kl_mean": NON_NEGATIVE,
    "kl_lower_bound": NON_NEGATIVE,
    "free_kl_mean": NON_NEGATIVE,
    "free_kl_lower_bound": NON_NEGATIVE,
    "gold_loglik_abs_delta": NON_NEGATIVE,
    "ppl_delta_rel": (-1.0, math.inf),  # a perplexity ratio minus 1
    "top1_agreement": SHARE,
    "identical_share": SHARE,
    "accuracy": SHARE,
    "acc": SHARE,
    "acc_norm": SHARE,
    "flip_rate": SHARE,
    "flip_right_to_wrong": SHARE,
    "flip_wrong_to_right": SHARE,
    "flip_wrong_to_wrong": SHARE,
    "mrcr_pass@1_by_length": SHARE,  # MRCR's mean grade per length bucket (evals/generation/mrcr.py)
    "mrcr_auc": SHARE,
    "mrcr_auc_delta": (-1.0, 1.0),
    "mrcr_recovery": NON_NEGATIVE,  # % of the baseline's AUC
}


def domain(metric: str) -> tuple[float, float] | None:
    """``metric``'s [low, high], or None where no bound is known for it."""
    return DOMAINS.get(str(metric).rsplit("/", 1)[-1])


def clip_interval(metric: str, low: float, high: float) -> tuple[float, float]:
    """One interval held inside ``metric``'s domain (unchanged where no bound is known)."""
    bounds = domain(metric)
    if bounds is None:
        return low, high
    return min(max(low, bounds[0]), bounds[1]), max(min(high, bounds[1]), bounds[0])
