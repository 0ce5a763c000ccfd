"""Float-rounding spread in the perplexity eval's intervals: reruns on perturbed weight copies.

Why. The token bootstrap of :mod:`evalkit.evals.stats` resamples windows of ONE float realisation of
the computation. A quantized forward is chaotic in float rounding (a last-bit change moves the K/V
that reach the quantizer, codes flip, flips propagate), so another implementation of the same
arithmetic (another processor, BLAS, engine) lands elsewhere: on the embedded model, weight noise of
a few ulps moves an FP8 E4M3 row's perplexity by more than its effect. An interval that leaves that
out claims an order between rows that the data do not resolve.

What. With ``float_noise_seeds = N`` the eval reruns the baseline AND the scheme on N weight copies
(:func:`evalkit.evals.float_noise.perturbed_model`, seeds 1..N: every weight moved by a few ulps of
its own dtype), each scheme scored against the baseline of its own copy (paired, as the unperturbed
run). Per metric and token group that gives n = N + 1 realisations ``v_0`` (the unperturbed run, the
row's value) ... ``v_N``, their sample standard deviation ``s`` (n - 1 degrees of freedom), and:

    combined interval = v_0 -/+ sqrt(h_lo**2 + (t * s)**2),  sqrt(h_hi**2 + (t * s)**2)

where ``h_lo = v_0 - lo`` and ``h_hi = hi - v_0`` are the two half-widths of the 95 % token-bootstrap
interval and ``t`` is Student's 0.975 quantile with n - 1 degrees of freedom (3.18 for 3 seeds,
2.78 for 4): the token-sampling and the float-rounding errors are independent and add in quadrature,
and ``t`` (not 1.96) pays for estimating the float SD from few reruns. The interval therefore says
where another float realisation of the same scheme on the same tokens would land, not only where the
mean over windows would. It does not grow with the number of seeds (an extreme over seeds would).

The row keeps ``v_0`` as its value, the combined interval as ``ci_low``/``ci_high``, and in its info
``float_noise``: the seeds, their values, ``s``, ``t``, the range over all realisations and the ulps,
and ``ci_bootstrap``: the token-only interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

CI_TEXT = "95% paired percentile bootstrap over windows"
METHOD = (
    "token-bootstrap half-widths and t(0.975, n-1) x the SD over the unperturbed run and the perturbed-weight "
    "reruns, added in quadrature"
)


def t_quantile(n: int) -> float:
    """Student's 0.975 quantile with ``n - 1`` degrees of freedom (``n`` realisations, at least 2)."""
    if n < 2:
        raise ValueError(f"a spread needs at least 2 realisations, got {n}")
    return float(stats.t.ppf(0.975, n - 1))


def combine(
    value: float, ci: tuple[float | None, float | None], reruns: Sequence[float], seeds: Sequence[int], ulps: float
) -> tuple[tuple[float | None, float | None], dict]:
    """(the combined interval, the row's ``float_noise`` info) for a row of value ``value`` (the
    unperturbed run), token-bootstrap interval ``ci`` and the values ``reruns`` of the perturbed
    copies ``seeds`` (see the module docstring). Without a bootstrap interval the float term alone
    makes the interval."""
    values = np.array([value, *reruns], dtype=np.float64)
    s = float(values.std(ddof=1))
    t = t_quantile(len(values))
    lo, hi = ci
    h_lo = 0.0 if lo is None else value - lo
    h_hi = 0.0 if hi is None else hi - value
    if not math.isfinite(s):  # a NaN rerun (an empty group): no spread to add
        return ci, {"seeds": list(seeds), "values": [float(v) for v in reruns], "sd": None}
    combined = (value - math.hypot(h_lo, t * s), value + math.hypot(h_hi, t * s))
    info = {
        "seeds": [int(x) for x in seeds],
        "values": [float(v) for v in reruns],
        "sd": s,
        "t": t,
        "range": float(values.max() - values.min()),
        "ulps": float(ulps),
        "method": METHOD,
    }
    return combined, info


def ci_text(n_seeds: int) -> str:
    """The row's ``info["ci"]``: what its interval is."""
    if not n_seeds:
        return CI_TEXT
    return f"{CI_TEXT}, widened by the float spread of {n_seeds} perturbed-weight reruns (t x SD, in quadrature)"
