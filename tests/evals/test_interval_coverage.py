"""The coverage of evalkit's 95 % intervals, simulated at the published number of units and at 20.

The default grid scores 4 perplexity windows, 4 decode sequences and 4 retrieval prompts per cell
(``published/default/grid.yaml``). An interval called 95 % must cover the true value in 93-97 % of
repeated experiments at that n, and, where a decision reads one end of it (a budget on a loss, a
limit on KL), miss on each side no more than 2.5 % plus the simulation's error.

- Symmetric continuous data (normal; Student's t with 3 degrees of freedom; Laplace): the t interval
  (:func:`evalkit.evals.stats.unit_interval`, its default) of the mean of per-unit values (retrieval
  recall, decode) and of perplexity's Δppl, ``expm1(sum of NLL changes / tokens)`` over windows of
  equal length, whose true value is ``expm1(mu)``. It also shows why the default is not the
  percentile bootstrap: at n = 4 the bootstrap covers about 80 %.
- **Paired yes/no outcomes** (retrieval's exact-match prompts, generation's and LongBench's items): per
  pair right -> wrong with probability ``p10`` and wrong -> right with ``p01``, the true change
  ``p01 - p10``; the interval is :func:`evalkit.evals.retrieval.scoring.difference_ci` (Tango's score
  interval). Each tail is checked, and the decision it feeds: a scheme that loses 5 or 10 % of its
  answers must not read "inside a 2-point budget" (interval's low end at -2 points or above) more
  than 2.5 % of the time.
- **Skewed non-negative means** (KL per window or sequence): lognormal (sigma 0.75 and 1.0) and gamma
  (shape 1, the exponential, and 2) unit values; the interval is
  :func:`evalkit.evals.stats.skewed_mean_ci`. The upper end (what a ``max_kl`` criterion reads) and
  the lower end are each checked. The same cases go through the report's bound for the stored
  perplexity and decode KL rows, which keep Student's t and no units: each draw becomes the row the
  decode evaluation stores (mean, t interval, n), and :func:`evalkit.report.kl_bound.apply` gives the
  interval the report reads (:mod:`evalkit.evals.skew_bound`).

``python -m tests.evals.test_interval_coverage`` prints the table of ``docs/statistics.md``.
"""

from __future__ import annotations

import numpy as np
import pytest

from evalkit.evals.retrieval.scoring import difference_ci
from evalkit.evals.stats import interval_text, skewed_mean_ci, unit_interval
from evalkit.report import kl_bound

PUBLISHED_N = 4  # windows, sequences and prompts per cell in the default grid
LARGER_N = 20
TRIALS = 4000
TAIL = 0.025  # nominal miss rate of each end of a 95 % interval
# (p10, p01): right -> wrong and wrong -> right per pair, up to a 30-point loss and 30 % discordance
BINARY_CELLS = [(0.10, 0.0), (0.05, 0.0), (0.05, 0.05), (0.2, 0.05), (0.3, 0.0)]
# losses of 30-60 points at 50-60 % discordance: in the table, not asserted. A score interval's tail
# rates oscillate on discrete data; there one end misses 3.3-4.9 % at some n (docs/statistics.md), while
# no such loss ever reads "inside" a 2-point budget.
LARGE_LOSS_CELLS = [(0.4, 0.1), (0.5, 0.1), (0.6, 0.0)]
SKEWED = ["lognormal 0.75", "lognormal 1.0", "gamma 1", "gamma 2"]
SKEWED_TRIALS = 2000


def tail_bound(trials: int) -> float:
    """2.5 % plus three simulation standard errors."""
    return TAIL + 3 * np.sqrt(TAIL * (1 - TAIL) / trials)


TOKENS = 511  # scored tokens per window at the default grid's 512-token windows


def _draw(rng, dist: str, size) -> np.ndarray:
    if dist == "normal":
        return rng.standard_normal(size)
    if dist == "t3":
        return rng.standard_t(3, size) / np.sqrt(3.0)  # unit variance
    if dist == "laplace":
        return rng.laplace(size=size) / np.sqrt(2.0)
    raise ValueError(dist)


def coverage(method: str, dist: str, n: int, statistic: str, seed: int = 0, trials: int = TRIALS) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(trials):
        if statistic == "mean":
            x = 0.3 + _draw(rng, dist, n)
            lo, hi = unit_interval(lambda a: a.mean(-1), [x], method=method, seed=int(rng.integers(1 << 30)))
            truth = 0.3
        else:  # Δppl over windows: per-window sums of NLL changes, mean change mu per token
            mu, sd = 0.005, 0.004  # per-window mean change varies by about its size, as FP8 rows' do
            c = np.full(n, float(TOKENS))
            d = (mu + sd * _draw(rng, dist, n)) * TOKENS
            lo, hi = unit_interval(
                lambda c, d: np.expm1(d.sum(-1) / c.sum(-1)), [c, d], method=method, seed=int(rng.integers(1 << 30))
            )
            truth = float(np.expm1(mu))
        hits += lo <= truth <= hi
    return hits / trials


def binary_tails(p10: float, p01: float, n: int, seed: int = 0, trials: int = TRIALS) -> tuple[float, float, float]:
    """(share whose low end is above the truth, share whose high end is below it, share whose low end
    is at -2 points or above: "inside" a 2-point budget) of paired 0/1 outcomes over n pairs."""
    rng = np.random.default_rng(seed)
    truth = p01 - p10
    counts = rng.multinomial(n, [p10, p01, 1 - p10 - p01], size=trials)
    memo: dict = {}
    low_miss = high_miss = inside = 0
    for b, c, _ in counts:
        if (b, c) not in memo:  # right -> wrong b times, wrong -> right c times, the rest unchanged
            baseline = [1] * b + [0] * c + [1] * (n - b - c)
            scheme = [0] * b + [1] * c + [1] * (n - b - c)
            memo[b, c] = difference_ci(scheme, baseline)[1:]
        lo, hi = memo[b, c]
        low_miss += lo > truth + 1e-12
        high_miss += hi < truth - 1e-12
        inside += lo >= -0.02
    return low_miss / trials, high_miss / trials, inside / trials


def _skewed(rng, dist: str, size) -> tuple[np.ndarray, float]:
    kind, parameter = dist.split()
    a = float(parameter)
    if kind == "lognormal":
        return rng.lognormal(0.0, a, size), float(np.exp(a * a / 2))
    return rng.gamma(a, 1.0, size), a


def skewed_tails(dist: str, n: int, seed: int = 0, trials: int = SKEWED_TRIALS) -> tuple[float, float]:
    """(share whose low end is above the true mean, share whose high end is below it) of
    :func:`skewed_mean_ci` over n units of ``dist``; ``t`` the same for the plain t interval."""
    rng = np.random.default_rng(seed)
    low_miss = high_miss = 0
    for _ in range(trials):
        x, truth = _skewed(rng, dist, n)
        lo, hi, _ = skewed_mean_ci(x, np.ones(n))
        low_miss += lo > truth
        high_miss += hi < truth
    return low_miss / trials, high_miss / trials


def stored_kl_row(x: np.ndarray) -> dict:
    """The decode evaluation's stored KL row of per-sequence values ``x``: mean, Student's t interval, n."""
    lo, hi = unit_interval(lambda a: a.mean(-1), [x])
    info = {"ci": interval_text("t", "sequences"), "n_sequences": len(x)}
    return {"eval": "decode", "metric": "kl_mean", "value": float(x.mean()), "ci_low": lo, "ci_high": hi, "info": info}


def report_kl_tails(dist: str, n: int, seed: int = 0, trials: int = SKEWED_TRIALS) -> tuple[float, float]:
    """(low end above the true mean, high end below it) of the interval the report reads for a stored KL
    row (:func:`evalkit.report.kl_bound.apply`) over n units of ``dist``."""
    rng = np.random.default_rng(seed)
    rows, truths = [], []
    for _ in range(trials):
        x, truth = _skewed(rng, dist, n)
        rows.append(stored_kl_row(x))
        truths.append(truth)
    read = kl_bound.apply(rows)
    assert all(kl_bound.MARK in r["info"]["ci"] for r in read)
    low_miss = sum(r["ci_low"] > t for r, t in zip(read, truths))
    high_miss = sum(r["ci_high"] < t for r, t in zip(read, truths))
    return low_miss / trials, high_miss / trials


def t_tails(dist: str, n: int, seed: int = 0, trials: int = SKEWED_TRIALS) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    low_miss = high_miss = 0
    for _ in range(trials):
        x, truth = _skewed(rng, dist, n)
        lo, hi = unit_interval(lambda a: a.mean(-1), [x])
        low_miss += lo > truth
        high_miss += hi < truth
    return low_miss / trials, high_miss / trials


@pytest.mark.slow
@pytest.mark.parametrize("statistic", ["mean", "dppl"])
@pytest.mark.parametrize("dist", ["normal", "t3", "laplace"])
def test_default_interval_covers_95_percent_at_the_published_n(dist, statistic):
    got = coverage("t", dist, PUBLISHED_N, statistic)
    # 4,000 trials: the simulation's own standard error is 0.34 points, inside the 93-97 band's margin
    assert 0.93 <= got <= 0.97, f"{statistic} on {dist} data at n={PUBLISHED_N}: coverage {got:.3f}"


@pytest.mark.slow
def test_percentile_bootstrap_undercovers_at_the_published_n():
    got = coverage("bootstrap", "normal", PUBLISHED_N, "mean", trials=1000)
    assert got < 0.88, (
        f"the bootstrap at n={PUBLISHED_N} covered {got:.3f}: the reason the default is t no longer holds"
    )


@pytest.mark.slow
@pytest.mark.parametrize("n", [PUBLISHED_N, 8, LARGER_N])
@pytest.mark.parametrize("p10,p01", BINARY_CELLS)
def test_paired_yes_no_interval_holds_each_tail(p10, p01, n):
    low, high, inside = binary_tails(p10, p01, n)
    bound = tail_bound(TRIALS)
    assert low <= bound and high <= bound, f"p10={p10} p01={p01} n={n}: tails {low:.3f} / {high:.3f}"
    if p10 - p01 >= 0.05:  # a real loss of 5 points or more must not read "inside" a 2-point budget
        assert inside <= bound, f"a {100 * (p10 - p01):.0f}-point loss reads inside in {inside:.3f} at n={n}"


@pytest.mark.slow
@pytest.mark.parametrize("n", [PUBLISHED_N, LARGER_N])
@pytest.mark.parametrize("dist", SKEWED)
def test_skewed_mean_interval_holds_each_tail(dist, n):
    low, high = skewed_tails(dist, n)
    bound = tail_bound(SKEWED_TRIALS)
    assert low <= bound and high <= bound, f"{dist} at n={n}: tails {low:.3f} / {high:.3f}"


@pytest.mark.slow
@pytest.mark.parametrize("n", [PUBLISHED_N, LARGER_N])
@pytest.mark.parametrize("dist", SKEWED)
def test_the_reports_kl_bound_on_stored_rows_holds_each_tail(dist, n):
    """A stored KL row (Student's t, no units) as the report reads it: each end misses at most 2.5 % plus
    the simulation's error, where the stored t interval's high end misses 7-17 % (the table)."""
    low, high = report_kl_tails(dist, n, seed=1)
    bound = tail_bound(SKEWED_TRIALS)
    assert low <= bound and high <= bound, f"{dist} at n={n}: tails {low:.3f} / {high:.3f}"


def table() -> str:
    """The markdown table of docs/statistics.md."""
    lines = [
        "| outcome | interval | n | low end above truth | high end below truth | loss read inside 2 pts |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for statistic in ("mean", "dppl"):
        for dist in ("normal", "t3", "laplace"):
            got = coverage("t", dist, PUBLISHED_N, statistic)
            lines.append(f"| {statistic}, {dist} | t | {PUBLISHED_N} | coverage {got:.3f} (two-sided) | | |")
    for p10, p01 in [*BINARY_CELLS, *LARGE_LOSS_CELLS]:
        for n in (PUBLISHED_N, 8, LARGER_N):
            low, high, inside = binary_tails(p10, p01, n)
            shown = f"{inside:.3f}" if p10 - p01 >= 0.05 else ""
            cell = f"paired 0/1, p10 {p10}, p01 {p01}"
            lines.append(f"| {cell} | Tango | {n} | {low:.3f} | {high:.3f} | {shown} |")
    for dist in SKEWED:
        for n in (PUBLISHED_N, LARGER_N):
            low, high = skewed_tails(dist, n)
            t_low, t_high = t_tails(dist, n)
            lines.append(f"| {dist} | skewed_mean_ci | {n} | {low:.3f} | {high:.3f} | |")
            lines.append(f"| {dist} | t (before) | {n} | {t_low:.3f} | {t_high:.3f} | |")
            r_low, r_high = report_kl_tails(dist, n, seed=1)
            lines.append(f"| {dist} | report's bound on a stored t row | {n} | {r_low:.3f} | {r_high:.3f} | |")
    return "\n".join(lines)


if __name__ == "__main__":  # the table of docs/statistics.md: python -m tests.evals.test_interval_coverage
    print(table())
    print("mean normal bootstrap:", f"{coverage('bootstrap', 'normal', PUBLISHED_N, 'mean', trials=1000):.3f}")
