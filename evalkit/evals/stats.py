"""Confidence intervals and paired tests shared by the evaluations.

Scheme-vs-baseline differences are *paired*: both are measured on the same units (perplexity
windows, decode sequences, retrieval samples), so intervals treat a unit, not a token, as one
observation and keep each unit's pair together. That respects the correlation between tokens of
one window, which a per-token interval would ignore and so report intervals that are too narrow.

- :func:`unit_interval`: the interval of any statistic of several per-unit arrays, by one of
  :data:`METHODS`:

  * ``"t"`` (the default): the **studentized jackknife**: ``point -/+ t(0.975, n-1) x SE``, with the
    leave-one-unit-out jackknife standard error. For a mean it is exactly Student's t interval,
    whose coverage holds at the few units a CPU run affords: simulated at n = 4 (20,000 trials,
    ``tests/evals/test_interval_coverage.py``) it covers 95 % on normal data and 96-97 % on
    heavy-tailed (t with 3 df, Laplace) data. For the ratio statistics of the evaluations (a sum
    over tokens divided by a count) the jackknife is the delta-method standard error.
  * ``"bootstrap"``: the percentile bootstrap (``scipy.stats.bootstrap(paired=True)``, fixed seed).
    Kept for comparison and for many units: at n = 4 it covers only about 80 % (it resamples four
    values, so its spread is the sample's, shrunk by (n-1)/n, and its quantiles ignore the t
    factor), 88 % at n = 8, 92 % at n = 20.

  An identity scheme (every difference exactly zero) gives exactly [0, 0] under both.
- :func:`skewed_mean_ci`: the interval of a mean of **non-negative, right-skewed** per-unit values
  (KL divergences: per-sequence KL has a CV of about 0.85 in the published decode rows). Its lower end
  is the studentized jackknife's; its upper end is the larger of the jackknife's and the upper end of
  the **generalized confidence interval for a lognormal mean** (Krishnamoorthy and Mathew 2003): with
  ``y = log`` of the unit values, mean ``ybar`` and variance ``s2``, the 97.5th percentile of
  ``ybar - Z sqrt(S2 / n) + S2 / 2``, ``S2 = (n - 1) s2 / U``, ``Z ~ N(0, 1)``, ``U ~ chi2(n - 1)``
  (:data:`GCI_DRAWS` seeded draws), exponentiated. Why: at n = 4 the t interval's upper end misses
  the true mean 12 % of the time on lognormal (sigma 0.75) data and 18 % at sigma 1.0 (nominal 2.5 %);
  a t on the log scale or Cox's lognormal interval still miss 5-8 %, since s2 from three degrees of
  freedom is itself most uncertain. The generalized interval pays for that: its upper end holds on
  lognormal, exponential and gamma data at n = 4 and 20 (``tests/evals/test_interval_coverage.py``,
  table in ``docs/statistics.md``), and at n = 4 it is wide (about 30x the mean at sigma 0.75), so a
  KL criterion on 4 skewed units stays unresolved unless the units agree closely: what the data
  support. A unit value of 0 or less (no log) leaves the jackknife t, named in the method text.
- :func:`paired_pvalue`: two-sided paired t test of per-unit values (``scipy.stats.ttest_rel``),
  the test that matches the t interval (a Wilcoxon signed-rank p cannot go below 2/2**n, 0.125 at
  n = 4). All differences zero: p = 1.
- :func:`binomial_ci`: interval for a proportion k/n (Wilson score by default, or exact
  Clopper-Pearson) via ``scipy.stats.binomtest``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

from evalkit.evals.interval_methods import METHOD_TEXT, METHODS, parse_method  # noqa: F401 (re-exported)

DEFAULT_RESAMPLES = 2000
GCI_DRAWS = 20000  # draws of the generalized pivot: its 97.5th percentile moves by < 1 % between seeds at n = 4
GCI_SEED = 0
SKEWED_MARK = "upper end at least the lognormal generalized interval's"  # in a row's info["ci"]: skew-aware
SKEWED_TEXT = (
    "95% studentized jackknife (t, n-1 df) over {units}, " + SKEWED_MARK + " (right-skewed non-negative values)"
)
DEFAULT_SEED = 0
PVALUE_TEST = "paired t test (two-sided, over windows' mean NLL)"


def interval_text(method: str, units: str, skewed: bool = False) -> str:
    """What an interval of ``method`` over ``units`` (e.g. "windows") is, for a row's ``info["ci"]``;
    ``skewed``: :func:`skewed_mean_ci`'s."""
    return (SKEWED_TEXT if skewed else METHOD_TEXT[method]).format(units=units)


def unit_interval(
    statistic: Callable[..., np.ndarray],
    arrays: Sequence[np.ndarray],
    *,
    method: str = "t",
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> tuple[float, float]:
    """The ``method`` interval (see the module docstring) of ``statistic(*arrays)`` over units.

    ``arrays`` are per-unit values of equal length n; ``statistic`` must accept arrays with the
    units on the last axis and return one value per leading index (vectorized, e.g.
    ``x.sum(-1) / n.sum(-1)``). Fewer than two units: (nan, nan), as no interval exists.
    """
    if method == "t":
        return jackknife_t_ci(statistic, arrays, confidence=confidence)
    if method == "bootstrap":
        return paired_bootstrap_ci(statistic, arrays, n_resamples=n_resamples, seed=seed, confidence=confidence)
    raise ValueError(f"unknown interval method {method!r}: use one of {', '.join(METHODS)}")


def jackknife_t_ci(
    statistic: Callable[..., np.ndarray], arrays: Sequence[np.ndarray], *, confidence: float = 0.95
) -> tuple[float, float]:
    """``point -/+ t(1 - a/2, n-1) x SE_jack``: the studentized jackknife interval over n units.

    ``SE_jack = sqrt((n-1)/n x sum_i (theta_(i) - mean theta_(.))**2)``, ``theta_(i)`` the statistic
    with unit i left out. For the mean this is ``s / sqrt(n)``, so the interval is Student's."""
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    n = len(arrays[0])
    if any(len(a) != n for a in arrays):
        raise ValueError("paired arrays must have the same length")
    if n < 2:
        return (math.nan, math.nan)
    point = float(statistic(*arrays))
    keep = ~np.eye(n, dtype=bool)  # row i: every unit but i
    left_out = np.asarray(statistic(*[np.stack([a[k] for k in keep]) for a in arrays]), dtype=np.float64)
    if not (np.isfinite(point) and np.all(np.isfinite(left_out))):
        return (math.nan, math.nan)
    se = math.sqrt((n - 1) / n * float(np.sum((left_out - left_out.mean()) ** 2)))
    half = float(stats.t.ppf(1 - (1 - confidence) / 2, n - 1)) * se
    return (point - half, point + half)


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
    """Two-sided paired t test p-value that paired values ``x`` and ``y`` differ in mean.

    1.0 when every pair is equal; nan with fewer than two pairs (no test possible); 0.0 when every
    pair differs by the same nonzero amount (no spread: the difference is certain).
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) != len(y):
        raise ValueError("paired arrays must have the same length")
    d = x - y
    if len(d) < 2:
        return math.nan
    if np.all(d == 0):
        return 1.0
    if np.all(d == d[0]):
        return 0.0
    return float(stats.ttest_rel(x, y, alternative="two-sided").pvalue)


def binomial_ci(k: int, n: int, confidence: float = 0.95, method: str = "wilson") -> tuple[float, float]:
    """Interval for the proportion k/n: ``method`` 'wilson' (default) or 'exact' (Clopper-Pearson)."""
    if n <= 0:
        return (math.nan, math.nan)
    if not 0 <= k <= n:
        raise ValueError(f"k={k} must lie in [0, n={n}]")
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method=method)
    return (float(ci.low), float(ci.high))


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p of paired 0/1 outcomes: a binomial test of ``b`` (right -> wrong) of the
    ``b + c`` discordant pairs at 1/2 (``scipy.stats.binomtest``); 1 with no discordant pair. The one
    McNemar test of the paired evaluations (generation, longcontext)."""
    if b + c == 0:
        return 1.0
    return float(stats.binomtest(int(b), int(b + c), 0.5).pvalue)


def skewed_mean_ci(sums: np.ndarray, counts: np.ndarray, confidence: float = 0.95) -> tuple[float, float, bool]:
    """(low, high, skew-aware) of ``sum(sums) / sum(counts)``, per-unit values ``sums / counts`` >= 0
    (see the module docstring). ``skew-aware`` is False where a unit value is not positive and the
    interval is the jackknife t alone. Fewer than two units: (nan, nan, False)."""
    sums, counts = np.asarray(sums, np.float64), np.asarray(counts, np.float64)

    def ratio(x, c):
        return x.sum(-1) / c.sum(-1)

    low, high = jackknife_t_ci(ratio, [sums, counts], confidence=confidence)
    values = sums / counts
    if not math.isfinite(low) or np.all(values == values[0]) or np.any(values <= 0):
        return (low, high, False)
    n = len(values)
    y = np.log(values)
    ybar, s2 = float(y.mean()), float(y.var(ddof=1))
    rng = np.random.default_rng(GCI_SEED)
    z, u = rng.standard_normal(GCI_DRAWS), rng.chisquare(n - 1, GCI_DRAWS)
    big_s2 = (n - 1) * s2 / u
    pivot = ybar - z * np.sqrt(big_s2 / n) + big_s2 / 2
    upper = float(np.exp(np.percentile(pivot, 100 * (1 - (1 - confidence) / 2))))
    return (low, max(high, upper), True)
