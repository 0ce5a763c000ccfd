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

The straddling criteria and the rows grown are :mod:`evalkit.cli.resolve_straddles`; the prices,
:mod:`evalkit.cli.resolve_price`; this module is the loop that runs the stages and the plan it prints.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.cli.resolve_price import estimator, measured_price
from evalkit.cli.resolve_straddles import GROWTH, base_run, grown, new_ledger, record, rows_to_grow, straddling
from evalkit.errors import EvalkitError
from evalkit.planning.sequential import ALPHA, look_level
from evalkit.report import resolved as ledgers
from evalkit.report.budget import Budget, verdicts
from evalkit.report.recommend import DEFAULT_ENGINE, emulated_groups
from evalkit.sweep.spec import RunSpec

DEFAULT_BUDGET_S = 30 * 60
DEFAULT_STAGES = 3
_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_budget(text: str) -> float:
    """Seconds of ``90s``, ``45m``, ``1.5h`` (a bare number is minutes); EvalkitError naming the fix."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", str(text))
    if not m or float(m.group(1)) <= 0:
        raise EvalkitError(
            f"--resolve-budget {text!r} is not a time: give a positive number with s, m or h, e.g. 30m or 1.5h"
        )
    return float(m.group(1)) * _UNITS[m.group(2) or "m"]


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
        base = base_run(grid, s.model, s.scheme, s.eval)
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
    from evalkit.sweep.run_order import plan

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
    price = price or estimator(grid, out, workdir)
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
            record(ledger, row, k, run)
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

    price = estimator(grid, out, workdir, assume_device)
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
