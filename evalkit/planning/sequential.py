"""The sequential rule of ``sweep --resolve``: alpha split over the planned looks, and a stored interval
re-derived at the stage's level.

The rule. ``sweep --resolve`` grows the evidence of a criterion whose 95 % interval straddles its limit
in stages (its windows, sequences or items doubled each stage), looking at the interval after each.
Looking again until the interval clears the limit inflates the error: a criterion whose true value sits
at the limit is called "inside" at some look far more often than the 2.5 % one look allows. So the
overall alpha (0.05, two-sided: 2.5 % per side, as one look of the report) is split equally over the
``K + 1`` looks planned before the first one (stage 0, the store's own run, and ``K`` growth stages):
each look's interval is at level ``1 - alpha / (K + 1)`` (Bonferroni; a constant boundary like
Pocock's, made conservative by the union bound rather than computed from the looks' correlation). By
the union bound the chance that *any* look of a criterion at the limit calls it inside is at most
``(K + 1) x alpha / (2 (K + 1)) = alpha / 2``, whichever look's verdict the report keeps, with no
assumption on how the looks depend on each other (they share windows: stage k's windows include stage
k - 1's). The price is width: at K = 3 each look is at 98.75 % (z 2.50 instead of 1.96).

What it covers. The guarantee is for the resolve procedure committed to before its first look, stage 0
included (stage 0's interval at the split level straddles whenever its 95 % one does, so resolve's
decisions are those of that procedure). A criterion the plain report had already resolved at 95 % was
judged at full level and is not revisited; the two-step "read the report, resolve what straddles"
therefore has a false-inside rate of at most 2.5 % + K/(K+1) x 2.5 % in the worst case;
``tests/planning/test_sequential.py`` measures both.

Re-deriving an interval. A stored row keeps its 95 % interval, not its units, so each kind of interval
is re-derived from what its row records, and the derivation is first checked to give back the stored
95 % interval (to 1e-6 of its width); a row that fails the check, or whose kind is not one of these,
gets no interval (the criterion stays unresolved, and the note says so):

* Student's t over windows or sequences (the studentized jackknife, ``t(n-1) x SE``), widened in
  quadrature by the float spread's ``t(R-1) x SD x sqrt(1 + 1/R)`` where the row has one: each term's
  quantile is replaced by the stage level's; a KL interval held at 0 stays held at 0;
* a perplexity or decode KL mean (``kl_mean``, ``free_kl_mean``) carrying that t interval: its low end as
  above, its high end the skew-calibrated ``value + sqrt((c(n) x SE)**2 + float term**2)``
  (:mod:`evalkit.evals.skew_bound`, ``c(n)`` at the stage's level), the bound the report reads at 95 %
  (:mod:`evalkit.report.kl_bound`), since t's high end misses 12-17 % at n = 4 on skewed KL;
* Wilson's interval of a proportion (``n_flipped`` / ``n_items``, or a retrieval accuracy's ``n``);
* Tango's score interval of a paired yes/no change: the discordant counts (b, c) are the only pair
  with ``c - b = n x value`` whose 95 % interval is the stored one; the interval is recomputed at the
  stage level.
"""

from __future__ import annotations

import ast
import math

from scipy import stats

ALPHA = 0.05  # two-sided, over all the looks of a criterion
JACKKNIFE = "studentized jackknife (t, n-1 df)"
KL_EVALS = ("perplexity", "decode")  # the evaluations whose stored KL rows carry Student's t
KL_METRICS = ("kl_mean", "free_kl_mean")  # right-skewed non-negative means (the max_kl criteria read kl_mean)
TANGO = "Tango score interval"


def look_level(stages: int, alpha: float = ALPHA) -> float:
    """The confidence level of each of the ``stages + 1`` looks (stage 0 and ``stages`` growth stages)."""
    if stages < 0:
        raise ValueError(f"stages must be >= 0, got {stages}")
    return 1.0 - alpha / (stages + 1)


def _t(level: float, df: float) -> float:
    return float(stats.t.ppf(1 - (1 - level) / 2, df))


def _close(a, b, width: float) -> bool:
    if a is None or b is None:
        return False
    return abs(float(a) - float(b)) <= 1e-6 * max(width, 1e-12) + 1e-12


def _t_parts(row: dict):
    """(n, value, SE over units, the float term's (SD, R) or None, held at 0) of a stored Student's t row,
    checked to give back its stored 95 % interval (to 1e-6 of its width); None when it cannot be read."""
    info = row.get("info") or {}
    n = info.get("n_windows", info.get("n_sequences"))
    lo, hi, value = row.get("ci_low"), row.get("ci_high"), row.get("value")
    if not isinstance(n, int) or n < 2 or lo is None or hi is None or value is None:
        return None
    width = float(hi) - float(lo)
    t95 = _t(0.95, n - 1)
    noise = None
    sampling = info.get("ci_sampling")
    if sampling is not None:
        noise = info.get("float_noise")
        if isinstance(noise, str):  # a store that kept it as text
            noise = ast.literal_eval(noise)
        if not isinstance(noise, dict) or "sd" not in noise or "seeds" not in noise:
            return None
        se = (sampling[1] - sampling[0]) / 2 / t95
        noise = (float(noise["sd"]), len(noise["seeds"]) + 1)
    else:
        se = (float(hi) - float(value)) / t95
    held = float(lo) == 0.0 and float(value) - (float(hi) - float(value)) < 0  # a KL held at 0
    parts = (n, float(value), se, noise, held)
    back = _from_parts(parts, 0.95)
    if not (_close(back[0], lo, width) and _close(back[1], hi, width)):
        return None
    return parts


def _float_half(noise, level: float) -> float:
    """The float spread's half-width ``t(R-1) x SD x sqrt(1 + 1/R)`` at ``level`` (0 without one)."""
    if noise is None:
        return 0.0
    sd, r = noise
    return _t(level, r - 1) * sd * math.sqrt(1 + 1 / r)


def _from_parts(parts, level: float) -> tuple[float, float]:
    n, value, se, noise, held = parts
    half = math.hypot(_t(level, n - 1) * se, _float_half(noise, level))
    low = value - half
    return (max(low, 0.0) if held else low, value + half)


def _t_interval(row: dict, level: float) -> tuple[float, float] | None:
    parts = _t_parts(row)
    return None if parts is None else _from_parts(parts, level)


def skewed_kl_interval(row: dict, level: float) -> tuple[float, float, float, int] | None:
    """(low, high, c(n), n) of a stored KL row's interval at ``level``: the low end Student's t re-derived
    as :func:`relevel` does; the high end ``value + sqrt((c(n) x SE)**2 + float term**2)``, the
    skew-calibrated bound of :mod:`evalkit.evals.skew_bound`. None when the row's t interval cannot be
    read back (module docstring)."""
    from evalkit.evals.skew_bound import skew_factor

    parts = _t_parts(row)
    if parts is None:
        return None
    n, value, se, noise, _ = parts
    c = skew_factor(n, level)
    return (_from_parts(parts, level)[0], value + math.hypot(c * se, _float_half(noise, level)), c, n)


def is_skewed_kl_row(row: dict) -> bool:
    """A perplexity or decode KL mean (:data:`KL_METRICS`) whose stored interval, as its ``info["ci"]``
    names it, is Student's t or the percentile bootstrap (not already skew-aware): its high end is optimistic
    under the skew of per-unit KL. (A bootstrap interval cannot be read back: the report drops it.)"""
    from evalkit.evals.stats import SKEWED_MARK

    text = str((row.get("info") or {}).get("ci", ""))
    named = JACKKNIFE in text or "bootstrap" in text
    return row.get("eval") in KL_EVALS and row.get("metric") in KL_METRICS and named and SKEWED_MARK not in text


def _wilson(k: int, n: int, lo, hi, level: float) -> tuple[float, float] | None:
    from evalkit.evals.stats import binomial_ci

    if n <= 0 or not 0 <= k <= n:
        return None
    back = binomial_ci(k, n)
    width = float(hi) - float(lo)
    if not (_close(back[0], lo, width) and _close(back[1], hi, width)):
        return None
    return binomial_ci(k, n, level)


def _tango(row: dict, level: float) -> tuple[float, float] | None:
    from evalkit.evals.paired_binary import paired_difference_ci

    info = row.get("info") or {}
    n, value, lo, hi = info.get("n"), row.get("value"), row.get("ci_low"), row.get("ci_high")
    if not isinstance(n, int) or n < 1 or value is None or lo is None or hi is None:
        return None
    net = round(float(value) * n)  # c - b
    if abs(net - float(value) * n) > 1e-6:
        return None
    width = float(hi) - float(lo)
    found = [
        (b, b + net)
        for b in range(max(0, -net), n + 1)
        if b + (b + net) <= n
        and all(_close(x, y, width) for x, y in zip(paired_difference_ci(b, b + net, n), (lo, hi)))
    ]
    if len(found) != 1:
        return None
    return paired_difference_ci(*found[0], n, level)


def relevel(row: dict, level: float) -> tuple[float, float] | None:
    """The interval of a stored metric ``row`` (a store's record: value, ci_low, ci_high, info) at
    ``level``, re-derived from what the row records (module docstring); None when it cannot be."""
    if row.get("ci_low") is None or row.get("ci_high") is None:
        return None
    if any(isinstance(x, float) and math.isnan(x) for x in (row["ci_low"], row["ci_high"])):
        return None
    info = row.get("info") or {}
    text = str(info.get("ci", ""))
    if JACKKNIFE in text and is_skewed_kl_row(row):
        got = skewed_kl_interval(row, level)
        return None if got is None else got[:2]
    if JACKKNIFE in text:
        return _t_interval(row, level)
    if TANGO in text:
        return _tango(row, level)
    if "n_flipped" in info and "n_items" in info:
        return _wilson(int(info["n_flipped"]), int(info["n_items"]), row["ci_low"], row["ci_high"], level)
    if text == "wilson" and isinstance(info.get("n"), int) and row.get("value") is not None:
        n = info["n"]
        k = round(float(row["value"]) * n)
        return _wilson(k, n, row["ci_low"], row["ci_high"], level) if abs(k - float(row["value"]) * n) < 1e-6 else None
    return None
