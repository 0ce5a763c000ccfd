"""What a stage run of ``sweep --resolve`` costs, priced before it starts.

:func:`measured_price` prices it from the store's own measured times: the row's previous stage times the
growth, plus the grid's baseline run scaled to the new unit count where no run at that count has computed
(and cached) the baseline yet. :func:`estimator` prices what nothing measured can: the dry run's estimate
(:func:`evalkit.sweep.estimate.estimate_sweep`), probing the model once. The resolve loop
(:mod:`evalkit.cli.resolve`) then scales either by the ratio of measured to priced seconds of the stage
runs it has done (the machine's load now).
"""

from __future__ import annotations

from pathlib import Path

from evalkit.cli.resolve_straddles import GROWTH, Row, base_run
from evalkit.report import resolved as ledgers
from evalkit.sweep.spec import RunSpec, canonical_json


def measured_price(grid, row: Row, k: int, complete, counts: set = frozenset()) -> float | None:
    """Seconds of ``row``'s stage ``k`` from this store's measured times (None: nothing measured to scale): its
    previous stage's time x the growth, plus, where no run at the new unit count is done yet (its baseline is
    not cached; ``counts``: (evaluation, count) runs done since ``complete`` was read), the grid's baseline
    run's time scaled to the new count."""
    last = ledgers.latest_stage(row.entry, complete)
    prev = complete.get(last["run_id"]) if last else None
    if not prev or not prev.get("seconds"):
        return None
    cost = GROWTH * float(prev["seconds"])
    n, eval_name = row.stage_n(k), row.entry["eval"]
    done = (eval_name, n) in counts or any(
        rec.get("eval") == eval_name and ((rec.get("spec") or {}).get("params") or {}).get(row.knob) == n
        for rec in complete.values()
    )
    auto = base_run(grid, row.entry["model"], "auto", eval_name)
    first = complete.get(auto.run_id) if auto is not None else None
    if not done and first and first.get("seconds"):
        cost += float(first["seconds"]) * n / row.stage_n(0)
    return cost


def estimator(grid, out: Path, workdir: Path, assume_device: str | None = None):
    """Price runs with the dry run's estimate (:func:`evalkit.sweep.estimate.estimate_sweep`: each run with the
    baseline its new unit count needs), probing the model once."""
    from evalkit.sweep import estimate as E

    speeds: dict = {}

    def speed_for(spec, facts, notes):
        if spec.key not in speeds:
            speeds[spec.key] = E._speed(spec, facts, assume_device, notes)
        return speeds[spec.key]

    def price(runs: list[RunSpec]) -> dict[str, float]:
        out_ = {}
        for k in sorted({_stage_of(r) for r in runs}):  # one (scheme, eval) per call: the estimate's rows name no run
            batch = [r for r in runs if _stage_of(r) == k]
            est = E.estimate_sweep(grid, batch, out, workdir, assume_device=assume_device, speed_for=speed_for)
            by = {(e.model, e.scheme, e.eval): e.seconds for e in est.runs}
            out_.update({r.run_id: by.get((r.model.name, r.scheme, r.eval)) or 0.0 for r in batch})
        return out_

    return price


def _stage_of(run: RunSpec) -> str:
    from evalkit.evals.base import get_eval

    return canonical_json(run.params.get(get_eval(run.eval).grows))
