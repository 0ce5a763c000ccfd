"""``sweep --resolve``: grow the evidence of the criteria that straddle their limit, in stages, up to a budget.

    python -m evalkit sweep --resolve [--resolve-budget 30m] [--resolve-stages 3]
    python -m evalkit sweep --resolve --dry-run       # the plan: what straddles, the stages, their time

What straddles. The report's recommendation (:mod:`evalkit.report.recommend`) judges each quantized
scheme an engine runs on every criterion of the budget; a criterion whose interval crosses its limit is
*unresolved* ("the data cannot tell"). Resolve takes exactly those criteria (of the schemes whose verdict
is unresolved: a scheme outside on one criterion is outside whatever the others say), each from the
evaluation that declares it. Criteria without an interval, and engine rows (a backend's own), are not
grown.

How it grows. Each evaluation declares the parameter that counts its units (``Evaluation.grows``:
perplexity ``max_windows``, decode ``sequences``, retrieval ``samples`` per cell, lm-eval, generation
and longcontext ``limit``). Stage k of a (model, scheme, evaluation) is the store's run with that
parameter at ``n0 x 2**k``, a new run in the same store keyed by its new parameters: the store keeps
every finished run, so a kill loses nothing and a resumed ``--resolve`` skips what finished and
continues. Every straddling row takes stage 1, then every one still straddling stage 2, and so on, the
rows in the order the recommendation tests them (most bytes first). A row stops when none of its
criteria straddles (resolved inside or outside), at stage ``--resolve-stages`` (default 3: up to 8x
the units), or when its evaluation has no more units to give (the knob unset: it already reads them all).

The sequential rule. Each look is judged at ``1 - alpha / (stages + 1)`` (alpha 0.05 split over the
planned looks, Bonferroni: :mod:`evalkit.planning.sequential`); the number of stages is fixed by the
first ``--resolve`` on a store (its ledger, :mod:`evalkit.report.resolved`) and a later one with
another number is refused. The report reads the latest stage at that level and says so.

The budget. ``--resolve-budget`` (default 30 min: ``90s``, ``45m``, ``1.5h``) is wall time on this
machine. Each stage run is priced before it starts from the store's own measured times (the row's
previous stage x the growth, plus the grid's baseline run scaled to the new unit count where no run at
that count has computed the baseline yet; the dry run's estimate, :mod:`evalkit.sweep.estimate`, where
nothing is measured), times the ratio of measured to priced seconds of the stage runs already done in
this resolve (the machine's load now). The cheapest stages run first; a run whose price does not fit
in what is left is not started (a started run always finishes, so the budget can be overrun by one
run's error). It ends saying which: every criterion resolved, the stages planned all run, no more
units, or the budget spent (naming the runs that did not fit), and per criterion its state with the
units reached.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.errors import EvalkitError
from evalkit.planning.sequential import ALPHA, look_level
from evalkit.report import resolved as ledgers
from evalkit.report.budget import DECODE_KL, Budget, check, verdicts
from evalkit.report.cheapest import sequence_key
from evalkit.report.recommend import DEFAULT_ENGINE, emulated_groups
from evalkit.sweep.spec import RunSpec, canonical_json

DEFAULT_BUDGET_S = 30 * 60
DEFAULT_STAGES = 3
GROWTH = 2
_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_budget(text: str) -> float:
    """Seconds of ``90s``, ``45m``, ``1.5h`` (a bare number is minutes); EvalkitError naming the fix."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", str(text))
    if not m or float(m.group(1)) <= 0:
        raise EvalkitError(
            f"--resolve-budget {text!r} is not a time: give a positive number with s, m or h, e.g. 30m or 1.5h"
        )
    return float(m.group(1)) * _UNITS[m.group(2) or "m"]


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


def _base_run(grid, model: str, scheme: str, eval_name: str) -> RunSpec | None:
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
        base = _base_run(grid, s.model, s.scheme, s.eval)
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


@dataclass
class Outcome:
    """How a resolve ended: why, the time spent, the runs it added, and each criterion's final state."""

    why: str
    seconds: float
    budget_s: float
    added: list[str] = field(default_factory=list)  # "scheme eval knob n: seconds"
    states: list[str] = field(default_factory=list)

    def text(self) -> str:
        lines = [
            f"resolve: {self.why}; {self.seconds:,.0f} s of a {self.budget_s:,.0f} s budget spent, "
            f"{len(self.added)} runs added"
        ]
        lines += [f"  added: {a}" for a in self.added]
        lines += [f"  {s}" for s in self.states]
        return "\n".join(lines)


def _frame(out: Path):
    from evalkit.report.results import load_store
    from evalkit.report.tables import summary_frame

    results = load_store(out)
    frame = summary_frame(results)
    frame.attrs["layouts"] = results.layouts
    return frame, results


def final_states(grid, out: Path, ledger: dict, budget: Budget, engine) -> list[str]:
    """Per criterion that went through resolve or still straddles: resolved inside / outside, or unresolved,
    with the units reached (a criterion never grown: its stage 0)."""
    from evalkit.evals.base import get_eval

    frame, results = _frame(out)
    by_scheme = {(m, r["scheme"]): r for m, _, rows in emulated_groups(frame, engine) for r in rows}
    lines, seen = [], set()

    def state_line(model, scheme, name, reached):
        row = by_scheme.get((model, scheme))
        v = next((v for v in verdicts(row, budget) if v.name == name), None) if row else None
        if v is None:
            return f"{scheme} {name}: not judged at {reached}"
        state = {"inside": "resolved inside", "outside": "resolved outside"}.get(v.state, v.state)
        return f"{scheme} {name}: {state} at {reached}: {v.text}"

    for e in ledger["entries"]:
        last = ledgers.latest_stage(e, results.complete) or e["stages"][0]
        reached = f"{e['knob']} {last['n']} (stage {last['stage']} of {ledger['stages']})"
        for name in e["criteria"]:
            seen.add((e["model"], e["scheme"], name))
            lines.append(state_line(e["model"], e["scheme"], name, reached))
    for s in straddling(frame, budget, engine):
        if (s.model, s.scheme, s.criterion) in seen:
            continue
        knob = get_eval(s.eval).grows
        base = _base_run(grid, s.model, s.scheme, s.eval)
        n = base.params.get(knob) if base is not None and knob else None
        reached = f"{knob} {n} (stage 0 of {ledger['stages']}, not grown)" if n is not None else "the grid's units"
        lines.append(state_line(s.model, s.scheme, s.criterion, reached))
    return lines


def run_resolve(
    grid,
    store,
    executor,
    workdir: Path,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    stages: int = DEFAULT_STAGES,
    budget: Budget = Budget(),
    engine: str | None = DEFAULT_ENGINE,
    clock: Callable[[], float] = time.monotonic,
    price: Callable[[list[RunSpec]], dict[str, float]] | None = None,
    registry=None,
) -> Outcome:
    """Grow the straddling criteria of ``store`` (a finished sweep of ``grid``) stage by stage (module
    docstring). ``price(runs) -> {run id: seconds}`` replaces the estimate (tests)."""
    from evalkit.sweep.runner import plan

    if registry is None:
        from evalkit.evals import base

        registry = base.registry()
    out = Path(store.folder)
    ledger = ledgers.read_ledger(out) or new_ledger(stages)
    if int(ledger["stages"]) != stages:
        raise EvalkitError(
            f"{out} was resolved with --resolve-stages {ledger['stages']} (its looks are at "
            f"{100 * look_level(int(ledger['stages']), ledger['alpha']):.2f} %): resume with --resolve-stages "
            f"{ledger['stages']}, or resolve a copy of the store made before"
        )
    start = clock()
    took = priced = 0.0  # measured and priced seconds of the stage runs done here
    added: list[str] = []
    why = ""
    price = price or _estimator(grid, out, workdir)
    while not why:
        frame, results = _frame(out)
        straddles = straddling(frame, budget, engine)
        rows, stuck = rows_to_grow(grid, ledger, straddles, results.complete)
        todo = []
        for row in rows:
            last = ledgers.latest_stage(row.entry, results.complete)
            k = (last["stage"] if last else 0) + 1
            if k > stages:
                continue
            todo.append((row, k))
        if not straddles:
            why = "every criterion resolved"
        elif not todo:
            why = "the stages planned are all run" if rows else "no straddling criterion can grow"
            why += f" ({'; '.join(stuck)})" if stuck else ""
        todo = [(row, k, grown(row.base, row.stage_n(k))) for row, k in todo] if not why else []
        measured = {run.run_id: measured_price(grid, row, k, results.complete) for row, k, run in todo}
        unmeasured = [run for row, k, run in todo if measured[run.run_id] is None]
        prices = {**(price(unmeasured) if unmeasured else {}), **{k: v for k, v in measured.items() if v is not None}}
        todo.sort(key=lambda t: prices.get(t[2].run_id, 0.0))  # cheapest first: the budget resolves the most rows
        ran, over, counts = 0, [], set()
        for row, k, run in todo:
            if why:
                break
            raw = prices.get(run.run_id, 0.0)
            again = measured_price(grid, row, k, results.complete, counts)  # a run of this round cached its baseline
            raw = raw if again is None else again
            cost = raw * (took / priced if priced > 0 else 1.0)  # calibrated on the stage runs done here
            left = budget_s - (clock() - start)
            what = f"{row.entry['scheme']} {row.entry['eval']} {row.knob} {row.stage_n(k)}"
            if cost > left:  # not started: a cheaper row may still fit
                over.append(f"{what} priced {cost:,.0f} s, {max(left, 0):,.0f} s left")
                continue
            _record(ledger, row, k, run)
            ledgers.write_ledger(out, ledger)  # before the run: a kill leaves the plan, the store keeps the runs
            t0 = clock()
            if run.run_id not in results.complete:
                for _, outcome in executor.execute(plan([run]), store, workdir, registry, lambda r: None):
                    store.append(outcome)
                    if not outcome.ok:
                        print(f"resolve: FAILED {run.label()}: {outcome.error}", file=sys.stderr)
                        why = f"a stage run failed ({run.label()}: {outcome.error})"
            ran += 1
            counts.add((row.entry["eval"], row.stage_n(k)))
            took, priced = took + clock() - t0, priced + raw
            added.append(f"{what}: {clock() - t0:,.0f} s (priced {cost:,.0f} s)")
            print(f"resolve: {added[-1]}", file=sys.stderr, flush=True)
        if not why and todo and not ran:
            why = f"the budget is spent: no next stage fits ({'; '.join(over)})"
    return Outcome(why, clock() - start, budget_s, added, final_states(grid, out, ledger, budget, engine))


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
    auto = _base_run(grid, row.entry["model"], "auto", eval_name)
    first = complete.get(auto.run_id) if auto is not None else None
    if not done and first and first.get("seconds"):
        cost += float(first["seconds"]) * n / row.stage_n(0)
    return cost


def _record(ledger: dict, row: Row, k: int, run: RunSpec) -> None:
    if row.entry not in ledger["entries"]:
        ledger["entries"].append(row.entry)
    row.entry["criteria"] = list(dict.fromkeys([*row.entry["criteria"], *row.criteria]))
    if not any(s["stage"] == k for s in row.entry["stages"]):
        row.entry["stages"].append({"stage": k, "n": row.stage_n(k), "run_id": run.run_id})


def _estimator(grid, out: Path, workdir: Path, assume_device: str | None = None):
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


def plan_text(
    grid,
    out: Path,
    workdir: Path,
    *,
    budget_s: float,
    stages: int,
    assume_device=None,
    budget: Budget = Budget(),
    engine: str | None = DEFAULT_ENGINE,
) -> str:
    """The dry run's plan: the straddling criteria, each row's stages with their priced time, and how
    many of them the budget allows (every row's stage 1 first, then stage 2, ...)."""
    from evalkit.units import format_seconds

    price = _estimator(grid, out, workdir, assume_device)
    level = look_level(stages)
    head = (
        f"resolve plan: up to {stages} stages (x{GROWTH} the units each), every look at {100 * level:.2f} % "
        f"(alpha {ALPHA:g} over {stages + 1} looks, Bonferroni); budget {format_seconds(budget_s)}"
    )
    if not (out / "results.jsonl").is_file():
        return f"{head}\n  nothing to resolve yet: {out} has no results (run the sweep first)"
    frame, results = _frame(out)
    ledger = ledgers.read_ledger(out) or new_ledger(stages)
    straddles = straddling(frame, budget, engine)
    if not straddles:
        return f"{head}\n  nothing straddles its limit: every criterion of {out} is resolved"
    rows, stuck = rows_to_grow(grid, ledger, straddles, results.complete)
    lines = [head, "  straddling:"] + [f"    {s.scheme}: {s.text}" for s in straddles]
    lines += [f"  cannot grow: {w}" for w in stuck]
    planned = []
    for row in rows:
        last = ledgers.latest_stage(row.entry, results.complete)
        first = (last["stage"] if last else 0) + 1
        runs = [(k, grown(row.base, row.stage_n(k))) for k in range(first, stages + 1)]
        if not runs:
            continue
        secs = price([r for _, r in runs])
        planned += [(k, row, secs.get(run.run_id), run) for k, run in runs]
    planned.sort(key=lambda p: (p[0], p[1].order))
    lines.append("  stages (in the order they run):")
    total, fits = 0.0, 0
    for k, row, seconds, _ in planned:
        total += seconds or 0.0
        ok = total <= budget_s
        fits += ok
        lines.append(
            f"    stage {k}: {row.entry['scheme']} {row.entry['eval']} {row.knob} {row.stage_n(k)} "
            f"({', '.join(row.criteria)}): {format_seconds(seconds) if seconds is not None else 'not priced'}"
            f"{'' if ok else '  (over the budget)'}"
        )
    lines.append(
        f"  the budget allows {fits} of {len(planned)} stage runs ({format_seconds(total)} for all); resolve stops "
        "early where a row's criteria resolve"
    )
    return "\n".join(lines)
