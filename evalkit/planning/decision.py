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

The decision made. The budget's rule ("drop <= the limit L", :mod:`evalkit.report.budget`) calls a
scheme inside when the upper end of the drop's 95 % interval is at most L: a non-inferiority test of
H0: drop >= L at one-sided 2.5 %, not a test of H0: drop = 0. :func:`items_noninferior` sizes it: with
``t`` the drop the scheme truly has (0 by default: a scheme that loses nothing), the paired items for
80 % power to call it inside are (Wald, per-item differences in {-1, 0, 1} of variance psi - t**2)::

      n = (z_a + z_b)**2 * (psi - t**2) / (L - t)**2

so a scheme truly losing half the limit needs about 4 times the items of one losing nothing, and at
t = 0 the count is :func:`items_paired`'s at drop = L. The unpaired design alike, per arm:
``(z_a + z_b)**2 * (p (1 - p) + p2 (1 - p2)) / (L - t)**2`` with ``p2 = p - t``.

Choosing psi. ``psi >= delta`` always (every lost item is a discordant one), and outcomes that change
independently of the baseline give ``psi ~= 2 p (1 - p)``. :func:`discordance_prior` models a scheme
that perturbs a share ``r`` of the items enough to redraw their outcome: ``psi = max(delta, r * 2 p (1 - p))``
(conservative: items that are always right or always wrong cannot flip, so the redraws flip fewer).
``r`` is a prior per kind of task (:data:`REDRAW_SHARE`). A pilot run of the grid with paired rows
(``<task>/discordance`` of the longcontext eval, the lmeval eval's flip counts) does not replace it: a
small pilot's point estimate (25 items, 0 flips: psi 0) would size a test whose power is far below
80 % if the prior is right. The pilot can only raise psi: :func:`pilot_psi` takes the larger of the
prior and the upper end of the pilot's 95 % Wilson interval of its discordant share (25 items, 0
flips: 0.133), and the dry run prints the pilot's item count beside it.

The tests hold these formulas to an exact power computation (the exact McNemar test's power summed over
the binomial distribution of discordant pairs), to a simulation of the non-inferiority rule and to a
simulation of the two-proportion z-test.
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


def items_noninferior(limit: float, psi: float, true_drop: float = 0.0, alpha=ALPHA, power=POWER) -> int:
    """Paired items for ``power`` to call a scheme whose drop is truly ``true_drop`` inside the budget
    ``drop <= limit`` (the 95 % interval's upper end at most ``limit``; module docstring)."""
    if not 0 <= true_drop < limit:
        raise ValueError(f"need 0 <= true drop < limit, got true drop {true_drop}, limit {limit}")
    if not true_drop <= psi <= 1 or psi <= true_drop**2:
        raise ValueError(f"need true drop <= discordance <= 1, got true drop {true_drop}, discordance {psi}")
    za, zb = z(1 - alpha / 2), z(power)
    return math.ceil((za + zb) ** 2 * (psi - true_drop**2) / (limit - true_drop) ** 2)


def items_noninferior_unpaired(p: float, limit: float, true_drop: float = 0.0, alpha=ALPHA, power=POWER) -> int:
    """Items per arm for the same decision from two independent accuracies (module docstring)."""
    if not 0 <= true_drop < limit or not 0 < p <= 1:
        raise ValueError(f"need 0 <= true drop < limit and 0 < accuracy <= 1, got {true_drop}, {limit}, {p}")
    p2 = max(p - true_drop, 0.0)
    za, zb = z(1 - alpha / 2), z(power)
    return math.ceil((za + zb) ** 2 * (p * (1 - p) + p2 * (1 - p2)) / (limit - true_drop) ** 2)


def resolvable_limit(n: int, psi: float, true_drop: float = 0.0, alpha=ALPHA, power=POWER) -> float:
    """The smallest budget limit ``n`` paired items decide with ``power`` for a scheme truly losing
    ``true_drop`` (:func:`items_noninferior` inverted)."""
    if n < 1:
        return math.inf
    za, zb = z(1 - alpha / 2), z(power)
    return true_drop + (za + zb) * math.sqrt(max(psi - true_drop**2, 0.0) / n)


@dataclass(frozen=True)
class Pilot:
    """What a pilot run measured of a task's discordance: the largest share over its schemes, the largest
    upper end of their 95 % Wilson intervals, and the items behind that upper end."""

    share: float
    upper: float
    items: int


def pilot_psi(prior: float, pilot: Pilot | None) -> tuple[float, str]:
    """(psi, where it comes from): the larger of ``prior`` and the pilot's upper bound (module docstring)."""
    if pilot is None:
        return prior, "prior"
    if pilot.upper > prior:
        return pilot.upper, (
            f"pilot's 95 % upper bound (measured in --out on {pilot.items:,} items: {pilot.share:.4f}, upper "
            f"{pilot.upper:.4f}) over the prior {prior:.4f}"
        )
    return prior, (
        f"prior, at least the pilot's 95 % upper bound (measured in --out on {pilot.items:,} items: "
        f"{pilot.share:.4f}, upper {pilot.upper:.4f})"
    )


@dataclass(frozen=True)
class Requirement:
    """What one accuracy task needs for the budget's decision ``drop <= limit`` (non-inferiority, for a
    scheme truly losing ``true_drop``): paired and unpaired items, and the limit the planned items decide."""

    psi: float
    paired: int
    unpaired: int
    detectable_at_planned: float  # the smallest limit the planned items decide with 80 % power


def requirement(
    p: float, psi: float, planned: int, drop: float = DROP, true_drop: float = 0.0, alpha=ALPHA, power=POWER
) -> Requirement:
    psi = max(psi, drop)
    return Requirement(
        psi,
        items_noninferior(drop, psi, true_drop, alpha, power),
        items_noninferior_unpaired(max(p, drop), drop, true_drop, alpha, power),
        resolvable_limit(planned, psi, true_drop, alpha, power),
    )
