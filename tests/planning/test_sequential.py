"""The sequential rule of ``sweep --resolve`` (evalkit.planning.sequential): its false-"inside" rate under a
true effect at the limit, across the stages, by simulation through evalkit's own interval functions and its
own decision rule; and the re-derivation of stored intervals at another level, against plain formulas.

A look is judged as the report judges it: the stored row's 95 % interval (evalkit's jackknife t, Wilson,
Tango) re-derived at the look's level by ``relevel`` and compared with the limit by the recommendation's
``_state_of_interval``. The units grow as resolve grows them: stage k reads the first ``n0 x 2**k`` units,
so the looks share their units. A criterion's verdict is that of the first look that resolves it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from evalkit.evals.base import Criterion
from evalkit.evals.paired_binary import paired_difference_ci
from evalkit.evals.stats import binomial_ci, jackknife_t_ci
from evalkit.planning.sequential import JACKKNIFE, TANGO, look_level, relevel
from evalkit.report.recommend import _state_of_interval

KL = Criterion("KL", "kl_mean", "max_kl", True, "mean KL")  # x <= limit
DROP = Criterion("retrieval", "retrieval_diff", "max_retrieval_drop", True, "drop", transform="neg")  # -x <= limit
STAGES = 3
SIMS = 2000
SE = math.sqrt(0.025 * 0.975 / SIMS)  # the simulation's standard error at the nominal 2.5 %


def _t_row(x: np.ndarray) -> dict:
    lo, hi = jackknife_t_ci(lambda a: a.mean(-1), [x])
    return {
        "value": float(x.mean()),
        "ci_low": lo,
        "ci_high": hi,
        "info": {"ci": f"95% {JACKKNIFE}", "n_windows": len(x)},
    }


def _first_verdict(rows: list[dict], criterion: Criterion, limit: float, level: float | None) -> str:
    """The verdict of the first look (in order) that resolves, each at ``level`` (None: the stored 95 %)."""
    for row in rows:
        lo, hi = (row["ci_low"], row["ci_high"]) if level is None else relevel(row, level)
        state = _state_of_interval(criterion, lo, hi, limit)
        if state != "unresolved":
            return state
    return "unresolved"


def _rates(make_rows, criterion, limit, seed=0) -> tuple[float, float, float]:
    """(false-inside rate of the split rule, of 95 % at every look, of the two-step 'report at 95 %, then resolve
    what straddles at the split level')."""
    rng = np.random.default_rng(seed)
    level = look_level(STAGES)
    split = naive = two_step = 0
    for _ in range(SIMS):
        rows = make_rows(rng)
        split += _first_verdict(rows, criterion, limit, level) == "inside"
        naive += _first_verdict(rows, criterion, limit, None) == "inside"
        first = _first_verdict(rows[:1], criterion, limit, None)
        two_step += first == "inside" or (
            first == "unresolved" and _first_verdict(rows[1:], criterion, limit, level) == "inside"
        )
    return split / SIMS, naive / SIMS, two_step / SIMS


@pytest.mark.slow
def test_split_rule_holds_a_kl_at_its_limit_to_nominal_across_stages():
    """Right-skewed per-window KL (lognormal, sigma 0.75) whose mean is exactly the limit, 4 -> 32 windows."""
    limit, sigma = 0.02, 0.75
    mu = math.log(limit) - sigma**2 / 2  # E[X] = limit

    def rows(rng):
        x = rng.lognormal(mu, sigma, 4 * 2**STAGES)
        return [_t_row(x[: 4 * 2**k]) for k in range(STAGES + 1)]

    split, naive, two_step = _rates(rows, KL, limit)
    assert split <= 0.025 + 3 * SE  # the rule: at most alpha / 2 over all the looks
    assert naive > split  # looking again at 95 % inflates it
    assert two_step <= 0.025 + STAGES / (STAGES + 1) * 0.025 + 3 * SE  # the bound docs/statistics.md states


@pytest.mark.slow
def test_split_rule_holds_a_flip_rate_at_its_limit_to_nominal_across_stages():
    """Flips ~ Bernoulli(5 %) against a 5 % budget (Wilson), 8 -> 64 items."""
    limit = 0.05

    def rows(rng):
        flips = rng.random(8 * 2**STAGES) < limit
        out = []
        for k in range(STAGES + 1):
            n = 8 * 2**k
            f = int(flips[:n].sum())
            lo, hi = binomial_ci(f, n)
            out.append({"value": f / n, "ci_low": lo, "ci_high": hi, "info": {"n_flipped": f, "n_items": n}})
        return out

    split, naive, _ = _rates(rows, KL, limit, seed=1)
    assert split <= 0.025 + 3 * SE and naive >= split


@pytest.mark.slow
def test_split_rule_holds_a_paired_drop_at_its_limit_to_nominal_across_stages():
    """Paired yes/no items (Tango): 10 % of items lose their answer, 5 % gain one (a 5-point drop) against a
    5-point budget, 20 -> 160 items."""
    limit = 0.05

    def rows(rng):
        u = rng.random(20 * 2**STAGES)
        lost, gained = u < 0.10, (u >= 0.10) & (u < 0.15)
        out = []
        for k in range(STAGES + 1):
            n = 20 * 2**k
            b, c = int(lost[:n].sum()), int(gained[:n].sum())
            lo, hi = paired_difference_ci(b, c, n)
            out.append({"value": (c - b) / n, "ci_low": lo, "ci_high": hi, "info": {"ci": TANGO, "n": n}})
        return out

    split, naive, _ = _rates(rows, DROP, limit, seed=2)
    assert split <= 0.025 + 3 * SE and naive >= split


def test_look_level_splits_alpha_over_the_looks():
    assert look_level(3) == pytest.approx(1 - 0.05 / 4) and look_level(0) == pytest.approx(0.95)
    with pytest.raises(ValueError):
        look_level(-1)


def test_relevel_widens_a_float_spread_interval_by_each_terms_quantile():
    """A perplexity row: windows' t interval (n - 1 df) and the float spread's t(R - 1) x SD x sqrt(1 + 1/R), in
    quadrature, about the mean of the realisations; its stored 95 % form is given back at 95 %."""
    n, r, sd, value, sampling = 4, 4, 0.0028, 0.0089, (-0.0026, 0.0178)

    def interval(q):
        hw = (sampling[1] - sampling[0]) / 2 * stats.t.ppf(0.5 + q / 2, n - 1) / stats.t.ppf(0.975, n - 1)
        hf = stats.t.ppf(0.5 + q / 2, r - 1) * sd * math.sqrt(1 + 1 / r)
        return value - math.hypot(hw, hf), value + math.hypot(hw, hf)

    lo, hi = interval(0.95)
    row = {
        "value": value,
        "ci_low": lo,
        "ci_high": hi,
        "info": {
            "ci": f"95% {JACKKNIFE} over windows, widened by the float spread",
            "n_windows": n,
            "ci_sampling": list(sampling),
            "float_noise": {"sd": sd, "seeds": [1, 2, 3]},
        },
    }
    assert relevel(row, 0.95) == pytest.approx((lo, hi), abs=1e-12)
    assert relevel(row, 0.9875) == pytest.approx(interval(0.9875), abs=1e-12)
    assert relevel({**row, "ci_high": hi + 1e-4}, 0.9875) is None  # not the stored interval: not re-derived


def test_relevel_keeps_a_kl_held_at_zero_and_recomputes_wilson_and_tango():
    x = np.array([0.001, 0.0001, 0.03, 0.0002])
    lo, hi = jackknife_t_ci(lambda a: a.mean(-1), [x])
    held = {"value": x.mean(), "ci_low": 0.0, "ci_high": hi, "info": {"ci": f"95% {JACKKNIFE}", "n_sequences": 4}}
    assert lo < 0
    got = relevel(held, 0.99)
    want_half = (hi - x.mean()) * stats.t.ppf(0.995, 3) / stats.t.ppf(0.975, 3)
    assert got == pytest.approx((0.0, x.mean() + want_half))
    flips = {"value": 0.0, "ci_low": 0.0, "ci_high": binomial_ci(0, 8)[1], "info": {"n_flipped": 0, "n_items": 8}}
    assert relevel(flips, 0.99) == pytest.approx(binomial_ci(0, 8, 0.99))
    lo, hi = paired_difference_ci(2, 1, 12)
    tango = {"value": -1 / 12, "ci_low": lo, "ci_high": hi, "info": {"ci": TANGO, "n": 12}}
    assert relevel(tango, 0.99) == pytest.approx(paired_difference_ci(2, 1, 12, 0.99))
    assert relevel({**tango, "info": {"ci": "a bootstrap"}}, 0.99) is None  # a kind it cannot re-derive
