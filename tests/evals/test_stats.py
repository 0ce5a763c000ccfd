"""Paired intervals (studentized jackknife t, percentile bootstrap), the paired p-value and binomial
intervals, each checked against a plain independent computation (Student's t interval written out,
a leave-one-out loop, a numpy bootstrap loop, the t statistic by hand, the Wilson formula, beta
quantiles)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sst

from evalkit.evals.stats import binomial_ci, jackknife_t_ci, paired_bootstrap_ci, paired_pvalue, unit_interval


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


def test_pvalue_is_the_paired_t_test_by_hand():
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    y = x - np.array([0.1, 0.25, 0.3, 0.4, 0.6])
    d = x - y
    t = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    assert paired_pvalue(x, y) == pytest.approx(2 * sst.t.sf(abs(t), len(d) - 1), rel=1e-12)
    assert paired_pvalue(x, x) == 1.0
    assert paired_pvalue(x, x - 0.5) == 0.0  # every window moved by the same amount: no spread
    assert math.isnan(paired_pvalue(x[:1], y[:1]))
    assert paired_pvalue(x, x + np.array([0.1, -0.1, 0.2, -0.2, 0.05])) > 0.5
    # 4 windows: a t test can report strong evidence; a signed-rank test could not go below 0.125
    assert paired_pvalue(x[:4], y[:4] - 1.0) < 0.01


def test_jackknife_t_of_a_mean_is_students_t_interval():
    x = np.array([0.3, 1.1, -0.4, 2.0])
    plain = sst.t.interval(0.95, 3, loc=x.mean(), scale=x.std(ddof=1) / 2)
    assert jackknife_t_ci(lambda a: a.mean(-1), [x]) == pytest.approx(plain, rel=1e-12)
    assert unit_interval(lambda a: a.mean(-1), [x]) == jackknife_t_ci(lambda a: a.mean(-1), [x])


def test_jackknife_t_of_a_ratio_matches_a_leave_one_out_loop():
    rng = np.random.default_rng(2)
    c = rng.integers(400, 512, size=6).astype(float)
    d = rng.normal(0.01, 0.02, size=6) * c

    def ratio(c, d):
        return np.expm1(d.sum(-1) / c.sum(-1))

    loo = np.array([ratio(np.delete(c, i), np.delete(d, i)) for i in range(6)])
    se = math.sqrt(5 / 6 * ((loo - loo.mean()) ** 2).sum())
    half = sst.t.ppf(0.975, 5) * se
    point = ratio(c, d)
    assert jackknife_t_ci(ratio, [c, d]) == pytest.approx((point - half, point + half), rel=1e-12)
    assert jackknife_t_ci(ratio, [c, 0 * d]) == (0.0, 0.0)  # an identity scheme: exactly [0, 0]
    assert all(math.isnan(v) for v in jackknife_t_ci(ratio, [c[:1], d[:1]]))
    with pytest.raises(ValueError, match="unknown interval method"):
        unit_interval(ratio, [c, d], method="bca")


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
