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
run). Per metric and token group that gives R = N + 1 realisations ``v_0`` (the unperturbed run)
... ``v_N``. None of them is privileged (the unperturbed weights are one draw of the rounding, like
the others), so the row's value is their **mean** ``m``, the unperturbed run's ``v_0`` kept in its
info. With ``s`` their sample standard deviation (R - 1 degrees of freedom):

    combined interval = m -/+ sqrt(h_lo**2 + (t * s * sqrt(1 + 1/R))**2),  (same with h_hi)

where ``h_lo``, ``h_hi`` are the half-widths of the 95 % interval over windows of the unperturbed run
(:mod:`evalkit.evals.stats`) and ``t`` is Student's 0.975 quantile with R - 1 degrees of freedom (3.18
for 3 seeds): the window-sampling and float-rounding errors are independent and add in quadrature,
``t`` (not 1.96) pays for estimating the float SD from few reruns, and ``sqrt(1 + 1/R)`` makes it a
prediction interval for ONE more realisation around the mean of R. The interval therefore says where
another float realisation of the same scheme (another processor, BLAS, engine: the one an operator
runs) would land, over the population of windows, not only where the mean over these windows would.
It does not grow with the number of seeds (an extreme over seeds would).

The row keeps ``m`` as its value, the combined interval as ``ci_low``/``ci_high``, and in its info
``float_noise``: the seeds, their values, the unperturbed value, ``s``, ``t``, the range over all
realisations and the ulps, and ``ci_sampling``: the windows-only interval of the unperturbed run.

Paired order of two rows (:func:`paired_difference`): every scheme is scored on the same windows and
the same weight copies, so the difference of two rows' Δppl is formed per realisation and per window
(their ``info["units"]``, :func:`units_info`). Its interval counts the float spread ONCE: the
per-window, per-realisation differences (linearized: ``W / T x (e^La x da - e^Lb x db)``, whose mean
over windows is the first-order change of ``Δppl_a - Δppl_b``) are a windows x realisations table,
and a two-way random-effects analysis of variance of that table gives the variance of its mean,

    Var = (MS_windows + MS_realisations - MS_residual) / (R x W)   (floored at the larger of the first two),

with Satterthwaite's degrees of freedom. The target is the difference's mean over the population of
windows AND of float realisations (another text, another processor's rounding), not one more
realisation on these windows. (The earlier interval took the jackknife over windows of the
realisation means, which already carry the float noise, and added the realisations' spread on top:
float noise counted twice.) With one realisation it is the studentized jackknife over windows as
before. Two rows are ordered when that interval excludes 0, however much their marginal intervals
overlap; the interval's standard error, degrees of freedom and two-sided p-value are in its info, so
a family of pairs can be adjusted (:mod:`evalkit.report.order`: Holm).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

METHOD = (
    "the mean of the realisations -/+ the windows interval's half-widths and t(0.975, R-1) x SD x sqrt(1 + 1/R) "
    "over the unperturbed run and the perturbed-weight reruns, added in quadrature"
)


def t_quantile(n: int) -> float:
    """Student's 0.975 quantile with ``n - 1`` degrees of freedom (``n`` realisations, at least 2)."""
    if n < 2:
        raise ValueError(f"a spread needs at least 2 realisations, got {n}")
    return float(stats.t.ppf(0.975, n - 1))


def combine(
    value: float, ci: tuple[float | None, float | None], reruns: Sequence[float], seeds: Sequence[int], ulps: float
) -> tuple[float, tuple[float | None, float | None], dict]:
    """(the row's value, its combined interval, its ``float_noise`` info with ``ci_sampling``) for a row
    whose unperturbed run gives ``value`` with the interval over windows ``ci``, and the perturbed
    copies ``seeds`` give ``reruns`` (see the module docstring). Without an interval over windows the
    float term alone makes the interval."""
    values = np.array([value, *reruns], dtype=np.float64)
    info = {"seeds": [int(x) for x in seeds], "values": [float(v) for v in reruns], "unperturbed": float(value)}
    if not np.all(np.isfinite(values)):  # a NaN realisation (an empty group): no mean, no spread
        return value, ci, {**info, "sd": None, "ci_sampling": ci}
    mean = float(values.mean())
    s = float(values.std(ddof=1))
    t = t_quantile(len(values))
    lo, hi = ci
    h_lo = 0.0 if lo is None else value - lo
    h_hi = 0.0 if hi is None else hi - value
    f = t * s * math.sqrt(1 + 1 / len(values))
    combined = (mean - math.hypot(h_lo, f), mean + math.hypot(h_hi, f))
    info.update(
        sd=s,
        t=t,
        range=float(values.max() - values.min()),
        ulps=float(ulps),
        method=METHOD,
        ci_sampling=ci,
    )
    return mean, combined, info


def units_info(tokens, d_sums, reruns: Sequence[tuple[int, Sequence]] = ()) -> dict:
    """The per-window numbers of a Δppl row that a paired comparison needs: the scored tokens and,
    per realisation (seed 0 the unperturbed run, then each rerun's seed), the sum of the NLL change.
    ``reruns``: (seed, window sums as built by the eval: [count, nll, base, ...])."""
    rows = [np.asarray(d_sums, np.float64)] + [np.asarray(a[1], np.float64) - np.asarray(a[2]) for _, a in reruns]
    return {
        "unit": "window",
        "tokens": [int(c) for c in np.asarray(tokens)],
        "seeds": [0, *(int(seed) for seed, _ in reruns)],
        "d_sum": [[float(x) for x in r] for r in rows],
    }


def _delta(tokens: np.ndarray, d: np.ndarray) -> np.ndarray:
    return np.expm1(d.sum(-1) / tokens.sum(-1))


def paired_difference(
    units_a: dict, units_b: dict, method: str = "t", confidence: float = 0.95
) -> tuple[float, float, float, dict]:
    """(difference, low, high, info) of Δppl_a - Δppl_b (fractions) over the same windows and the same
    realisations, at ``confidence`` (see the module docstring); ``info``: the interval's text, the
    realisations, and where the interval is a t interval its ``se``, ``df`` and two-sided ``p`` (of a
    zero difference). ValueError when the two rows were not measured on the same windows and weight
    copies."""
    from evalkit.evals.stats import interval_text, unit_interval

    if units_a["tokens"] != units_b["tokens"] or units_a["seeds"] != units_b["seeds"]:
        raise ValueError("the two rows were not measured on the same windows and weight copies: no paired difference")
    tokens = np.asarray(units_a["tokens"], np.float64)
    da, db = np.asarray(units_a["d_sum"], np.float64), np.asarray(units_b["d_sum"], np.float64)
    diffs = _delta(tokens, da) - _delta(tokens, db)  # one per realisation
    value = float(diffs.mean())
    info = {"ci": interval_text(method, "windows"), "realisations": len(diffs)}
    n_windows = len(tokens)
    if n_windows < 2:
        return value, math.nan, math.nan, info
    if len(diffs) >= 2 and method != "t":
        raise ValueError(f"the paired interval over windows x realisations is a t interval, not {method!r}")
    if len(diffs) < 2:  # one realisation: the interval over windows
        mean_a, mean_b = da.mean(0), db.mean(0)
        lo, hi = unit_interval(
            lambda c, x, y: _delta(c, x) - _delta(c, y), [tokens, mean_a, mean_b], method=method, confidence=confidence
        )
        if method == "t" and not np.isnan(lo):
            df = n_windows - 1
            se = (hi - lo) / (2 * float(stats.t.ppf(0.5 + confidence / 2, df)))
            info.update(se=se, df=float(df), p=_two_sided_p(value, se, df))
        return value, lo, hi, info
    se, df = _two_way_se(tokens, da, db)
    t = float(stats.t.ppf(0.5 + confidence / 2, df))
    info["ci"] = (
        f"{int(round(100 * confidence))}% t over {n_windows} windows x {len(diffs)} float realisations (two-way "
        "random effects, Satterthwaite df): the mean over windows and float realisations"
    )
    info.update(se=se, df=df, p=_two_sided_p(value, se, df))
    return value, value - t * se, value + t * se, info


def _two_sided_p(value: float, se: float, df: float) -> float:
    if se <= 0 or not math.isfinite(se):
        return 0.0 if value != 0 else 1.0
    return float(2 * stats.t.sf(abs(value) / se, df))


def _two_way_se(tokens: np.ndarray, da: np.ndarray, db: np.ndarray) -> tuple[float, float]:
    """(standard error, Satterthwaite degrees of freedom) of the mean of the linearized windows x
    realisations table of Δppl_a - Δppl_b (see the module docstring)."""
    r, w = da.shape
    total = tokens.sum()
    ga, gb = math.exp(float(da.sum(-1).mean() / total)), math.exp(float(db.sum(-1).mean() / total))
    z = w * (ga * da - gb * db) / total  # realisations x windows; its row means: the linearized differences
    grand = z.mean()
    by_r, by_w = z.mean(1), z.mean(0)
    ms_r = w * float(np.sum((by_r - grand) ** 2)) / (r - 1)
    ms_w = r * float(np.sum((by_w - grand) ** 2)) / (w - 1)
    resid = z - by_r[:, None] - by_w[None, :] + grand
    ms_e = float(np.sum(resid**2)) / ((r - 1) * (w - 1))
    combined = ms_w + ms_r - ms_e
    if combined >= max(ms_w, ms_r):
        den = ms_w**2 / (w - 1) + ms_r**2 / (r - 1) + ms_e**2 / ((r - 1) * (w - 1))
        df = combined**2 / den if den > 0 else float(w - 1)
        return math.sqrt(combined / (r * w)), float(df)
    # a negative component estimate: the larger mean square alone (conservative), with its own df
    ms, df = (ms_w, w - 1) if ms_w >= ms_r else (ms_r, r - 1)
    return math.sqrt(ms / (r * w)), float(df)


def ci_text(method: str, n_seeds: int) -> str:
    """The row's ``info["ci"]``: what its interval is (``method``: :data:`evalkit.evals.stats.METHODS`)."""
    from evalkit.evals.stats import interval_text

    text = interval_text(method, "windows")
    if not n_seeds:
        return f"{text}, without float spread (float_noise_seeds 0)"
    return (
        f"{text}, widened by the float spread of {n_seeds} perturbed-weight reruns (t x SD x sqrt(1 + 1/R), in "
        f"quadrature); the value is the mean of the {n_seeds + 1} realisations"
    )
