"""The order a model's runs execute in: grouped by model (each loaded once), then by evaluation (each prepared
once: its data and baseline pass), the baseline scheme first.

Its own module because both the runner (:mod:`evalkit.sweep.runner`) and the estimate that prices a grid
before it runs (:mod:`evalkit.sweep.estimate`, which the runner's size step reads) follow the same order.
"""

from __future__ import annotations

from evalkit.sweep.spec import RunSpec


def plan(runs: list[RunSpec]) -> list[list[RunSpec]]:
    """Group runs by model (first-appearance order); inside, by evaluation, the baseline first."""
    groups: dict[str, list[RunSpec]] = {}
    for r in runs:
        groups.setdefault(r.model.key, []).append(r)
    out = []
    for g in groups.values():
        eval_order = list(dict.fromkeys(r.eval_key for r in g))
        out.append(sorted(g, key=lambda r: (eval_order.index(r.eval_key), r.scheme != "auto")))
    return out
