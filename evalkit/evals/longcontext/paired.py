"""Paired per-item comparison of a scheme's scores with the baseline's, on the same items.

One item is one lm-eval document at one context length, scored by its task's own metric (RULER: the
share of expected values found; LongBench v2: 0/1 accuracy). For a set of items (one task at one
length, a task over all its lengths, a group of tasks) :func:`compare` gives

* the scheme's mean score and the baseline's, each with a 95 % interval: Wilson when every score is
  0 or 1 (:func:`evalkit.evals.stats.binomial_ci`), else Student's t;
* the paired difference ``mean(scheme - baseline)`` with a 95 % percentile interval from a paired
  bootstrap over items (items resampled with replacement, both scores of an item kept together;
  seeded), and a two-sided p-value:

  - 0/1 scores: the **exact McNemar test**, a two-sided binomial test of ``b`` right-to-wrong items
    against ``b + c`` discordant items at 1/2 (``scipy.stats.binomtest``); no discordant item: p = 1;
  - other scores: the **paired bootstrap**, ``p = min(1, 2 min(P*(d <= 0), P*(d >= 0)))`` over the
    resampled mean differences ``d``; every difference 0: p = 1;

* the **discordance** (share of items whose score changed; for 0/1 scores ``(b + c) / n``, the ``p_disc``
  that sizes a paired design, :mod:`evalkit.planning.decision`), with its Wilson interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
SEED = 0


@dataclass(frozen=True)
class Paired:
    """A scheme's items against the baseline's (see the module docstring)."""

    n: int
    binary: bool
    score: float
    score_ci: tuple[float, float]
    baseline: float
    baseline_ci: tuple[float, float]
    diff: float
    diff_ci: tuple[float, float]
    p_value: float
    test: str  # "mcnemar_exact" | "paired_bootstrap"
    right_to_wrong: int  # 0/1 scores: b (baseline right, scheme wrong); else items whose score fell
    wrong_to_right: int  # c; else items whose score rose
    discordance: float
    discordance_ci: tuple[float, float]


def mean_interval(values: np.ndarray, binary: bool) -> tuple[float, float]:
    """95 % interval of the mean of ``values``: Wilson for 0/1 values, else Student's t (a point for n < 2)."""
    from evalkit.evals.stats import binomial_ci

    n = len(values)
    if binary:
        return binomial_ci(int(values.sum()), n)
    mean = float(values.mean())
    if n < 2 or float(values.std()) == 0.0:
        return mean, mean
    from scipy import stats

    low, high = stats.t.interval(0.95, n - 1, loc=mean, scale=float(stats.sem(values)))
    return float(low), float(high)


def bootstrap_means(d: np.ndarray, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """The mean of ``d`` over ``resamples`` resamples of its items with replacement (seeded)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(d), size=(resamples, len(d)))
    return d[idx].mean(axis=1)


def compare(scheme, baseline, resamples: int = RESAMPLES, seed: int = SEED) -> Paired:
    """Paired statistics of ``scheme`` against ``baseline`` scores, item i against item i."""
    from evalkit.evals.stats import binomial_ci, mcnemar_exact

    s, b = np.asarray(scheme, np.float64), np.asarray(baseline, np.float64)
    if s.shape != b.shape or s.ndim != 1 or len(s) == 0:
        raise ValueError("paired scores need the same items, at least one")
    n = len(s)
    binary = bool(np.isin(s, (0.0, 1.0)).all() and np.isin(b, (0.0, 1.0)).all())
    d = s - b
    fell, rose = int((d < 0).sum()), int((d > 0).sum())
    boot = bootstrap_means(d, resamples, seed)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    if binary:
        p, test = mcnemar_exact(fell, rose), "mcnemar_exact"
    elif not d.any():
        p, test = 1.0, "paired_bootstrap"
    else:
        p = min(1.0, 2 * min(float((boot <= 0).mean()), float((boot >= 0).mean())))
        test = "paired_bootstrap"
    changed = fell + rose
    return Paired(
        n=n,
        binary=binary,
        score=float(s.mean()),
        score_ci=mean_interval(s, binary),
        baseline=float(b.mean()),
        baseline_ci=mean_interval(b, binary),
        diff=float(d.mean()),
        diff_ci=(float(lo), float(hi)),
        p_value=p,
        test=test,
        right_to_wrong=fell,
        wrong_to_right=rose,
        discordance=changed / n,
        discordance_ci=binomial_ci(changed, n),
    )


def finite(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else x
