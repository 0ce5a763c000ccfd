"""generation: the per-item statistics (pass@k, McNemar, paired accuracy change, Wilson intervals, length
buckets, first divergence) against plain computations written out here, never against the code under test."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from evalkit.evals.generation import paired as P

from tests.evals import paired_reference as R

Z = 1.959963984540054  # the 97.5 % normal quantile


def wilson(k: int, n: int) -> tuple[float, float]:
    centre = (k + Z * Z / 2) / (n + Z * Z)
    half = Z * math.sqrt(k * (n - k) / n + Z * Z / 4) / (n + Z * Z)
    return centre - half, centre + half


def brute_pass_at_k(row: list[int], k: int) -> float:
    """The share of k-subsets of the samples holding at least one right one: pass@k's definition."""
    subsets = list(itertools.combinations(range(len(row)), k))
    return sum(any(row[i] for i in s) for s in subsets) / len(subsets)


def exact_mcnemar(b: int, c: int) -> float:
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def student_t(x) -> tuple[float, float, float]:
    x = np.asarray(x, dtype=float)
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return x.mean(), x.mean() - half, x.mean() + half


@pytest.mark.parametrize("k,n", [(0, 8), (3, 8), (8, 8), (17, 40)])
def test_wilson(k, n):
    value, lo, hi = P.proportion(k, n)
    assert value == k / n and (lo, hi) == pytest.approx(wilson(k, n), abs=1e-12)


def test_pass_at_k_is_the_share_of_k_subsets_with_a_right_sample():
    rng = np.random.default_rng(0)
    correct = rng.integers(0, 2, size=(9, 5))
    for k in range(1, 6):
        value, lo, hi = P.mean_pass_at_k(correct, k)
        per_item = [brute_pass_at_k(list(row), k) for row in correct]
        assert value == pytest.approx(np.mean(per_item), abs=1e-12)
        mean, t_lo, t_hi = student_t(per_item)
        assert lo == pytest.approx(max(t_lo, 0.0), abs=1e-12) and hi == pytest.approx(min(t_hi, 1.0), abs=1e-12)
    assert P.pass_at_k(4, 0, 2) == 0.0 and P.pass_at_k(4, 3, 2) == 1.0  # n - c < k: every pair holds a right one


@pytest.mark.parametrize("b,c", [(0, 0), (3, 0), (2, 5), (7, 7), (1, 12)])
def test_mcnemar_exact_p_from_the_discordant_pairs(b, c):
    base = [1] * b + [0] * c + [1, 1, 0]  # b right->wrong, c wrong->right, then concordant pairs
    other = [0] * b + [1] * c + [1, 1, 0]
    p, got_b, got_c = P.mcnemar(np.array(base), np.array(other))
    assert (got_b, got_c) == (b, c) and p == pytest.approx(exact_mcnemar(b, c), abs=1e-12)


def test_accuracy_delta_is_tangos_interval_with_the_item_as_the_unit():
    base = np.array([[1, 1], [0, 0], [1, 0], [0, 1], [1, 1]])
    other = np.array([[1, 0], [0, 0], [1, 1], [0, 0], [0, 0]])
    value, lo, hi, deff = P.accuracy_delta(base, other)
    d = [np.mean(o) - np.mean(b) for b, o in zip(base, other)]
    assert value == pytest.approx(np.mean(d), abs=1e-12)
    assert deff == pytest.approx(R.change_design_effect(base.tolist(), other.tolist()), abs=1e-12)
    assert (lo, hi) == pytest.approx(R.clustered_change_interval(base.tolist(), other.tolist()), abs=1e-7)
    # every item agrees: not [0, 0] but Wilson's width for 0 of the 5 items (the 2 samples of an item that
    # never changes count as one), with Student's quantile (4 df) for z: t**2 / (n + t**2)
    value, lo, hi, deff = P.accuracy_delta(base, base)
    t4 = stats.t.ppf(0.975, 4)
    assert value == 0 and deff == 2 and (lo, hi) == pytest.approx((-(t4**2) / (5 + t4**2), t4**2 / (5 + t4**2)))
    value, lo, hi, deff = P.accuracy_delta(base[:, :1], base[:, :1])  # one sample per item: Wilson's own
    wilson_high = stats.binomtest(0, 5).proportion_ci(method="wilson").high
    assert deff == 1 and (lo, hi) == pytest.approx((-wilson_high, wilson_high), abs=1e-9)


@pytest.mark.parametrize(
    "tokens,bucket",
    [(0, (0, 31)), (31, (0, 31)), (32, (32, 63)), (63, (32, 63)), (64, (64, 127)), (4097, (4096, 8191))],
)
def test_length_buckets_are_powers_of_two(tokens, bucket):
    assert P.length_bucket(tokens) == bucket and P.bucket_label(bucket) == f"{bucket[0]}-{bucket[1]}"


def plain_first_difference(a, b):
    i = 0
    while i < len(a) and i < len(b) and a[i] == b[i]:
        i += 1
    return None if len(a) == len(b) == i else i


@pytest.mark.parametrize(
    "a,b", [([1, 2, 3], [1, 2, 3]), ([1, 2, 3], [1, 9, 3]), ([5], [6]), ([1, 2], [1, 2, 3]), ([], [4])]
)
def test_first_divergence(a, b):
    assert P.first_divergence(a, b) == plain_first_difference(a, b)


def test_divergence_summary_median_and_share():
    steps = [None, 4, 9, None, 2, 7, 30, 11, None, 5]
    out = P.divergence_summary(steps)
    diverged = sorted(s for s in steps if s is not None)  # 7 of 10
    assert out["diverged"] == 7 and out["share"] == pytest.approx((0.7, *wilson(7, 10)), abs=1e-12)
    median, lo, hi = out["median"]
    assert median == diverged[3]  # the lower median of 7 values: the 4th
    # the exact order-statistic interval at n = 7: ranks (1, 7), coverage 1 - 2 / 2**7
    assert (lo, hi) == (diverged[0], diverged[6]) and out["coverage"] == pytest.approx(1 - 2 / 2**7, abs=1e-4)
    assert "median" not in P.divergence_summary([None, None])
