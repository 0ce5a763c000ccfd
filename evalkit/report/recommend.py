"""One line per model: the cheapest KV scheme inside a stated quality budget.

A scheme is inside the budget when every criterion the store can check holds, using the point
estimates (the table shows their 95 % intervals next to them):

* ``|Δppl| / ppl <= max_ppl_rel``  (default 1 %)
* ``top-1 agreement >= min_top1``  (default 0.99)
* retrieval accuracy drop ``<= max_retrieval_drop`` (default 0.02, i.e. 2 points), if measured
* lm-eval flip rate ``<= max_flip_rate`` for every task (default 0.05), if measured

Among the schemes inside, "cheapest" is the fewest KV bytes per token (ties: the scheme string).
A criterion the store has no numbers for is reported as unchecked, never silently passed, and a
scheme with no perplexity numbers at all is not recommended. When no scheme is inside, the line
names the closest one (smallest |Δppl|) and each criterion it fails, with its value and the gap:
``fails top-1 ≥ 99%: 95.40%, short by 3.60 pts``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from evalkit.kv.scheme import Scheme, parse_scheme


@dataclass(frozen=True)
class Budget:
    max_ppl_rel: float = 0.01
    min_top1: float = 0.99
    max_retrieval_drop: float = 0.02
    max_flip_rate: float = 0.05

    def describe(self) -> str:
        return (f"|Δppl| <= {100 * self.max_ppl_rel:g}%, top-1 >= {100 * self.min_top1:g}%, "
                f"retrieval drop <= {100 * self.max_retrieval_drop:g} pts, lm-eval flips <= {100 * self.max_flip_rate:g}%")


def _pct(v: float) -> str:
    return f"{100 * v:.2f}".rstrip("0").rstrip(".")


def _criteria(row: dict, budget: Budget) -> list[tuple[str, float | None, bool | None, str]]:
    """(name, measured value, holds, how it failed) for every criterion that applies to ``row``."""
    out = []

    def add(name, key, limit, lower_is_better, text):
        v = row.get(key)
        if v is None or pd.isna(v):
            out.append((name, None, None, ""))
            return
        v = float(v)
        holds = v <= limit if lower_is_better else v >= limit
        gap = abs(v - limit) * 100
        out.append((name, v, holds, "" if holds else text(v, gap)))

    d = row.get("ppl_delta_rel")
    add("Δppl", "_abs_ppl", budget.max_ppl_rel, True,
        lambda v, gap: f"fails |Δppl| ≤ {_pct(budget.max_ppl_rel)}%: {100 * d:+.2f}%, over by {gap:.2f} pts")
    add("top-1", "top1_agreement", budget.min_top1, False,
        lambda v, gap: f"fails top-1 ≥ {_pct(budget.min_top1)}%: {100 * v:.2f}%, short by {gap:.2f} pts")
    if "retrieval_diff" in row:
        add("retrieval", "_retrieval_drop", budget.max_retrieval_drop, True,
            lambda v, gap: f"fails retrieval drop ≤ {_pct(budget.max_retrieval_drop)} pts: "
                           f"{100 * v:.1f} pts, over by {gap:.1f} pts")
    for key in [k for k in row if k.endswith("/flip_rate")]:
        task = key.rsplit("/", 1)[0]
        add(f"{task} flips", key, budget.max_flip_rate, True,
            lambda v, gap, task=task: f"fails {task} flips ≤ {_pct(budget.max_flip_rate)}%: {100 * v:.1f}%, "
                                      f"over by {gap:.1f} pts")
    return out


def check(row: dict, budget: Budget) -> tuple[bool, list[str]]:
    """(inside the budget, one line per criterion that failed, with its value and the gap to its limit,
    or could not be checked)."""
    row = dict(row)
    if row.get("ppl_delta_rel") is not None and not pd.isna(row["ppl_delta_rel"]):
        row["_abs_ppl"] = abs(row["ppl_delta_rel"])
    if row.get("retrieval_diff") is not None and not pd.isna(row["retrieval_diff"]):
        row["_retrieval_drop"] = -row["retrieval_diff"]
    crit = _criteria(row, budget)
    failed = [text for _, _, holds, text in crit if holds is False]
    unchecked = [f"{name} unmeasured" for name, _, holds, _ in crit if holds is None]
    measured = {name for name, _, holds, _ in crit if holds is not None}
    inside = not failed and {"Δppl", "top-1"} <= measured
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
            dtype = base["dtype"].iloc[0] if "dtype" in base and not base.empty and isinstance(base["dtype"].iloc[0], str) else ""
            keep = f"the unquantized baseline ({dtype} KV cache)" if dtype else "the unquantized baseline (bf16 scheme)"
            out[model] = (f"{model}: keep {keep}: no quantized scheme in the store is within the budget "
                          f"({budget.describe()}){closest}")
            continue
        # fewest bytes per token; without a known layout, fewest bits per stored value
        bpt, scheme, row = min(cands, key=lambda c: (c[0], parse_scheme(c[1]).kv_format.bits, c[1]))
        saving = ""
        if not base.empty and not pd.isna(base["bytes_per_token"].iloc[0]) and math.isfinite(bpt):
            saving = f", {base['bytes_per_token'].iloc[0] / bpt:.2f}x the KV capacity of bf16 ({bpt:,.0f} bytes/token)"
        top1 = f"{100 * row['top1_agreement']:.2f}%"
        out[model] = (f"{model}: use {scheme}{saving}; Δppl {100 * row['ppl_delta_rel']:+.2f}%, top-1 {top1} "
                      f"(budget: {budget.describe()})")
    return out
