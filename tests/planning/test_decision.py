"""Items needed to resolve a drop (evalkit.planning.decision), held to independent computations: the exact
McNemar test's power summed over the binomial distribution of discordant pairs, and a simulation of the
two-proportion z-test."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from evalkit.planning import decision as D


def exact_mcnemar_power(n: int, psi: float, drop: float, alpha: float = 0.05) -> float:
    """P(the exact two-sided McNemar test rejects) with n pairs, discordance psi, drop = P(b) - P(c).

    The discordant count is Binomial(n, psi); given it, the right-to-wrong count is Binomial(D, q) with
    q = (psi + drop) / (2 psi); the test rejects when its two-sided binomial p-value at 1/2 is <= alpha."""
    q = (psi + drop) / (2 * psi)
    total = 0.0
    for d in range(1, n + 1):
        w = binom.pmf(d, n, psi)
        if w < 1e-12:
            continue
        k = np.arange(d + 1)
        p_two = np.minimum(1.0, 2 * np.minimum(binom.cdf(k, d, 0.5), binom.sf(k - 1, d, 0.5)))
        total += w * binom.pmf(k, d, q)[p_two <= alpha].sum()
    return total


@pytest.mark.parametrize("psi, drop", [(0.05, 0.01), (0.02, 0.01), (0.2, 0.02), (0.3, 0.05)])
def test_paired_items_give_the_exact_mcnemar_test_its_power(psi, drop):
    n = D.items_paired(drop, psi)
    # the normal approximation is for the asymptotic test; the exact test is a little conservative
    assert 0.75 <= exact_mcnemar_power(n, psi, drop) <= 0.85
    assert exact_mcnemar_power(n // 2, psi, drop) < 0.55  # half the items: clearly short of 80 %


def test_the_brief_form_and_the_worked_figure():
    # (z_a + z_b)^2 psi / d^2 when d^2 << psi; 7.85 x psi / 1e-4 at 95 % / 80 %
    n = D.items_paired(0.01, 0.05)
    assert abs(n - (1.959964 + 0.841621) ** 2 * 0.05 / 1e-4) / n < 0.002 and n == 3923


@pytest.mark.parametrize("p, drop", [(0.8, 0.02), (0.5, 0.05), (0.3, 0.03)])
def test_unpaired_items_give_the_two_proportion_z_test_its_power(p, drop):
    n = D.items_unpaired(p, drop)
    rng = np.random.default_rng(0)
    a, b = rng.binomial(n, p, 40_000) / n, rng.binomial(n, p - drop, 40_000) / n
    pool = (a + b) / 2
    z = (a - b) / np.sqrt(pool * (1 - pool) * 2 / n)
    assert abs((np.abs(z) > 1.959964).mean() - 0.80) < 0.01


def test_pairing_helps_only_below_the_independent_discordance():
    p, drop = 0.7, 0.01
    independent = 2 * p * (1 - p)
    assert D.items_paired(drop, 0.05) < D.items_unpaired(p, drop)
    assert abs(D.items_paired(drop, independent) / D.items_unpaired(p, drop) - 1) < 0.03


def test_detectable_drop_inverts_the_items():
    for n, psi in [(325, 0.035), (2000, 0.02), (30, 0.07)]:
        d = D.detectable_drop(n, psi)
        assert D.items_paired(d, max(psi, d)) <= n < D.items_paired(0.99 * d, max(psi, 0.99 * d))
    assert D.detectable_drop(0, 0.05) == math.inf


def test_discordance_prior_bounds():
    assert D.discordance_prior(0.99, 0.01, "multiple_choice") == 0.01  # never below the drop
    assert D.discordance_prior(0.5, 0.01, "cot") == pytest.approx(0.75 * 0.5)
    with pytest.raises(ValueError):
        D.items_paired(0.05, 0.01)  # a drop larger than the discordance is impossible
