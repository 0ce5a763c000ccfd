"""Paired bootstrap intervals, the paired p-value and binomial intervals, each checked against a
plain independent computation (a numpy bootstrap loop, exact signed-rank counting, the Wilson
formula, beta quantiles)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sst

from evalkit.evals.stats import binomial_ci, paired_bootstrap_ci, paired_pvalue


def mean_diff(x, y):
    return (x - y).mean(-1)


def test_bootstrap_matches_plain_numpy_loop():
    rng = np.random.default_rng(3)
    x = rng.normal(1.0, 1.0, size=40)
    y = x + rng.normal(0.3, 0.5, size=40)
    low, high = paired_bootstrap_ci(mean_diff, [x, y], n_resamples=4000, seed=1)
    # the same percentile bootstrap, written out by hand with another generator
    idx = np.random.default_rng(99).integers(0, 40, size=(20000, 40))
    boot = (x[idx] - y[idx]).mean(1)
    ref_low, ref_high = np.percentile(boot, [2.5, 97.5])
    width = ref_high - ref_low
    assert abs(low - ref_low) < 0.08 * width and abs(high - ref_high) < 0.08 * width
    assert low < mean_diff(x, y) < high


def test_bootstrap_ratio_of_sums_paired_over_units():
    rng = np.random.default_rng(0)
    counts = rng.integers(50, 100, size=30).astype(float)
    a = counts * rng.normal(2.0, 0.1, size=30)

    def ratio(c, s):
        return s.sum(-1) / c.sum(-1)

    low, high = paired_bootstrap_ci(ratio, [counts, a], n_resamples=2000, seed=0)
    assert low < a.sum() / counts.sum() < high
    assert 0 < high - low < 0.2


def test_bootstrap_identity_is_exactly_zero_and_seeded():
    x = np.random.default_rng(5).normal(size=12)
    assert paired_bootstrap_ci(mean_diff, [x, x.copy()]) == (0.0, 0.0)
    y = x + np.random.default_rng(6).normal(size=12)
    first = paired_bootstrap_ci(mean_diff, [x, y], seed=7)
    assert paired_bootstrap_ci(mean_diff, [x, y], seed=7) == first
    assert paired_bootstrap_ci(mean_diff, [x, y], seed=8) != first


def test_bootstrap_needs_two_units_and_equal_lengths():
    assert all(math.isnan(v) for v in paired_bootstrap_ci(mean_diff, [np.ones(1), np.zeros(1)]))
    with pytest.raises(ValueError):
        paired_bootstrap_ci(mean_diff, [np.ones(3), np.ones(4)])


def test_pvalue_exact_signed_rank():
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    y = x - np.array([0.1, 0.2, 0.3, 0.4, 0.5])  # all five differences positive
    # exact two-sided signed-rank p: 2 * P(W = 15) = 2 / 2**5
    assert paired_pvalue(x, y) == pytest.approx(2 / 32)
    assert paired_pvalue(x, x) == 1.0
    assert math.isnan(paired_pvalue(x[:1], y[:1]))
    assert paired_pvalue(x, x + np.array([0.1, -0.1, 0.2, -0.2, 0.05])) > 0.5


def test_binomial_wilson_matches_formula():
    k, n, z = 37, 120, sst.norm.ppf(0.975)
    phat = k / n
    centre = (phat + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n))
    low, high = binomial_ci(k, n)
    assert low == pytest.approx(centre - half, rel=1e-9) and high == pytest.approx(centre + half, rel=1e-9)


def test_binomial_exact_matches_beta_quantiles():
    k, n = 7, 25
    low, high = binomial_ci(k, n, method="exact")
    assert low == pytest.approx(sst.beta.ppf(0.025, k, n - k + 1), rel=1e-7)
    assert high == pytest.approx(sst.beta.ppf(0.975, k + 1, n - k), rel=1e-7)
    assert binomial_ci(0, 10, method="exact")[0] == 0.0 and binomial_ci(10, 10, method="exact")[1] == 1.0
    assert all(math.isnan(v) for v in binomial_ci(0, 0))
    with pytest.raises(ValueError):
        binomial_ci(11, 10)
