"""The paired Δppl difference of two rows counts the float spread once
(:func:`evalkit.evals.perplexity.float_spread.paired_difference`): one variance over the windows x
realisations table, checked against a plain two-way analysis of variance written out here, and its
coverage of the mean over windows and float realisations measured by simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from evalkit.evals.perplexity.float_spread import paired_difference

TOKENS = 512.0


def table_units(x: np.ndarray) -> dict:
    """Units of a row whose per-token mean NLL change is ``x`` (realisations x windows)."""
    r, w = x.shape
    return {"unit": "window", "tokens": [TOKENS] * w, "seeds": list(range(r)), "d_sum": (x * TOKENS).tolist()}


def plain_two_way(z: np.ndarray) -> tuple[float, float]:
    """(SE of the grand mean, Satterthwaite df) by the textbook random-effects ANOVA, loop by loop."""
    r, w = z.shape
    grand = sum(z[i, j] for i in range(r) for j in range(w)) / (r * w)
    row = [sum(z[i, j] for j in range(w)) / w for i in range(r)]
    col = [sum(z[i, j] for i in range(r)) / r for j in range(w)]
    ss_r = sum(w * (row[i] - grand) ** 2 for i in range(r))
    ss_w = sum(r * (col[j] - grand) ** 2 for j in range(w))
    ss_e = sum((z[i, j] - row[i] - col[j] + grand) ** 2 for i in range(r) for j in range(w))
    ms_r, ms_w, ms_e = ss_r / (r - 1), ss_w / (w - 1), ss_e / ((r - 1) * (w - 1))
    v = ms_w + ms_r - ms_e
    df = v**2 / (ms_w**2 / (w - 1) + ms_r**2 / (r - 1) + ms_e**2 / ((r - 1) * (w - 1)))
    return math.sqrt(v / (r * w)), df


def test_the_interval_is_the_two_way_anova_of_the_linearized_table():
    rng = np.random.default_rng(3)
    xb = 0.01 + rng.normal(0, 0.01, (1, 5)) + rng.normal(0, 0.002, (3, 5))
    xa = xb + 0.004 + rng.normal(0, 0.003, (1, 5)) + rng.normal(0, 0.002, (3, 1)) + rng.normal(0, 0.001, (3, 5))
    value, lo, hi, info = paired_difference(table_units(xa), table_units(xb))
    ma, mb = xa.mean(1), xb.mean(1)  # per realisation, equal tokens per window
    assert value == pytest.approx(float(np.mean(np.expm1(ma) - np.expm1(mb))), rel=1e-12)
    ga, gb = math.exp(ma.mean()), math.exp(mb.mean())
    se, df = plain_two_way(ga * xa - gb * xb)  # the first-order change of expm1(mean) per cell
    assert info["se"] == pytest.approx(se, rel=1e-10) and info["df"] == pytest.approx(df, rel=1e-10)
    t = stats.t.ppf(0.975, df)
    assert (lo, hi) == pytest.approx((value - t * se, value + t * se), rel=1e-10)
    assert info["p"] == pytest.approx(2 * stats.t.sf(abs(value) / se, df), rel=1e-10)
    assert "windows x 3 float realisations" in info["ci"]


def test_one_realisation_keeps_the_jackknife_over_windows():
    rng = np.random.default_rng(4)
    xb = 0.01 + rng.normal(0, 0.01, (1, 6))
    xa = xb + 0.003 + rng.normal(0, 0.002, (1, 6))
    value, lo, hi, info = paired_difference(table_units(xa), table_units(xb))
    d = np.expm1(xa[0].mean()) - np.expm1(xb[0].mean())
    # the jackknife of a difference of expm1(mean): leave-one-out values, Student's t with n - 1 df
    loo = np.array([np.expm1(np.delete(xa[0], k).mean()) - np.expm1(np.delete(xb[0], k).mean()) for k in range(6)])
    se = math.sqrt(5 / 6 * float(np.sum((loo - loo.mean()) ** 2)))
    t = stats.t.ppf(0.975, 5)
    assert value == pytest.approx(d) and (lo, hi) == pytest.approx((d - t * se, d + t * se), rel=1e-9)
    assert info["se"] == pytest.approx(se, rel=1e-9) and info["df"] == 5


def coverage(r: int, w: int, sd_window: float, sd_float: float, sd_cell: float, n: int = 800, seed: int = 0):
    """(coverage, low-end miss, high-end miss, median width) of the 95 % interval for the difference's
    mean over windows and float realisations, over ``n`` simulated stores."""
    rng = np.random.default_rng(seed)
    delta = 0.005
    target = math.expm1(0.01 + delta) - math.expm1(0.01)
    lo_miss = hi_miss = 0
    widths = []
    for _ in range(n):
        xb = 0.01 + rng.normal(0, 0.01, (1, w)) + rng.normal(0, 0.002, (r, 1)) + rng.normal(0, 0.002, (r, w))
        d = delta + rng.normal(0, sd_window, (1, w)) + rng.normal(0, sd_float, (r, 1)) + rng.normal(0, sd_cell, (r, w))
        _, lo, hi, _ = paired_difference(table_units(xb + d), table_units(xb))
        lo_miss += target < lo
        hi_miss += target > hi
        widths.append(hi - lo)
    return 1 - (lo_miss + hi_miss) / n, lo_miss / n, hi_miss / n, float(np.median(widths))


@pytest.mark.parametrize(
    "r, w, sd_window, sd_float, sd_cell",
    [
        (4, 4, 0.008, 0.001, 0.002),  # the published default's shape: windows dominate
        (4, 4, 0.001, 0.008, 0.002),  # the float realisations dominate
        (4, 8, 0.004, 0.004, 0.004),
        (2, 4, 0.004, 0.004, 0.004),
    ],
)
def test_the_interval_covers_its_target_once(r, w, sd_window, sd_float, sd_cell):
    """Coverage within simulation error of 95 % (conservative where a variance component estimate is
    floored), each end missing at most about its 2.5 %. With 2,000 stores per cell (seed 0) the four cells
    covered 0.954, 0.948, 0.949 and 0.960."""
    cover, lo_miss, hi_miss, _ = coverage(r, w, sd_window, sd_float, sd_cell)
    assert 0.93 <= cover <= 0.985, cover
    assert lo_miss <= 0.04 and hi_miss <= 0.04, (lo_miss, hi_miss)


def test_the_float_spread_is_no_longer_counted_twice():
    """The former interval (the jackknife of the realisation means, widened by t x s x sqrt(1 + 1/R) of the
    realisations' differences) over-covered (0.998 at 2,000 stores in this cell) at twice the width."""
    cover, _, _, width = coverage(4, 4, 0.004, 0.004, 0.004, n=300, seed=1)
    rng = np.random.default_rng(1)
    old_widths = []
    for _ in range(100):  # the former construction, written out
        xb = 0.01 + rng.normal(0, 0.01, (1, 4)) + rng.normal(0, 0.002, (4, 1)) + rng.normal(0, 0.002, (4, 4))
        d = 0.005 + rng.normal(0, 0.004, (1, 4)) + rng.normal(0, 0.004, (4, 1)) + rng.normal(0, 0.004, (4, 4))
        xa = xb + d
        ma, mb = xa.mean(0), xb.mean(0)  # realisation means per window
        loo = np.array([np.expm1(np.delete(ma, k).mean()) - np.expm1(np.delete(mb, k).mean()) for k in range(4)])
        h = stats.t.ppf(0.975, 3) * math.sqrt(3 / 4 * float(np.sum((loo - loo.mean()) ** 2)))
        diffs = np.expm1(xa.mean(1)) - np.expm1(xb.mean(1))
        f = stats.t.ppf(0.975, 3) * diffs.std(ddof=1) * math.sqrt(1 + 1 / 4)
        old_widths.append(2 * math.hypot(h, f))
    assert cover >= 0.93 and width < 0.8 * float(np.median(old_widths)), (cover, width, np.median(old_widths))
