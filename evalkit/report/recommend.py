"""One line per model: the cheapest KV scheme inside a stated quality budget.

A scheme is inside the budget when every criterion the store can check holds, using the point
estimates (the table shows their 95 % intervals next to them):

* ``|Δppl| / ppl <= max_ppl_rel``  (default 1 %)
* ``top-1 agreement >= min_top1``  (default 0.99)
* retrieval accuracy drop ``<= max_retrieval_drop`` (default 0.02, i.e. 2 points), if measured
* lm-eval flip rate ``<= max_flip_rate`` for every task (default 0.05), if measured

Among the schemes inside, "cheapest" is the fewest KV bytes per token (ties: the scheme string).
A criterion the store has no numbers for is reported as unchecked, never silently passed, and a
scheme with no perplexity numbers at all is not recommended.
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


def _ok(v, test) -> bool | None:
    return None if v is None or pd.isna(v) else bool(test(v))


def check(row: dict, budget: Budget) -> tuple[bool, list[str]]:
    """(inside the budget, the criteria that failed or could not be checked)."""
    checks = {
        "Δppl": _ok(row.get("ppl_delta_rel"), lambda v: abs(v) <= budget.max_ppl_rel),
        "top-1": _ok(row.get("top1_agreement"), lambda v: v >= budget.min_top1),
    }
    if "retrieval_diff" in row:
        checks["retrieval"] = _ok(row.get("retrieval_diff"), lambda v: v >= -budget.max_retrieval_drop)
    for key, value in row.items():
        if key.endswith("/flip_rate"):
            checks[key.rsplit("/", 1)[0] + " flips"] = _ok(value, lambda v: v <= budget.max_flip_rate)
    failed = [k for k, v in checks.items() if v is False]
    unchecked = [k for k, v in checks.items() if v is None]
    inside = not failed and checks["Δppl"] is not None and checks["top-1"] is not None
    return inside, failed + [f"{k} unmeasured" for k in unchecked]


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
                top1 = f", top-1 {100 * row['top1_agreement']:.2f}%" if "top1_agreement" in row else ""
                closest = f"; closest: {scheme} (Δppl {100 * row['ppl_delta_rel']:+.2f}%{top1}; fails {', '.join(notes)})"
            out[model] = f"{model}: keep bf16: no quantized scheme in the store is within the budget ({budget.describe()}){closest}"
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
