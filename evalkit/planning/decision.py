"""How many items an accuracy comparison needs to resolve a drop: the paired and the unpaired design.

A scheme is compared with the baseline on the same items. Per item the two outcomes (right / wrong)
are paired; what decides the paired test (McNemar's) is the share of **discordant** items,
``psi = P(outcomes differ)``, and the drop ``delta = acc_base - acc_scheme``. With ``z_a`` the
two-sided normal quantile at ``1 - alpha/2`` and ``z_b`` the one at the power ``1 - beta``:

* **paired** (McNemar, normal approximation of Connor 1987, *Biometrics* 43:207)::

      n = (z_a * sqrt(psi) + z_b * sqrt(psi - delta**2))**2 / delta**2

  which for ``delta**2 << psi`` is ``(z_a + z_b)**2 * psi / delta**2``. At 95 % (two-sided), 80 % power
  and delta = 1 point: ``n ~= 7.85 * psi / 1e-4``, e.g. 3,924 items at psi = 5 %;
* **unpaired** (two independent proportions, Fleiss' formula without continuity correction), items
  per arm::

      n = (z_a * sqrt(2 * pbar * (1 - pbar)) + z_b * sqrt(p1 (1 - p1) + p2 (1 - p2)))**2 / delta**2

  with ``p1 = p``, ``p2 = p - delta``, ``pbar`` their mean: what comparing two accuracies with their
  own intervals needs. Pairing helps exactly when psi < 2 p (1 - p), the discordance of outcomes
  drawn independently.

Choosing psi. ``psi >= delta`` always (every lost item is a discordant one), and outcomes that change
independently of the baseline give ``psi ~= 2 p (1 - p)``. :func:`discordance_prior` models a scheme
that perturbs a share ``r`` of the items enough to redraw their outcome: ``psi = max(delta, r * 2 p (1 - p))``
(conservative: items that are always right or always wrong cannot flip, so the redraws flip fewer).
``r`` is a prior per kind of task (:data:`REDRAW_SHARE`), replaced by the measured discordance once a
pilot run of the grid has paired rows (``<task>/discordance`` of the longcontext eval, the lmeval eval's
flip counts): the dry run says which it used.

The tests hold these formulas to an exact power computation (the exact McNemar test's power summed over
the binomial distribution of discordant pairs) and to a simulation of the two-proportion z-test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALPHA = 0.05  # two-sided
POWER = 0.80
DROP = 0.01  # one accuracy point

# Share of items whose outcome a KV scheme perturbs enough to redraw, per kind of task (a prior):
# - "cot": greedy chain-of-thought generation of hundreds of tokens. published/default's decode rows:
#   under the FP8 schemes 0-25 % of the embedded model's sequences stay identical over 192 free-running
#   steps, so most long greedy generations change somewhere; an 8B model is likely less fragile.
# - "short_generation": a short answer read out of the context (RULER): the answer changes only where
#   the copy fails; published/default's retrieval rows moved under 4-bit schemes only.
# - "multiple_choice": log-likelihood argmax over a few choices (LongBench v2, MMLU): published stores'
#   evalkit_mmlu4 flips 0 of 8 under every 8-bit scheme, 1-3 of 8 under the 4-bit ones.
REDRAW_SHARE = {"cot": 0.75, "short_generation": 0.10, "multiple_choice": 0.05}


def z(q: float) -> float:
    """The standard normal quantile at ``q``."""
    from scipy.stats import norm

    return float(norm.ppf(q))


def items_paired(drop: float, psi: float, alpha: float = ALPHA, power: float = POWER) -> int:
    """Items a paired (McNemar) comparison needs to detect ``drop`` at discordance ``psi`` (module docstring)."""
    if not 0 < drop <= psi <= 1:
        raise ValueError(f"need 0 < drop <= discordance <= 1, got drop {drop}, discordance {psi}")
    za, zb = z(1 - alpha / 2), z(power)
    return math.ceil((za * math.sqrt(psi) + zb * math.sqrt(psi - drop**2)) ** 2 / drop**2)


def items_unpaired(p: float, drop: float, alpha: float = ALPHA, power: float = POWER) -> int:
    """Items per arm two independent accuracies need to detect ``drop`` from ``p`` (module docstring)."""
    if not 0 < drop <= p <= 1:
        raise ValueError(f"need 0 < drop <= accuracy <= 1, got accuracy {p}, drop {drop}")
    p2 = p - drop
    pbar = (p + p2) / 2
    za, zb = z(1 - alpha / 2), z(power)
    top = za * math.sqrt(2 * pbar * (1 - pbar)) + zb * math.sqrt(p * (1 - p) + p2 * (1 - p2))
    return math.ceil(top**2 / drop**2)


def detectable_drop(n: int, psi: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest drop ``n`` paired items resolve at discordance ``psi`` (``items_paired`` inverted; a drop
    larger than ``psi`` makes every lost item discordant: the discordance is then the drop itself)."""
    if n < 1:
        return math.inf
    need = lambda d: items_paired(d, max(psi, d), alpha, power)  # noqa: E731
    lo, hi = 1e-6, 1.0
    if need(hi) > n:
        return math.inf
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if need(mid) > n else (lo, mid)
    return hi


def discordance_prior(p: float, drop: float, kind: str) -> float:
    """psi = max(drop, r * 2 p (1 - p)) for a task of ``kind`` (:data:`REDRAW_SHARE`)."""
    return min(1.0, max(drop, REDRAW_SHARE[kind] * 2 * p * (1 - p)))


@dataclass(frozen=True)
class Requirement:
    """What one accuracy task needs to resolve ``drop``: paired and unpaired items, and the drop the
    planned items resolve."""

    psi: float
    paired: int
    unpaired: int
    detectable_at_planned: float


def requirement(p: float, psi: float, planned: int, drop: float = DROP, alpha=ALPHA, power=POWER) -> Requirement:
    psi = max(psi, drop)
    return Requirement(
        psi,
        items_paired(drop, psi, alpha, power),
        items_unpaired(max(p, drop), drop, alpha, power),
        detectable_drop(planned, psi, alpha, power),
    )
