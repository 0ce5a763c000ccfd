"""Paired per-token statistics for holding one implementation against another, inside float noise.

Two runs of the same evaluation (an engine and evalkit's emulation of it) each give, per scored
token t, a change ``d(t) = nll_scheme(t) - nll_baseline(t)`` against their own unquantized run.
What decides whether they agree is

* the **gap** ``Δppl_a - Δppl_b`` in percentage points, ``Δppl = 100 * expm1(mean d)``;
* the per-token **Pearson r** of ``d_a`` against ``d_b``.

Intervals: a paired **block bootstrap** (:class:`BlockBootstrap`). The tokens are cut into
contiguous blocks of ``block`` tokens that never cross a window; a resample draws as many blocks
as there are, with replacement, keeping each block's tokens of both runs together, and the
statistics are recomputed from the drawn blocks' sums (exact, vectorized). Blocks, not tokens,
because neighbouring tokens' changes are correlated (a K/V code flipped at position t moves the
attention of every later position of its window); blocks, not windows, because a conformance run
has only a few windows (4), too few for a window bootstrap. Percentile intervals, seeded.

Noise: the same emulation on weight copies perturbed by a few ulps of their own dtype
(:mod:`evalkit.evals.float_noise`), one run per seed. Under the hypothesis "the engine is one more
float realisation of the emulation", the engine's gap and r have the distribution of the seeds'
``gap_s = Δppl_s - Δppl_emu`` and ``r_s = r(d_s, d_emu)``. :func:`noise_quantiles` gives the 95th
percentile of ``|gap_s|`` and the 5th percentile of ``r_s`` (numpy's linear percentile): a
quantile, which settles as seeds are added, where the extreme would only grow.

Verdict (:func:`verdict`), with ``q`` the noise gap quantile, ``q_r`` the noise r quantile,
``[lo, hi]`` the gap interval, ``r_hi`` the top of r's interval and ``tol`` the tolerance (0.25 pp):

* **differs** when ``[lo, hi]`` lies entirely outside ``[-q, q]``, or ``r_hi < q_r``: even the near
  end of the interval is further than float rounding alone moves the result (conservative: the
  interval already carries the per-token float noise, and the noise quantile counts it again);
* **conforms** when ``[lo, hi]`` lies inside ``[-m, m]``, ``m = max(tol, q)`` (no tolerance finer
  than float noise can be claimed), and ``r_hi >= q_r``; checked first, so a gap that is real but
  inside the tolerance conforms;
* otherwise **cannot tell at this n**. The interval's half-width ``h`` shrinks as ``1/sqrt(n)``;
  :func:`tokens_to_resolve` gives the n at which the interval is ``tol`` wide in all
  (``n * (h / (tol / 2))**2``): two gaps ``tol`` apart then give disjoint intervals.
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass

import numpy as np

BLOCK = 32  # tokens per bootstrap block: the changes' autocorrelation at lags 1-32 measured within +-0.11 (a conservative length)
RESAMPLES = 2000
SEED = 0
CONFIDENCE = 0.95
TOLERANCE_PP = 0.25  # the gap a reader cares about, in percentage points
NOISE_GAP_QUANTILE = 95.0  # percentile of |gap_s|
NOISE_R_QUANTILE = 5.0  # percentile of r_s


class Verdict(str, enum.Enum):
    CONFORMS = "conforms"
    DIFFERS = "differs"
    CANNOT_TELL = "cannot tell at this n"


def block_ids(window_offsets, block: int = BLOCK) -> np.ndarray:
    """A block number per token: consecutive ``block`` tokens of one window (a window's last block may be shorter)."""
    offsets = np.asarray(window_offsets, np.int64)
    if block < 1 or offsets.ndim != 1 or len(offsets) < 2 or np.any(np.diff(offsets) <= 0):
        raise ValueError("window offsets must increase from 0 and the block must be at least 1 token")
    ids, first = [], 0
    for lo, hi in zip(offsets[:-1], offsets[1:]):
        local = np.arange(hi - lo) // block
        ids.append(first + local)
        first += int(local[-1]) + 1
    return np.concatenate(ids)


def dppl_pct(d) -> float:
    """Relative perplexity change in percent from per-token NLL changes: ``100 * expm1(mean d)``."""
    return 100.0 * math.expm1(float(np.mean(np.asarray(d, np.float64))))


def pearson(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    a, b = a - a.mean(), b - b.mean()
    den = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
    return float((a * b).sum() / den) if den > 0 else float("nan")


class BlockBootstrap:
    """Paired block bootstrap over tokens (see the module docstring): one fixed set of block counts
    per resample, shared by every statistic, so intervals of several runs are paired too."""

    def __init__(self, ids: np.ndarray, resamples: int = RESAMPLES, seed: int = SEED):
        self.ids = np.asarray(ids, np.int64)
        self.blocks = int(self.ids.max()) + 1
        rng = np.random.default_rng(seed)
        draws = rng.integers(0, self.blocks, size=(resamples, self.blocks))
        self.counts = np.stack([np.bincount(row, minlength=self.blocks) for row in draws]).astype(np.float64)
        self.resamples, self.seed = resamples, seed

    def sums(self, x) -> np.ndarray:
        """Per resample, the sum of ``x`` over the drawn tokens."""
        return self.counts @ np.bincount(self.ids, weights=np.asarray(x, np.float64), minlength=self.blocks)

    def interval(self, values: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
        a = (1 - confidence) / 2 * 100
        lo, hi = np.percentile(values, [a, 100 - a])
        return float(lo), float(hi)

    def gap_r(self, d_a, d_b) -> tuple[np.ndarray, np.ndarray]:
        """Per resample: the gap ``Δppl(d_a) - Δppl(d_b)`` (pp) and the Pearson r of ``d_a`` with ``d_b``."""
        a, b = np.asarray(d_a, np.float64), np.asarray(d_b, np.float64)
        n = self.sums(np.ones_like(a))
        sa, sb, saa, sbb, sab = (self.sums(x) for x in (a, b, a * a, b * b, a * b))
        gap = 100.0 * (np.expm1(sa / n) - np.expm1(sb / n))
        cov = sab / n - sa * sb / n**2
        var = (saa / n - (sa / n) ** 2) * (sbb / n - (sb / n) ** 2)
        with np.errstate(invalid="ignore", divide="ignore"):
            r = cov / np.sqrt(var)
        return gap, r


@dataclass(frozen=True)
class Comparison:
    """One candidate's change held against a reference's, with intervals, the noise and the verdict."""

    gap_pp: float
    gap_low: float
    gap_high: float
    r: float
    r_low: float
    r_high: float
    noise_gap_pp: float  # the NOISE_GAP_QUANTILE of |gap_s|
    noise_r: float  # the NOISE_R_QUANTILE of r_s
    n_tokens: int
    n_to_resolve: int  # scored tokens for a gap interval TOLERANCE_PP wide
    verdict: Verdict

    def as_dict(self) -> dict:
        out = asdict(self)
        out["verdict"] = self.verdict.value
        return out


def noise_quantiles(d_ref, d_noise) -> tuple[float, float, np.ndarray, np.ndarray]:
    """The noise gap quantile (pp), the noise r quantile, and every seed's gap and r against ``d_ref``.
    ``d_noise``: one row of per-token changes per perturbed seed."""
    rows = np.atleast_2d(np.asarray(d_noise, np.float64))
    if rows.shape[0] < 2:
        raise ValueError("a noise quantile needs at least 2 perturbed seeds")
    ref = dppl_pct(d_ref)
    gaps = np.array([dppl_pct(row) - ref for row in rows])
    rs = np.array([pearson(row, d_ref) for row in rows])
    return float(np.percentile(np.abs(gaps), NOISE_GAP_QUANTILE)), float(np.percentile(rs, NOISE_R_QUANTILE)), gaps, rs


def tokens_to_resolve(n: int, half_width: float, tolerance: float = TOLERANCE_PP) -> int:
    """Scored tokens at which a gap interval of half-width ``half_width`` at ``n`` tokens is ``tolerance`` wide."""
    return int(math.ceil(n * (half_width / (tolerance / 2)) ** 2))


def verdict(gap_ci, r_high: float, noise_gap: float, noise_r: float, tolerance: float = TOLERANCE_PP) -> Verdict:
    """The rule of the module docstring."""
    lo, hi = gap_ci
    margin = max(tolerance, noise_gap)
    if -margin <= lo and hi <= margin and r_high >= noise_r:
        return Verdict.CONFORMS
    if lo > noise_gap or hi < -noise_gap or r_high < noise_r:
        return Verdict.DIFFERS
    return Verdict.CANNOT_TELL


def compare(
    d_candidate, d_reference, noise_gap: float, noise_r: float, boot: BlockBootstrap, tolerance: float = TOLERANCE_PP
) -> Comparison:
    """``d_candidate`` (the emulation) against ``d_reference`` (the engine): gap = Δppl candidate - Δppl reference."""
    c, e = np.asarray(d_candidate, np.float64), np.asarray(d_reference, np.float64)
    gaps, rs = boot.gap_r(c, e)
    g_lo, g_hi = boot.interval(gaps)
    r_lo, r_hi = boot.interval(rs[np.isfinite(rs)]) if np.isfinite(rs).any() else (math.nan, math.nan)
    half = (g_hi - g_lo) / 2
    return Comparison(
        gap_pp=dppl_pct(c) - dppl_pct(e),
        gap_low=g_lo,
        gap_high=g_hi,
        r=pearson(e, c),
        r_low=r_lo,
        r_high=r_hi,
        noise_gap_pp=noise_gap,
        noise_r=noise_r,
        n_tokens=len(c),
        n_to_resolve=tokens_to_resolve(len(c), half, tolerance),
        verdict=verdict((g_lo, g_hi), r_hi, noise_gap, noise_r, tolerance),
    )
