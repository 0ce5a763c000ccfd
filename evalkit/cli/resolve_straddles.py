"""What ``sweep --resolve`` grows: the criteria that straddle their limit, and the (model, scheme,
evaluation) rows whose stage runs grow them.

:func:`straddling` reads the store as the report's recommendation does (:mod:`evalkit.report.budget`:
each criterion judged on its interval) and keeps the criteria whose interval crosses the limit, of the
rows whose verdict is unresolved, each with the evaluation that declares it (:func:`eval_of`) and the
row's place in the recommendation's fixed sequence. :func:`rows_to_grow` turns them into :class:`Row`
values, one per (model, scheme, evaluation), each with its ledger entry (:mod:`evalkit.report.resolved`)
and the grid's run it grows from: stage k runs the evaluation with its unit count
(``Evaluation.grows``) at ``n0 x GROWTH**k`` (:func:`grown`: a new run id, since the store keys runs by
their parameters). The loop that runs the stages, and the plan it prints, are :mod:`evalkit.cli.resolve`.
"""

from __future__ import annotations

from dataclasses import dataclass

from evalkit.planning.sequential import ALPHA
from evalkit.report.budget import DECODE_KL, Budget, check, verdicts
from evalkit.report.cheapest import sequence_key
from evalkit.report.recommend import DEFAULT_ENGINE, emulated_groups
from evalkit.sweep.spec import RunSpec, canonical_json

GROWTH = 2  # each stage runs the units of the one before it times this


@dataclass(frozen=True)
class Straddle:
    """One criterion of one row that straddles its limit."""

    model: str
    scheme: str
    eval: str
    criterion: str
    text: str
    order: tuple  # the row's place in the recommendation's fixed sequence


def eval_of(column: str) -> str | None:
    """The evaluation that declares the criterion read from ``column``."""
    from evalkit.report import evals as report_evals

    if column == DECODE_KL.column:
        return "decode"
    for name, spec in report_evals.specs():
        for c in spec.criteria:
            if c.column == column or (c.column.startswith("*/") and column.endswith(c.column[1:])):
                return name
    return None


def straddling(frame, budget: Budget = Budget(), engine: str | None = DEFAULT_ENGINE) -> list[Straddle]:
    """The criteria with an interval across their limit, of the rows the recommendation reads as unresolved."""
    out = []
    for model, _, rows in emulated_groups(frame, engine):
        for row in rows:
            if check(row, budget)[0] != "unresolved":
                continue
            for v in verdicts(row, budget):
                ev = eval_of(v.column)
                if v.state == "unresolved" and v.spread is not None and ev is not None:
                    out.append(Straddle(model, row["scheme"], ev, v.name, v.text, sequence_key(row)))
    return sorted(out, key=lambda s: (s.model, s.order, s.eval, s.criterion))


def grown(run: RunSpec, n: int) -> RunSpec:
    """``run`` with its evaluation's unit count at ``n`` (a new run id: the store keys runs by parameters)."""
    from evalkit.evals.base import get_eval

    cls = get_eval(run.eval)
    ev = cls({**run.params, cls.grows: n})
    return RunSpec(
        run.model,
        run.scheme,
        run.eval,
        canonical_json(ev.canonical_params()),
        canonical_json(ev.params),
        run.engine,
        run.engine_options_json,
    )


def base_run(grid, model: str, scheme: str, eval_name: str) -> RunSpec | None:
    """The grid's one emulation run of (model, scheme, evaluation), or None."""
    found = [
        r
        for r in grid.runs
        if r.model.name == model and r.scheme == scheme and r.eval == eval_name and r.engine == "emulation"
    ]
    return found[0] if len(found) == 1 else None


@dataclass
class Row:
    """One (model, scheme, evaluation) resolve grows: its ledger entry and the criteria that straddled."""

    entry: dict
    base: RunSpec
    knob: str
    criteria: list[str]
    order: tuple

    def stage_n(self, k: int) -> int:
        return int(self.entry["stages"][0]["n"]) * GROWTH**k


def _entry(ledger: dict, s: Straddle) -> dict | None:
    return next(
        (e for e in ledger["entries"] if (e["model"], e["scheme"], e["eval"]) == (s.model, s.scheme, s.eval)), None
    )


def new_ledger(stages: int, alpha: float = ALPHA) -> dict:
    return {"alpha": alpha, "stages": stages, "entries": []}


def rows_to_grow(grid, ledger: dict, straddles: list[Straddle], complete) -> tuple[list[Row], list[str]]:
    """(the rows whose criteria straddle and that can take another stage, why the others cannot)."""
    from evalkit.evals.base import get_eval

    rows: dict[tuple, Row] = {}
    why = []
    for s in straddles:
        key = (s.model, s.scheme, s.eval)
        if key in rows:
            rows[key].criteria.append(s.criterion)
            continue
        knob = get_eval(s.eval).grows
        base = base_run(grid, s.model, s.scheme, s.eval)
        entry = _entry(ledger, s)
        if knob is None or base is None:
            why.append(f"{s.scheme} {s.criterion}: {s.eval} declares no unit count to grow")
            continue
        if entry is None:
            n0 = base.params.get(knob)
            if not isinstance(n0, int):
                why.append(f"{s.scheme} {s.criterion}: {s.eval} {knob} is unset (it already reads every unit)")
                continue
            entry = {
                "model": s.model,
                "scheme": s.scheme,
                "eval": s.eval,
                "knob": knob,
                "criteria": [],
                "stages": [{"stage": 0, "n": n0, "run_id": base.run_id}],
            }
        rows[key] = Row(entry, base, knob, [s.criterion], s.order)
    return sorted(rows.values(), key=lambda r: (r.order, r.entry["eval"])), why


def record(ledger: dict, row: Row, k: int, run: RunSpec) -> None:
    """Enter ``row``'s stage ``k`` (its run ``run``) and its criteria in ``ledger``."""
    if row.entry not in ledger["entries"]:
        ledger["entries"].append(row.entry)
    row.entry["criteria"] = list(dict.fromkeys([*row.entry["criteria"], *row.criteria]))
    if not any(s["stage"] == k for s in row.entry["stages"]):
        row.entry["stages"].append({"stage": k, "n": row.stage_n(k), "run_id": run.run_id})
