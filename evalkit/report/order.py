"""Whether the data order two table rows: the paired interval of their Δppl difference.

Why paired. Every scheme of a model is scored on the same windows and, with ``float_noise_seeds``, on
the same perturbed weight copies, so "is row A's Δppl below row B's?" is a question about
``Δppl_A - Δppl_B`` formed window by window and realisation by realisation: its interval
(:func:`evalkit.evals.perplexity.float_spread.paired_difference`: one variance over the windows x
realisations table, the float spread counted once; the studentized jackknife over windows where there
is one realisation) removes what the two rows share (hard windows are hard for both). Overlap of the two MARGINAL
intervals answers another question: overlapping marginals do not mean "not ordered", and chaining
overlaps (A overlaps B, B overlaps C, so A, B, C are one group) makes "not resolved" transitive,
which it is not.

What. The rows compared are those a reader compares at equal cost: one model, one backend (who
computed them), one bytes/token, quantized, with a Δppl value. For each pair:

* **resolved**: Holm's step-down test rejects a zero difference for the pair (below): the data order
  the two rows, lower Δppl first (an :class:`OrderClaim`, with its interval at the level Holm tested
  it at, which excludes 0);
* **not resolved**: Holm does not reject it;
* **not assessed**: a row has no per-window units (``info["units"]`` of its overall Δppl row: a store
  made before evalkit recorded them), the two rows were not measured on the same windows and weight
  copies, or there are fewer than 2 windows. Nothing is inferred for such a pair, in particular not
  from the marginal intervals.

Sets. "Not resolved" is not transitive, so it cannot be shown as a partition into groups. The table
shows it as a compact letter display (Piepho 2004, with numbers for letters): each number is a
maximal set of rows no two of which are resolved (a maximal clique of the not-resolved graph) and a
row carries every number it is in. Two rows share a number exactly when their pair is not resolved
(every not-resolved pair lies in some maximal clique; no resolved pair lies in any), and the set of
maximal cliques is unique, so the marks neither hide an order nor invent one. Rows of one
bytes/token that share no number are ordered.

Adjusted for the pairs tested. k rows of one bytes/token make m = k(k-1)/2 pairs, and 28 tests at 5 %
each make a false order somewhere far likelier than 5 % (23 % of null stores at published-like variance,
simulated). So the pairs of a group form one family under Holm's step-down procedure (Holm 1979): with
the pairs' two-sided p-values (of the paired t of a zero difference) sorted p_(1) <= ... <= p_(m), the
i-th is rejected at level 0.05 / (m - i + 1) while every earlier one was; the first that is not stops
the rest. The family-wise error (any false order among the group's) is then at most 5 %, whatever the
true differences; ``tests/report/test_order.py`` measures it on 8 equal rows. Each pair's interval is
given at its own Holm level (``1 - 0.05 / (m - i + 1)``), and where the rows have one float realisation
(``float_noise_seeds`` 0) it is sampling-only: another float realisation (processor, BLAS, engine) can
reorder rows it orders. The notes under the table say both.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import pandas as pd

from evalkit.evals.perplexity.float_spread import paired_difference
from evalkit.kv.scheme import Scheme

# an order claim as prose writes it (OrderClaim.text): "Δppl A < B: +0.41 [+0.12, +0.70] pts, paired, ..."
CLAIM_PATTERN = re.compile(
    r"Δppl (\S+) < (\S+): ([+-]\d+\.\d+ \[[+-]\d+\.\d+, [+-]\d+\.\d+\] pts, paired "
    r"\d+\.\d+ % \(Holm, \d+ pairs?\), (?:no float spread|\d+ float realisations))"
)
ALPHA = 0.05  # the family-wise error of a group's orders
KEY = "ppl_delta_rel"
UNITS = f"{KEY}_units"  # summary column: the overall Δppl row's info["units"] (evalkit.report.evals)
NO_UNITS = "no per-window Δppl units in the store, made before evalkit recorded them"


@dataclass(frozen=True)
class Pair:
    """The paired interval of ``Δppl_a - Δppl_b`` (fractions) of frame rows ``a`` and ``b`` at the
    confidence ``level`` Holm tested the pair at, among ``family`` pairs; ``resolved``: Holm rejects a
    zero difference (then the interval excludes 0)."""

    a: int
    b: int
    diff: float
    lo: float
    hi: float
    realisations: int
    resolved: bool = False
    level: float = 1 - ALPHA
    family: int = 1
    p: float = 1.0

    def reverse(self) -> Pair:
        return Pair(
            self.b,
            self.a,
            -self.diff,
            -self.hi,
            -self.lo,
            self.realisations,
            self.resolved,
            self.level,
            self.family,
            self.p,
        )


@dataclass(frozen=True)
class OrderClaim:
    """The data order two rows: ``lower``'s Δppl is below ``higher``'s; ``diff`` [``lo``, ``hi``] is the
    paired interval of ``Δppl_higher - Δppl_lower`` (fractions, wholly above 0)."""

    model: str
    backend: str
    lower: str
    higher: str
    diff: float
    lo: float
    hi: float
    realisations: int
    level: float = 1 - ALPHA
    family: int = 1

    def interval_text(self) -> str:
        """``+0.41 [+0.12, +0.70] pts, paired 99.82 % (Holm, 28 pairs), 4 float realisations``: the
        interval in Δppl points at the level Holm tested the pair at."""
        spread = f"{self.realisations} float realisations" if self.realisations > 1 else "no float spread"
        pairs = f"{self.family} pair{'s' if self.family != 1 else ''}"
        return (
            f"{100 * self.diff:+.2f} [{100 * self.lo:+.2f}, {100 * self.hi:+.2f}] pts, paired "
            f"{100 * self.level:.2f} % (Holm, {pairs}), {spread}"
        )

    def text(self) -> str:
        return f"Δppl {self.lower} < {self.higher}: {self.interval_text()}"


@dataclass
class Order:
    """What the data say about the order of a frame's rows (see the module docstring)."""

    pairs: dict[tuple[int, int], Pair] = field(default_factory=dict)  # (a, b) and (b, a), b's the reverse
    unassessed: dict[int, list[str]] = field(default_factory=dict)  # row -> why some pair of it is not assessed
    sets: list[tuple[int, ...]] = field(default_factory=list)  # number n (from 1) -> its rows: sets[n - 1]

    def pair(self, a: int, b: int) -> Pair | None:
        return self.pairs.get((a, b))

    def numbers(self, row: int) -> list[int]:
        """The numbers (maximal not-resolved sets) ``row`` is in."""
        return [n for n, rows in enumerate(self.sets, 1) if row in rows]

    def mark(self, row: int) -> str:
        """``" ≈1,2"``, ``" ≈?"`` (a pair not assessed), ``" ≈1,?"`` or ``""``."""
        items = [str(n) for n in self.numbers(row)] + (["?"] if row in self.unassessed else [])
        return f" ≈{','.join(items)}" if items else ""

    def realisations(self) -> set[int]:
        return {p.realisations for p in self.pairs.values()}


def group_keys(frame: pd.DataFrame) -> list[str]:
    """The columns whose values make the rows a reader compares at equal cost."""
    return ["model", "bytes_per_token"] + (["backend"] if "backend" in frame else [])


def _compared(frame: pd.DataFrame) -> pd.DataFrame:
    if KEY not in frame:
        return frame.iloc[0:0]
    return frame[(frame["scheme"] != str(Scheme())) & frame[KEY].notna()]


def assess(frame: pd.DataFrame) -> Order:
    """Every pair of compared rows of ``frame`` (by frame index), and the numbered maximal sets."""
    out = Order()
    rows = _compared(frame)
    if rows.empty:
        return out
    has_units = UNITS in rows
    for _, g in rows.groupby(group_keys(rows), sort=False, dropna=False):
        if len(g) < 2:
            continue
        g = g.sort_values([KEY, "scheme"], kind="stable")  # numbers follow Δppl, lowest first
        index = list(g.index)
        units = {i: (g.at[i, UNITS] if has_units else None) for i in index}
        tested: list[tuple[int, int, float, dict]] = []
        for k, a in enumerate(index):
            for b in index[k + 1 :]:
                why = _assess_pair(tested, a, b, units[a], units[b], g)
                if why:
                    out.unassessed.setdefault(a, []).append(why)
                    out.unassessed.setdefault(b, []).append(why)
        for pair in holm(tested):
            out.pairs[(pair.a, pair.b)] = pair
            out.pairs[(pair.b, pair.a)] = pair.reverse()
        adjacent = {i: {j for j in index if j != i and (p := out.pair(i, j)) and not p.resolved} for i in index}
        cliques = [c for c in maximal_cliques(index, adjacent) if len(c) > 1]
        out.sets += sorted(cliques, key=lambda c: sorted(index.index(i) for i in c))
    return out


def _assess_pair(tested: list, a: int, b: int, ua, ub, g: pd.DataFrame) -> str:
    """Append the pair (a, b, its difference, its interval's info) to ``tested``; the reason it is not
    assessed, or ""."""
    if not isinstance(ua, dict) or not isinstance(ub, dict):
        return NO_UNITS
    try:
        diff, lo, hi, info = paired_difference(ua, ub)
    except ValueError:
        return f"{g.at[a, 'scheme']} and {g.at[b, 'scheme']} were not measured on the same windows and weight copies"
    if math.isnan(lo) or math.isnan(hi) or "se" not in info:
        return "fewer than 2 windows: no interval"
    tested.append((a, b, diff, info))
    return ""


def holm(tested: list[tuple[int, int, float, dict]], alpha: float = ALPHA) -> list[Pair]:
    """Holm's step-down test of the family ``tested`` ((a, b, difference, info with ``se``, ``df``, ``p``)):
    each pair with its interval at the level it was tested at and whether it is rejected (resolved)."""
    from scipy import stats

    m = len(tested)
    ranked = sorted(tested, key=lambda x: (x[3]["p"], x[0], x[1]))
    out, going = [], True
    for i, (a, b, diff, info) in enumerate(ranked):
        level_alpha = alpha / (m - i)
        going = going and info["p"] <= level_alpha
        half = float(stats.t.ppf(1 - level_alpha / 2, info["df"])) * info["se"]
        lo, hi = diff - half, diff + half
        resolved = going and (lo > 0 or hi < 0)  # the same test: its interval excludes 0
        going = going and resolved
        n = int(info.get("realisations", 1))
        out.append(Pair(a, b, diff, lo, hi, n, resolved, 1 - level_alpha, m, float(info["p"])))
    return out


def maximal_cliques(nodes: list[int], adjacent: dict[int, set[int]]) -> list[tuple[int, ...]]:
    """Every maximal clique of the graph (Bron-Kerbosch with a pivot), each in ``nodes``' order."""
    order = {n: k for k, n in enumerate(nodes)}
    found: list[tuple[int, ...]] = []

    def grow(clique: set[int], candidates: set[int], done: set[int]) -> None:
        if not candidates and not done:
            found.append(tuple(sorted(clique, key=order.__getitem__)))
            return
        pivot = max(candidates | done, key=lambda u: (len(adjacent[u] & candidates), -order[u]))
        for v in sorted(candidates - adjacent[pivot], key=order.__getitem__):
            grow(clique | {v}, candidates & adjacent[v], done & adjacent[v])
            candidates = candidates - {v}
            done = done | {v}

    grow(set(), set(nodes), set())
    return found


def claims(frame: pd.DataFrame, order: Order | None = None) -> list[OrderClaim]:
    """Every order the data resolve among ``frame``'s rows (each pair once, lower Δppl first), in frame order."""
    order = assess(frame) if order is None else order
    out = []
    for p in order.pairs.values():
        if p.resolved and p.diff < 0:  # p.a below p.b: one claim per pair (the reverse has diff > 0)
            out.append(claim(frame, p))
    return sorted(out, key=lambda c: (c.model, c.backend, c.lower, c.higher))


def claim(frame: pd.DataFrame, p: Pair) -> OrderClaim:
    """The claim of a resolved pair (``p.a`` lower when ``p.diff < 0``)."""
    lower, higher = (p.a, p.b) if p.diff < 0 else (p.b, p.a)
    backend = str(frame.at[lower, "backend"]) if "backend" in frame else "emulation"
    d = abs(p.diff)
    lo, hi = (-p.hi, -p.lo) if p.diff < 0 else (p.lo, p.hi)
    return OrderClaim(
        str(frame.at[lower, "model"]),
        backend,
        str(frame.at[lower, "scheme"]),
        str(frame.at[higher, "scheme"]),
        d,
        lo,
        hi,
        p.realisations,
        p.level,
        p.family,
    )


def claims_in(text: str) -> list[tuple[str, str, str]]:
    """(lower, higher, the whole claim) of every order claim written in ``text`` (:data:`CLAIM_PATTERN`)."""
    return [(m.group(1), m.group(2), m.group(0)) for m in CLAIM_PATTERN.finditer(text)]


def disagreements(text: str, frame: pd.DataFrame) -> list[str]:
    """The order claims in ``text`` (a recommendation, a README's reading) that the data of ``frame`` do not
    make, each with what the data say instead; empty when every claim is one of :func:`claims`."""
    made = {c.text(): c for c in claims(frame)}
    by_pair = {(c.lower, c.higher): c for c in made.values()}
    out = []
    for lower, higher, written in claims_in(text):
        if written in made:
            continue
        if (lower, higher) in by_pair:
            out.append(f"{written!r}: the data say {by_pair[(lower, higher)].text()!r}")
        elif (higher, lower) in by_pair:
            out.append(f"{written!r}: the data order them the other way, {by_pair[(higher, lower)].text()!r}")
        else:
            out.append(f"{written!r}: the data do not order {lower} and {higher}")
    return out
