"""When does a scheme's greedy generation first leave the baseline's? Censored-median statistics.

For each sequence the decode evaluation records, step by step, whether the scheme's argmax equals
the baseline's greedy token while the scheme is fed the baseline's own greedy continuation. As long
as the two agree, the scheme's free-running greedy generation *is* that continuation (same inputs,
same cache contents), so the first disagreement is exactly the first token at which the scheme's
own greedy generation would differ: one teacher-forced pass gives the free-running answer.

``first_divergence`` of a sequence is the number of generated tokens before the first differing
one: 0 when the very first generated token (the prefill's prediction) differs, ``T`` when all
``T`` generated tokens are identical. ``T`` is a *censored* value ("T or later"): we stopped
looking at T. Every sequence is censored at the same T (fixed type-I censoring), so:

* the median is the Kaplan-Meier median, the smallest step by which at least half of the
  sequences have diverged; with all censoring at T it is the order statistic ``X_(ceil(n/2))``
  (the lower median), which never depends on what a censored value really is. When half or more
  of the sequences stay identical through T, the median is itself censored: reported as ``T``
  with ``censored: true`` ("T or later");
* its 95 % interval is the distribution-free order-statistic interval ``[X_(l), X_(n+1-l)]`` with
  the largest ``l`` whose coverage ``1 - 2 P(Binomial(n, 1/2) <= l - 1)`` is at least 95 % (exact,
  no resampling). It exists from n = 6 sequences on (coverage 96.9 %); with fewer there is none
  and none is reported. An upper bound equal to ``T`` means "T or later";
* the share of sequences still identical at T, with a 95 % Wilson interval
  (:func:`evalkit.evals.stats.binomial_ci`).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from evalkit.evals.stats import binomial_ci


def first_divergence(agree: np.ndarray) -> np.ndarray:
    """Per row of ``agree`` (n, T) bool: index of the first False, or T when the row is all True."""
    agree = np.asarray(agree, dtype=bool)
    n, t = agree.shape
    differs = ~agree
    return np.where(differs.any(axis=1), differs.argmax(axis=1), t).astype(np.int64)


def median_interval(n: int, confidence: float = 0.95) -> tuple[int, int, float] | None:
    """1-based ranks (l, u) of the order-statistic interval for a median and its exact coverage."""
    best = None
    for low in range(1, n // 2 + 1):
        coverage = 1 - 2 * float(stats.binom.cdf(low - 1, n, 0.5))
        if coverage >= confidence:
            best = (low, n + 1 - low, coverage)
    return best


def censored_median(
    steps: np.ndarray, horizon: int, confidence: float = 0.95
) -> tuple[float, float | None, float | None, dict]:
    """(median, low, high, info) of first-divergence steps censored at ``horizon`` (see module doc)."""
    x = np.sort(np.asarray(steps, dtype=np.int64))
    n = len(x)
    if n == 0:
        return math.nan, None, None, {}
    median = float(x[math.ceil(n / 2) - 1])
    info = {
        "censored": bool(median >= horizon),
        "horizon": horizon,
        "median": "Kaplan-Meier (lower) median",
        "interval": "exact order-statistic interval for the median (none below 6 sequences)",
    }
    ranks = median_interval(n, confidence)
    if ranks is None:
        return median, None, None, info
    low, high, coverage = ranks
    info.update(coverage=round(coverage, 4), ranks=[low, high], upper_censored=bool(x[high - 1] >= horizon))
    return median, float(x[low - 1]), float(x[high - 1]), info


def identical_share(steps: np.ndarray, horizon: int) -> tuple[float, float, float, int]:
    """(share of sequences identical through ``horizon``, Wilson low, high, count)."""
    steps = np.asarray(steps)
    k, n = int((steps >= horizon).sum()), len(steps)
    low, high = binomial_ci(k, n)
    return k / n, low, high, k
