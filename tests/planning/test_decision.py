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


def test_the_budget_decision_is_sized_as_non_inferiority_by_hand():
    """A case recomputed by hand: limit 1 pt, psi 5 %, 95 % two-sided (1.959964) and 80 % power (0.841621)."""
    zz = (1.959964 + 0.841621) ** 2  # 7.848879
    assert D.items_noninferior(0.01, 0.05) == math.ceil(zz * 0.05 / 0.01**2) == 3925
    # a scheme truly losing half the limit: (psi - t^2) / (L - t)^2 = 0.049975 / 0.000025, about 4x
    assert D.items_noninferior(0.01, 0.05, 0.005) == math.ceil(zz * 0.049975 / 0.005**2) == 15690
    # unpaired, per arm, accuracy 0.7 and no true drop: 2 x 0.21 variance
    assert D.items_noninferior_unpaired(0.7, 0.01) == math.ceil(zz * 0.42 / 1e-4) == 32966
    # inverted: 3,925 items decide a limit of 1 point
    assert D.resolvable_limit(3925, 0.05) == pytest.approx(0.01, rel=2e-4)


@pytest.mark.parametrize("psi, true_drop", [(0.05, 0.0), (0.05, 0.005), (0.2, 0.002)])
def test_the_non_inferiority_items_give_the_budget_rule_its_power(psi, true_drop):
    """Simulation of the rule: n paired items, P(right to wrong) = (psi + t) / 2, P(wrong to right) =
    (psi - t) / 2; inside when the drop's Wald 95 % upper end is at most the limit."""
    limit = 0.01
    n = D.items_noninferior(limit, psi, true_drop)
    rng = np.random.default_rng(0)
    counts = rng.multinomial(n, [(psi + true_drop) / 2, (psi - true_drop) / 2, 1 - psi], 20_000)
    d = (counts[:, 0] - counts[:, 1]) / n
    se = np.sqrt(((counts[:, 0] + counts[:, 1]) / n - d**2) / n)
    assert abs((d + 1.959964 * se <= limit).mean() - 0.80) < 0.02
    # the former sizing (H0: drop = 0, a 1-point effect) at a true drop of half the limit: far short of 80 %
    if true_drop == limit / 2:
        old = D.items_paired(limit, psi)
        c = rng.multinomial(old, [(psi + true_drop) / 2, (psi - true_drop) / 2, 1 - psi], 20_000)
        d = (c[:, 0] - c[:, 1]) / old
        se = np.sqrt(((c[:, 0] + c[:, 1]) / old - d**2) / old)
        assert (d + 1.959964 * se <= limit).mean() < 0.4


def test_a_small_pilot_can_only_raise_the_prior():
    """25 items with 0 flips: the Wilson 95 % upper end 1.92^2/(25 + 1.92^2) = 0.1335, not the point estimate 0."""
    from evalkit.planning.decision_sizing import measured_discordance

    rows = [
        {
            "metric": "ruler/discordance",
            "eval": "longcontext",
            "scheme": "fp8",
            "value": 0.0,
            "run_id": "a",
            "labels": {"length": 4096},
            "info": {"n_items": 25, "n_changed": 0},
        },
    ]
    pilot = measured_discordance(rows)["ruler@4096"]
    z2 = 1.959964**2
    assert pilot.items == 25 and pilot.share == 0 and pilot.upper == pytest.approx(z2 / (25 + z2), rel=1e-5)
    psi, source = D.pilot_psi(0.0086, pilot)
    assert psi == pilot.upper and "25 items" in source and "measured in --out" in source
    psi, source = D.pilot_psi(0.3, pilot)  # a prior above the pilot's bound stays
    assert psi == 0.3 and "25 items" in source
    # lm-eval flips: both directions of one run summed, the largest upper bound over schemes kept
    flips = [
        {
            "metric": f"mmlu/flip_{d}",
            "eval": "lmeval",
            "scheme": s,
            "value": k / 40,
            "run_id": s,
            "labels": {},
            "info": {"n_items": 40, "n_flipped": k},
        }
        for s, d, k in [("x", "right_to_wrong", 2), ("x", "wrong_to_right", 1), ("y", "right_to_wrong", 1)]
    ]
    pilot = measured_discordance(flips)["mmlu"]
    from evalkit.evals.stats import binomial_ci

    assert pilot.items == 40 and pilot.share == 3 / 40 and pilot.upper == binomial_ci(3, 40)[1]
