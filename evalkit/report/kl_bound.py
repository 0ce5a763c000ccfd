"""The KL rows as the report reads them: the high end of their interval skew-calibrated, from the stored row.

Why. The perplexity and decode evaluations store each KL mean (``kl_mean``, ``free_kl_mean``) with
Student's t interval over windows or sequences. Per-unit KL is right-skewed, and there t's high end,
the end a ``max_kl`` criterion reads, misses the true mean 12-17 % of the time at n = 4 and about 10 %
at n = 20, against 2.5 % (``docs/statistics.md``). The stores keep the mean, n and the interval, not the
per-unit values (so :func:`evalkit.evals.stats.skewed_mean_ci` cannot be applied to them), and re-making
their runs with another interval would change every run id. So the report replaces the high end of each
such row, as it loads the store, by the skew-calibrated bound ``value + sqrt((c(n) x SE)**2 + float
term**2)`` (:mod:`evalkit.evals.skew_bound`; SE and the float term read back from the stored interval,
which is first checked to be given back: :func:`evalkit.planning.sequential.skewed_kl_interval`). The low
end stays the stored t's. Every table, plot, verdict and ``sweep --resolve`` then reads the same bound;
the row's ``info["ci"]`` says so (:data:`MARK`). Nothing in the store changes.

Float spread. Where a row's interval is widened by the float spread (perplexity with
``float_noise_seeds``), the spread's term is added in quadrature as stored: the per-window values behind
SE come from one realisation and already carry some float noise, so the spread is counted in both terms.
Without the per-window values of every realisation one variance over windows x realisations (as
:func:`evalkit.evals.perplexity.float_spread.paired_difference` computes for Δppl) cannot be formed;
counting it twice only widens, and the float term is a small part (its SD is 0.1-0.4 x SE in
``published/default``).

A KL row whose stored interval cannot be read back as Student's t (one made with ``interval: bootstrap``,
which covers about 80 % at n = 4 even on symmetric data) keeps no interval (its criterion reads
unresolved), and its ``info["ci"]`` says why. A row whose ``info["ci"]`` names no method (hand-written
rows; every evaluation names it) is left as it is. Rows ``sweep --resolve`` grew are re-derived at their look's level by
:func:`evalkit.report.resolved.apply` through the same function, and are left alone here.
"""

from __future__ import annotations

import math

from evalkit.evals.skew_bound import FAMILY_TEXT
from evalkit.planning.sequential import JACKKNIFE, is_skewed_kl_row, skewed_kl_interval

MARK = "high end skew-calibrated"  # in a KL row's info["ci"] once the report replaced its high end
LEVEL_KEY = "ci_level"  # info key resolve's re-derivation sets: such a row is at its look's level already


def label(c: float, n: int, level: float) -> str:
    """What a KL row's ``info["ci"]`` gains with its skew-calibrated high end."""
    return (
        f"; {MARK} by the report: mean + c x SE, c = {c:.2f} at n = {n} and {100 * level:g} % "
        f"(holds for {FAMILY_TEXT}; evalkit.evals.skew_bound)"
    )


def skewed(row: dict, level: float) -> dict:
    """``row`` (a store's metric record of a KL row, :func:`~evalkit.planning.sequential.is_skewed_kl_row`)
    with its interval at ``level``: the t low end, the skew-calibrated high end; no interval when the stored
    one cannot be read back."""
    info = dict(row.get("info") or {})
    got = skewed_kl_interval(row, level) if JACKKNIFE in str(info.get("ci", "")) else None
    if got is None:
        why = "not skew-calibrated: the stored interval is not a Student's t this report can read back"
        info["ci"] = f"{info.get('ci', '')}; {why}: dropped"
        return {**row, "ci_low": None, "ci_high": None, "info": info}
    low, high, c, n = got
    info["ci"] = f"{info.get('ci', '')}{label(c, n, level)}"
    info[LEVEL_KEY] = level
    return {**row, "ci_low": low if level != 0.95 else row["ci_low"], "ci_high": high, "info": info}


def apply(rows: list[dict]) -> list[dict]:
    """The store's metric records with every KL row's high end skew-calibrated at 95 % (module docstring)."""
    out = []
    for r in rows:
        info = r.get("info") or {}
        ends = (r.get("ci_low"), r.get("ci_high"))
        missing = any(x is None or (isinstance(x, float) and math.isnan(x)) for x in ends)
        if missing or LEVEL_KEY in info or not is_skewed_kl_row(r):
            out.append(r)
            continue
        out.append(skewed(r, 0.95))
    return out
