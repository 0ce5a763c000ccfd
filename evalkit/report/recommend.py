"""One line per model: the cheapest KV scheme inside a stated quality budget.

A scheme is inside the budget when every criterion the store can check holds, using the point
estimates (the table shows their 95 % intervals next to them):

* ``|Δppl| / ppl <= max_ppl_rel``  (default 1 %)
* ``top-1 agreement >= min_top1``  (default 0.99)
* retrieval accuracy drop ``<= max_retrieval_drop`` (default 0.02, i.e. 2 points), if measured
* lm-eval flip rate ``<= max_flip_rate`` for every task (default 0.05), if measured

Among the schemes inside, "cheapest" is the fewest KV bytes per token (ties: the scheme string).
The criteria are the evaluations' own (their ReportSpec's ``criteria``; the Budget field each one
reads is named there). A criterion the store has no numbers for is reported as unchecked, never
silently passed, and a scheme with no perplexity numbers at all is not recommended. When no scheme is inside, the line
names the closest one (smallest |Δppl|) and each criterion it fails, with its value and the gap:
``fails top-1 ≥ 99%: 95.40%, short by 3.60 pts``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from evalkit.evals.base import Criterion
from evalkit.kv.scheme import Scheme, parse_scheme
from evalkit.report import evals as report_evals


@dataclass(frozen=True)
class Budget:
    max_ppl_rel: float = 0.01
    min_top1: float = 0.99
    max_retrieval_drop: float = 0.02
    max_flip_rate: float = 0.05

    def describe(self) -> str:
        return (
            f"|Δppl| <= {100 * self.max_ppl_rel:g}%, top-1 >= {100 * self.min_top1:g}%, "
            f"retrieval drop <= {100 * self.max_retrieval_drop:g} pts, lm-eval flips <= {100 * self.max_flip_rate:g}%"
        )


def _pct(v: float) -> str:
    return f"{100 * v:.2f}".rstrip("0").rstrip(".")


def _instances(row: dict, c: Criterion) -> list[tuple[str, str, str]]:
    """(name, text, column) of each criterion ``c`` stands for in ``row`` (one per ``*/suffix`` column)."""
    if not c.column.startswith("*/"):
        return [(c.name, c.text, c.column)] if c.required or c.column in row else []
    suffix = c.column[1:]
    tasks = [k[: -len(suffix)] for k in row if isinstance(k, str) and k.endswith(suffix) and len(k) > len(suffix)]
    return [(c.name.format(task=t), c.text.format(task=t), f"{t}{suffix}") for t in tasks]


def _criteria(row: dict, budget: Budget) -> list[tuple[str, float | None, bool | None, str, bool]]:
    """(name, measured value, holds, how it failed, required) for every declared criterion (the
    evaluations' :class:`~evalkit.evals.base.Criterion`) that applies to ``row``."""
    out = []
    for c in report_evals.criteria():
        limit = getattr(budget, c.budget)
        for name, text, column in _instances(row, c):
            raw = row.get(column)
            if raw is None or pd.isna(raw):
                out.append((name, None, None, "", c.required))
                continue
            raw = float(raw)
            v = abs(raw) if c.transform == "abs" else -raw if c.transform == "neg" else raw
            holds = v <= limit if c.lower_is_better else v >= limit
            gap = abs(v - limit) * 100
            shown = f"{100 * raw:+.{c.digits}f}" if c.signed else f"{100 * v:.{c.digits}f}"
            op, miss = ("≤", "over") if c.lower_is_better else ("≥", "short")
            text_ = (
                ""
                if holds
                else (f"fails {text} {op} {_pct(limit)}{c.unit}: {shown}{c.unit}, {miss} by {gap:.{c.digits}f} pts")
            )
            out.append((name, v, holds, text_, c.required))
    return out


def check(row: dict, budget: Budget) -> tuple[bool, list[str]]:
    """(inside the budget, one line per criterion that failed, with its value and the gap to its limit,
    or could not be checked). Inside needs every required criterion measured and none failed."""
    crit = _criteria(dict(row), budget)
    failed = [text for _, _, holds, text, _ in crit if holds is False]
    unchecked = [f"{name} unmeasured" for name, _, holds, _, _ in crit if holds is None]
    inside = not failed and all(holds is not None for _, _, holds, _, required in crit if required)
    return inside, failed + unchecked


def recommend(frame: pd.DataFrame, budget: Budget = Budget()) -> dict[str, str]:
    """model -> one line of recommendation."""
    out = {}
    for model, group in frame.groupby("model", sort=False):
        base = group[group["scheme"] == str(Scheme())]
        cands, misses = [], []
        for _, r in group[group["scheme"] != str(Scheme())].iterrows():
            row = r.dropna().to_dict()
            inside, notes = check(row, budget)
            if inside:
                cands.append((row.get("bytes_per_token", math.inf), row["scheme"], row))
            elif "ppl_delta_rel" in row:
                misses.append((abs(row["ppl_delta_rel"]), row["scheme"], notes, row))
        if not cands:
            closest = ""
            if misses:
                _, scheme, notes, row = min(misses, key=lambda m: (m[0], m[1]))
                closest = f"; closest: {scheme} ({'; '.join(notes)})"
            dtype = (
                base["dtype"].iloc[0]
                if "dtype" in base and not base.empty and isinstance(base["dtype"].iloc[0], str)
                else ""
            )
            keep = f"the unquantized baseline ({dtype} KV cache)" if dtype else "the unquantized baseline (bf16 scheme)"
            out[model] = (
                f"{model}: keep {keep}: no quantized scheme in the store is within the budget "
                f"({budget.describe()}){closest}"
            )
            continue
        # fewest bytes per token; without a known layout, fewest bits per stored value
        bpt, scheme, row = min(cands, key=lambda c: (c[0], parse_scheme(c[1]).kv_format.bits, c[1]))
        saving = ""
        if not base.empty and not pd.isna(base["bytes_per_token"].iloc[0]) and math.isfinite(bpt):
            saving = f", {base['bytes_per_token'].iloc[0] / bpt:.2f}x the KV capacity of bf16 ({bpt:,.0f} bytes/token)"
        top1 = f"{100 * row['top1_agreement']:.2f}%"
        out[model] = (
            f"{model}: use {scheme}{saving}; Δppl {100 * row['ppl_delta_rel']:+.2f}%, top-1 {top1} "
            f"(budget: {budget.describe()})"
        )
    return out
