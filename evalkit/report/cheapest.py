"""Which schemes inside the budget are named: a fixed sequence in order of cost, then the cheapest told apart.

Which schemes are inside: a fixed-sequence test in order of cost. Judging every scheme at 95 % and
naming "the cheapest inside" picks the most favourable of many tests: the chance that some scheme
outside the budget is called inside grows with their number. So the schemes an engine runs are
tested in a sequence fixed before the data (most bytes per token first, then more bits per value,
then the scheme's name), each at 95 %, and the sequence stops at the first scheme not inside
(outside or unresolved; schemes whose protocol does not measure a criterion, or whose required
criterion is unmeasured, are not tested and do not stop it). Every scheme before the stop is inside
with a family-wise error of at most 5 % (Maurer, Hothorn and Lehmacher 1995: each test at full level,
none after a failure), so the cheapest of them keeps the rule's error rate. The line names where the
sequence stopped and the schemes it did not test.

Among the cheapest schemes inside, one is named only when the data order it closer to the baseline
than each other one: the paired interval of their Δppl difference (:mod:`evalkit.report.order`, the
table's ``≈`` marks) excludes 0, and the rows' own Δppl intervals put the pair on one side of 0 (the
named row's interval at or above 0, or the two lower ends summing above 0; mirrored below), so a
lower Δppl is a smaller |Δppl|; the line gives each such order with its paired interval (``Δppl A <
B: ...``). Otherwise it says "the data cannot separate A, B" and lists them. KL orders nothing here: its
intervals are marginal (no per-window KL in the store to pair).

"""

from __future__ import annotations

import math

import pandas as pd

from evalkit.kv.scheme import parse_scheme
from evalkit.report import order
from evalkit.report.budget import missing

INDEX = "_frame_index"  # a row dict's index in the summary frame (its pairs in evalkit.report.order)
SEQUENCE_NOTE = "schemes tested in order of cost, most bytes first, each at 95 %, stopping at the first not inside"


def sequence_key(r: dict) -> tuple:
    """A scheme's place in the fixed sequence (fixed before the data): most bytes per token first, then
    more bits per value, then the scheme's name."""
    return (-r.get("bytes_per_token", math.inf), -parse_scheme(r["scheme"]).kv_format.bits, r["scheme"])


def fixed_sequence(judged: list[tuple[dict, str, list[str]]]) -> tuple[list[dict], tuple[dict, str] | None, list[dict]]:
    """(the rows inside, the row the sequence stopped at with its state or None, the rows not tested after
    it) of ``judged`` ((row, state, notes) of :func:`evalkit.report.budget.check`), tested in :func:`sequence_key` order (see the
    module docstring). Rows not measured by their protocol or unjudged are not tested and stop nothing."""
    tested = sorted(
        ((r, state) for r, state, _ in judged if state in ("inside", "outside", "unresolved")),
        key=lambda x: sequence_key(x[0]),
    )
    inside: list[dict] = []
    for k, (r, state) in enumerate(tested):
        if state != "inside":
            return inside, (r, state), [row for row, _ in tested[k + 1 :]]
        inside.append(r)
    return inside, None, []


def sequence_text(stop: tuple[dict, str] | None, untested: list[dict]) -> str:
    if stop is None or not untested:
        return ""
    names = ", ".join(r["scheme"] for r in untested)
    return f"; the sequence stopped at {stop[0]['scheme']} ({stop[1]}), so these were not tested: {names}"


def _closer(p: order.Pair, best: dict, other: dict) -> bool:
    """Whether the resolved pair ``p`` (``best`` minus ``other``) makes ``best``'s |Δppl| the smaller. Below
    ``other`` (``p`` wholly below 0), |Δppl_best| < |Δppl_other| needs ``Δppl_best + Δppl_other > 0`` too:
    ``best``'s Δppl interval at or above 0, or the two intervals' lower ends summing above 0 (mirrored
    above ``other``)."""
    b_lo, b_hi, o_lo, o_hi = (r.get(f"ppl_delta_rel_{end}") for r in (best, other) for end in ("lo", "hi"))
    if not p.resolved or any(missing(x) for x in (b_lo, b_hi, o_lo, o_hi)):
        return False
    if p.hi < 0:
        return b_lo >= 0 or b_lo + o_lo > 0
    return b_hi <= 0 or b_hi + o_hi < 0


def separate(rows: list[dict], frame: pd.DataFrame) -> tuple[list[dict], str, list[order.OrderClaim]]:
    """(the schemes the data cannot tell from the best one, why, the orders that set the others apart)
    among equally cheap ``rows`` (dicts with :data:`INDEX`): the best (smallest |Δppl|) alone when each
    other row's paired Δppl interval orders it farther from the baseline (see the module docstring)."""
    ranked = sorted(rows, key=lambda r: (abs(r["ppl_delta_rel"]), r["scheme"]))
    if len(ranked) == 1:
        return ranked, "", []
    assessed = order.assess(frame)
    best, tied, claims, why = ranked[0], [ranked[0]], [], {}
    for r in ranked[1:]:
        p = assessed.pair(best[INDEX], r[INDEX])
        if p is not None and _closer(p, best, r):
            claims.append(order.claim(frame, p))
            continue
        tied.append(r)
        if p is None:
            why["their order is not assessed (see ≈? under the table)"] = None
        else:
            why["no paired Δppl interval orders a smaller |Δppl|"] = None
    return tied, "; ".join(why), claims
