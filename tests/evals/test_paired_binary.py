"""evalkit.evals.paired_binary against plain references (tests/evals/paired_reference.py): Tango's score
interval against a brute-force inversion of the score test, Wilson's width for 0 of n, the design
effects, the sign-flip test over items; and, simulated through evalkit's own generation rows, that
the item test holds its level where McNemar over item-samples does not."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from evalkit.evals import paired_binary as PB
from evalkit.evals.generation import paired as P
from evalkit.evals.generation.rows import outcome_rows
from evalkit.evals.stats import mcnemar_exact

from tests.evals import paired_reference as R


@pytest.mark.parametrize(
    "b,c,n", [(2, 12, 50), (1, 0, 8), (3, 3, 20), (0, 5, 10), (0, 0, 4), (4, 0, 4), (7, 2, 40), (1.5, 0.25, 6.5)]
)
def test_tango_interval_inverts_the_score_test(b, c, n):
    got = PB.paired_difference_ci(b, c, n)
    want = R.tango_brute(b, c, n)
    assert got == pytest.approx(want, abs=1e-7)
    assert got[0] <= (c - b) / n <= got[1]


@pytest.mark.parametrize("n", [1, 4, 8, 20, 100])
def test_no_discordant_pair_gives_wilsons_width_for_0_of_n(n):
    wilson_high = stats.binomtest(0, n).proportion_ci(method="wilson").high
    assert PB.paired_difference_ci(0, 0, n) == pytest.approx((-wilson_high, wilson_high), abs=1e-9)
    if n == 8:
        assert wilson_high == pytest.approx(0.324, abs=5e-4)  # 0 of 8 prompts: +-32.4 points, never [0, 0]


def test_wilson_for_real_counts_is_scipys_on_whole_ones():
    for k, n in ((0, 10), (3, 10), (10, 10), (17, 40)):
        ci = stats.binomtest(k, n).proportion_ci(method="wilson")
        assert PB.wilson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-12)
    assert PB.wilson(2.5, 7.25) == pytest.approx(R.wilson(2.5, 7.25), abs=1e-12)


def _pairs(rng, items, k, p_base=0.6, flip=0.2):
    base = rng.random((items, k)) < p_base
    other = np.where(rng.random((items, k)) < flip, ~base, base)
    return base, other


@pytest.mark.parametrize("k", [1, 2, 4])
def test_clustered_intervals_follow_the_design_effect(k):
    rng = np.random.default_rng(k)
    for _ in range(5):
        base, other = _pairs(rng, 12, k)
        value, lo, hi, deff = PB.clustered_difference_ci(base, other)
        bl, ol = base.astype(float).tolist(), other.astype(float).tolist()
        assert deff == pytest.approx(R.change_design_effect(bl, ol), abs=1e-12)
        assert (lo, hi) == pytest.approx(R.clustered_change_interval(bl, ol), abs=1e-7)
        assert value == pytest.approx(other.mean() - base.mean(), abs=1e-12)
        share, s_lo, s_hi, s_deff = PB.clustered_proportion(other)
        assert s_deff == pytest.approx(R.share_design_effect(ol), abs=1e-12)
        assert (s_lo, s_hi) == pytest.approx(
            R.wilson(other.sum() / s_deff, other.size / s_deff, R.cluster_z(12, k)), abs=1e-9
        )


def test_samples_that_repeat_their_item_count_as_one_item():
    """k identical samples per item carry the information of one: the interval is the item-level one."""
    rng = np.random.default_rng(3)
    base, other = _pairs(rng, 10, 1)
    b, c = int((base & ~other).sum()), int((~base & other).sum())
    t9 = stats.t.ppf(0.975, 9)  # the design effect estimated over 10 items: Student's quantile
    one = PB.paired_difference_ci(b, c, 10, z=t9)
    assert one == pytest.approx(R.tango_brute(b, c, 10, t9), abs=1e-7)
    _, lo, hi, deff = PB.clustered_difference_ci(np.repeat(base, 4, 1), np.repeat(other, 4, 1))
    assert deff == 4 and (lo, hi) == pytest.approx(one, abs=1e-9)
    _, lo, hi, deff = PB.clustered_difference_ci(np.repeat(base, 4, 1), np.repeat(base, 4, 1))
    assert deff == 4 and (lo, hi) == pytest.approx((-(t9**2) / (10 + t9**2), t9**2 / (10 + t9**2)), abs=1e-9)


def test_sign_flip_test_over_items():
    rng = np.random.default_rng(5)
    for _ in range(20):
        changes = rng.integers(-3, 4, size=int(rng.integers(1, 9))).tolist()
        assert PB.item_sign_test(changes) == pytest.approx(R.sign_flip_p(changes), abs=1e-12)
        nonzero = [abs(a) for a in changes if a]  # every sign pattern, enumerated
        extreme = sum(
            abs(sum(s * a for s, a in zip(signs, nonzero))) >= abs(sum(changes))
            for signs in itertools.product((-1, 1), repeat=len(nonzero))
        )
        assert PB.item_sign_test(changes) == pytest.approx(extreme / 2 ** len(nonzero), abs=1e-12)
    for b, c in ((0, 0), (3, 0), (2, 5), (1, 12)):  # one sample per item: McNemar's exact test
        assert PB.item_sign_test([-1] * b + [1] * c + [0] * 3) == pytest.approx(mcnemar_exact(b, c), abs=1e-12)


def _symmetric_null(rng, items: int, k: int, shift: float = 0.3):
    """Per item an accuracy p, the scheme's p moved up or down by ``shift`` with equal chance: no change
    in accuracy over items, but a change in every item."""
    p = rng.uniform(0.2, 0.8, items)
    q = np.clip(p + shift * rng.choice((-1.0, 1.0), items), 0.0, 1.0)
    return (rng.random((items, k)) < p[:, None]).astype(float), (rng.random((items, k)) < q[:, None]).astype(float)


TRIALS = 2000


@pytest.mark.slow
def test_item_test_holds_its_level_with_4_samples_per_item():
    """Done-when of the issue: 4 samples per item, item accuracies moved symmetrically, the generation
    rows' test rejects at <= 5 % (simulation error at 2,000 trials: 0.5 points), where McNemar over the
    item-samples rejects far more often; and the Δacc interval excludes 0 at <= 5 % too."""
    rng = np.random.default_rng(49)
    name = lambda stat: stat  # noqa: E731
    rejects = pooled = excluded = 0
    for _ in range(TRIALS):
        base, other = _symmetric_null(rng, 20, 4)
        rows = {r.metric: r for r in outcome_rows(name, base, other, {}, {})}
        rejects += rows["mcnemar_p"].value <= 0.05
        pooled += P.mcnemar(base, other)[0] <= 0.05
        delta = rows["accuracy_delta"]
        excluded += not (delta.ci_low <= 0 <= delta.ci_high)
    se = math.sqrt(0.05 * 0.95 / TRIALS)
    assert rejects / TRIALS <= 0.05 + 2 * se, f"item test rejects {rejects / TRIALS:.3f}"
    assert excluded / TRIALS <= 0.05 + 2 * se, f"Δacc interval excludes 0 in {excluded / TRIALS:.3f}"
    assert pooled / TRIALS > 0.08, f"McNemar over item-samples rejects {pooled / TRIALS:.3f}: the reason is gone"
