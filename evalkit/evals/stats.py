"""Confidence intervals and paired tests shared by the evaluations.

Scheme-vs-baseline differences are *paired*: both are measured on the same units (perplexity
windows, retrieval samples), so intervals resample units, not tokens, and keep each unit's pair
together. That respects the correlation between tokens of one window, which a per-token
bootstrap would ignore and so report intervals that are too narrow.

- :func:`paired_bootstrap_ci`: percentile interval of any statistic of several per-unit arrays,
  by ``scipy.stats.bootstrap(paired=True)`` with a fixed seed and a stated number of resamples.
  Percentile (not BCa) because BCa is undefined for a degenerate sample, and an identity scheme
  (every difference exactly zero) must give exactly [0, 0].
- :func:`paired_pvalue`: two-sided Wilcoxon signed-rank test of paired per-unit values
  (``scipy.stats.wilcoxon``; no normality assumption). All differences zero: p = 1.
- :func:`binomial_ci`: interval for a proportion k/n (Wilson score by default, or exact
  Clopper-Pearson) via ``scipy.stats.binomtest``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0
PVALUE_TEST = "wilcoxon signed-rank (two-sided, paired over windows)"


def paired_bootstrap_ci(
    statistic: Callable[..., np.ndarray],
    arrays: Sequence[np.ndarray],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic(*arrays)`` resampling units (paired).

    ``arrays`` are per-unit values of equal length n; ``statistic`` must accept arrays with the
    units on the last axis (it is called vectorized, e.g. ``x.sum(-1) / n.sum(-1)``) and return
    one value per leading index. Fewer than two units: (nan, nan), as no interval exists.
    """
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    n = len(arrays[0])
    if any(len(a) != n for a in arrays):
        raise ValueError("paired arrays must have the same length")
    if n < 2:
        return (math.nan, math.nan)
    point = float(statistic(*arrays))
    if all(np.all(a == a[0]) for a in arrays):
        return (point, point)  # every resample equals the sample

    def vectorized(*data, axis=-1):
        return statistic(*[np.moveaxis(d, axis, -1) for d in data])

    res = stats.bootstrap(
        tuple(arrays),
        vectorized,
        n_resamples=n_resamples,
        paired=True,
        vectorized=True,
        axis=-1,
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (np.isfinite(low) and np.isfinite(high)):
        return (math.nan, math.nan)
    return (low, high)


def paired_pvalue(x: np.ndarray, y: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p-value that paired values ``x`` and ``y`` differ.

    1.0 when every pair is equal; nan with fewer than two pairs (no test possible).
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) != len(y):
        raise ValueError("paired arrays must have the same length")
    d = x - y
    if len(d) < 2:
        return math.nan
    if np.all(d == 0):
        return 1.0
    return float(stats.wilcoxon(x, y, zero_method="wilcox", alternative="two-sided").pvalue)


def binomial_ci(k: int, n: int, confidence: float = 0.95, method: str = "wilson") -> tuple[float, float]:
    """Interval for the proportion k/n: ``method`` 'wilson' (default) or 'exact' (Clopper-Pearson)."""
    if n <= 0:
        return (math.nan, math.nan)
    if not 0 <= k <= n:
        raise ValueError(f"k={k} must lie in [0, n={n}]")
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method=method)
    return (float(ci.low), float(ci.high))
