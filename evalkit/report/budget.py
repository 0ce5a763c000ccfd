"""The quality budget and its one decision rule: each criterion judged on its 95 % interval, a row inside
only when every checked criterion holds.

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

Protocol. A criterion whose row says "not measured by this protocol" (``info["not_measured"]``: the
protocol reads no quantized value for the scheme, e.g. vLLM's TurboQuant and UltraQuant under
perplexity's and one-forward lm-eval tasks' single forward) is never counted as met (:data:`NOT_MEASURED`).

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

Which of the rows inside is named is :mod:`evalkit.report.cheapest`; the line per model,
:mod:`evalkit.report.recommend`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import pandas as pd

from evalkit.evals.base import Criterion
from evalkit.evals.decode.report import LAST as DECODE_LAST
from evalkit.report import evals as report_evals
from evalkit.report import noise_floor
from evalkit.report.marks import NOT_MEASURED as NOT_MEASURED_SUFFIX

FLOAT_KNOWN = "float_noise_seeds"  # summary column: reruns behind a row's perplexity intervals (0/NaN: none)
SPREAD_TEXT = "widened by the float spread"  # what a row's info["ci"] says of an interval that includes it
DECODE_KL = Criterion("decode KL", DECODE_LAST, "max_kl", True, "decode KL (last bucket)", unit=" nats", digits=4)
NOT_MEASURED = "not measured"  # a criterion's state where the row says "not measured by this protocol"


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
        if str(k).endswith(NOT_MEASURED_SUFFIX) and has_reason(v):  # a task its protocol does not measure (value NaN)
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


def missing(x) -> bool:
    return x is None or pd.isna(x)


def has_reason(v) -> bool:
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
            if has_reason(row.get(f"{column}{NOT_MEASURED_SUFFIX}")):
                out.append(Verdict(name, NOT_MEASURED, f"{text} not measured by this protocol", c.required))
                continue
            raw = row.get(column)
            if missing(raw):
                out.append(Verdict(name, "unmeasured", f"{name} unmeasured", c.required))
                continue
            raw = float(raw)
            v = _transform(c, raw)
            lo, hi = row.get(f"{column}_lo"), row.get(f"{column}_hi")
            with_ci = not (missing(lo) or missing(hi))
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
