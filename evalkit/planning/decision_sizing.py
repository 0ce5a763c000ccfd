"""The dry run's decision table: per accuracy task of a grid, the items that resolve a drop, and their time.

    python -m evalkit sweep gpu --dry-run --assume-device h200

prints, under the run table, one line per accuracy decision (:mod:`evalkit.evals.accuracy_tasks`: a
RULER task at each length, LongBench v2 per length class, each reasoning task): the baseline accuracy
assumed, the discordance psi and where it comes from (a prior, raised to the upper end of a pilot's
95 % interval where the grid's own results store holds an earlier run, with the pilot's item count),
the items the budget's decision "drop <= :data:`~evalkit.planning.decision.DROP`" needs (a
non-inferiority test, :func:`~evalkit.planning.decision.items_noninferior`) with 80 % power for a
scheme with no true drop (and an unpaired comparison's, per arm), the items the dataset has and the
grid runs, the smallest limit the grid's items decide, and the time one scheme's pass over the needed items and over
the planned ones takes on the priced device (the sweep's own speed: the datasheet of
``--assume-device``, or the probe / measured device), each item priced as its prompt's prefill and
``samples`` x its generation budget in decode steps, batched as lm-eval batches them; a grid whose model
runs through a real engine on a named GPU is priced at engine speed (:mod:`evalkit.sweep.engine_speed`).
A grid of several models is priced on its first model (the decisions are the same tasks; only their
times differ).

The baseline accuracy is the model's own where known (:mod:`evalkit.planning.model_cards`): the grid's
pilot (the ``auto`` run already in its results store), else the model's card, else the default of
:mod:`evalkit.evals.accuracy_tasks` (Llama-3.1-8B-Instruct's card, or a stated assumption); each
task's source line says which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from evalkit.evals.accuracy_tasks import TaskPlan, accuracy_tasks
from evalkit.evals.sizing import AUTO_BATCH, item_forwards
from evalkit.planning import decision as D
from evalkit.planning.model_cards import _key, card_baseline, pilot_baselines
from evalkit.units import format_seconds


def measured_discordance(rows) -> dict[str, D.Pilot]:
    """Per task label, what a pilot measured of the discordance in ``rows`` (a results store's rows, read
    by the caller: the grid's ``--out``, if it has any): the largest share any scheme showed, the largest
    upper end of the schemes' 95 % Wilson intervals, and the items behind it."""
    from evalkit.evals.stats import binomial_ci

    counts: dict[tuple, list] = {}  # (run, task key) -> [discordant items, items]
    for row in rows:
        metric, value, labels = str(row.get("metric")), row.get("value"), row.get("labels") or {}
        if not isinstance(value, (int, float)) or math.isnan(value) or row.get("scheme") == "auto":  # the baseline
            continue
        info = row.get("info") or {}
        task, _, stat = metric.rpartition("/")
        if stat == "discordance" and row.get("eval") == "longcontext":
            length = labels.get("length", "all")
            key = task if length == "all" else f"{task}@{length}"
            n = int(info.get("n_items", 0))
            k = int(info.get("n_changed", round(float(value) * n)))
            counts[(row.get("run_id"), key)] = [k, n]
        elif stat in ("flip_right_to_wrong", "flip_wrong_to_right") and labels.get("filter", "none") == "none":
            n = int(info.get("n_items", 0))
            k = int(info.get("n_flipped", round(float(value) * n)))
            c = counts.setdefault((row.get("run_id"), task), [0, n])
            c[0] += k
    found: dict[str, D.Pilot] = {}
    for (_, key), (k, n) in counts.items():
        if n <= 0:
            continue
        upper = binomial_ci(min(k, n), n)[1]
        old = found.get(key)
        if old is None or upper > old.upper:
            found[key] = D.Pilot(max(k / n, old.share if old else 0.0), upper, n)
        else:
            found[key] = D.Pilot(max(k / n, old.share), old.upper, old.items)
    return found


@dataclass(frozen=True)
class Decision:
    plan: TaskPlan
    need: D.Requirement | None
    psi_source: str
    seconds_needed: float | None
    seconds_planned: float | None


def decisions(grid, speeds: dict, rows=(), drop: float = D.DROP) -> list[Decision]:
    """One :class:`Decision` per accuracy task of each model of ``grid`` (``speeds``: model -> (facts, Speed);
    ``rows``: a pilot's results-store rows, whose discordance's upper bound raises the prior where it is above it)."""
    evals: dict[str, dict] = {}
    batches: dict[str, object] = {}
    for run in grid.runs:
        evals.setdefault(run.eval, run.params)
        batches.setdefault(run.eval, run.params.get("batch_size"))
    measured = measured_discordance(rows)
    pilot = pilot_baselines(rows)
    model = grid.runs[0].model.name if grid.runs else None
    facts, speed = speeds.get(model, (None, None))
    result = []
    for plan in accuracy_tasks(evals):
        if plan.facts is None:
            result.append(Decision(plan, None, "", None, None))
            continue
        f = _own_baseline(plan.facts, model, plan, pilot)
        plan = replace(plan, facts=f)
        prior = D.discordance_prior(f.baseline, drop, f.kind)
        psi, source = D.pilot_psi(prior, measured.get(plan.label, measured.get(plan.task)))
        source = source.replace("prior", f"prior r={D.REDRAW_SHARE[f.kind]:g} ({f.kind})", 1)
        need = D.requirement(f.baseline, psi, plan.planned, drop)
        batch = batches.get(plan.eval)
        batch = AUTO_BATCH if batch in (None, "auto") else int(batch)
        timed = [_seconds(speed, facts, plan, n, batch) for n in (min(need.paired, f.docs), plan.planned)]
        result.append(Decision(plan, need, source, *timed))
    return result


def _own_baseline(f, model: str | None, plan: TaskPlan, pilot: dict):
    """``f`` with the model's own baseline: the grid's pilot run, else its model card, else ``f``'s default."""
    if plan.label in pilot or plan.task in pilot:
        value = pilot.get(plan.label, pilot.get(plan.task))
        return replace(f, baseline=min(max(value, 0.001), 0.999), source=f"the auto run in --out (pilot): {value:.3f}")
    card = card_baseline(model, plan.task) if model else None
    if card is not None:
        return replace(f, baseline=card[0], source=card[1])
    if (
        model
        and f.source.startswith(("Llama-3.1-8B-Instruct", "model card"))
        and _key(model) != "llama-3.1-8b-instruct"
    ):
        return replace(f, source=f"{f.source} (Llama-3.1-8B-Instruct's: no figure for {model} here)")
    return f


def _seconds(speed, facts, plan: TaskPlan, n: int, batch: int) -> float | None:
    """One scheme's pass over ``n`` items of ``plan`` at ``speed`` (None: the model is not priced); an
    engine's throughput model (:class:`evalkit.sweep.engine_speed.EngineSpeed`) batches them itself."""
    if speed is None or facts is None:
        return None
    if hasattr(speed, "step_seconds"):  # the engine: every item at once, batched to its limits
        fw = item_forwards(n, plan.facts.prompt_tokens, plan.gen_tokens, plan.samples, speed.max_seqs)
        return speed.seconds(fw, facts, speed.kv_bytes(facts))
    fw = item_forwards(n, plan.facts.prompt_tokens, plan.gen_tokens, plan.samples, batch)
    return sum(speed.seconds(x, facts) for x in fw)


def _n(x: int) -> str:
    return f"{x:,}"


def decision_text(grid, speeds: dict, rows, device: str, drop: float = D.DROP) -> str:
    """The table the dry run prints (module docstring); "" when the grid runs no accuracy task."""
    every = decisions(grid, speeds, rows, drop)
    rows = [d for d in every if d.need is not None]
    unsized = [d.plan.label for d in every if d.need is None]
    if not rows:
        return ""  # no task evalkit knows the size of (evalkit's own offline tasks): no table
    header = (
        "task",
        "eval",
        "base acc",
        "psi",
        "paired n",
        "unpaired n",
        "items",
        "planned",
        "resolves",
        f"time paired n ({device})",
        "time planned",
    )
    cells = []
    for d in rows:
        p = d.plan
        f, need = p.facts, d.need
        short = need.paired > f.docs
        cells.append(
            (
                p.label,
                p.eval,
                f"{f.baseline:.3f}",
                f"{need.psi:.4f}",
                _n(need.paired) + (" > items" if short else ""),
                _n(need.unpaired),
                _n(f.docs),
                _n(p.planned) + (f" x{p.samples}" if p.samples > 1 else ""),
                "-" if math.isinf(need.detectable_at_planned) else f"{100 * need.detectable_at_planned:.1f} pts",
                format_seconds(d.seconds_needed) + (" (all items)" if short else ""),
                format_seconds(d.seconds_planned),
            )
        )
    widths = [max(len(str(c)) for c in col) for col in zip(header, *cells)]

    def line(row) -> str:
        return "  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths)))

    sources = sorted({f"{d.plan.label.split('@')[0]}: {d.psi_source}; baseline: {d.plan.facts.source}" for d in rows})
    lines = [
        "",
        f"decision sizing: items for the budget's decision 'drop <= {100 * drop:g} pt' (non-inferiority: the "
        f"drop's 95 % upper end below the limit) with {100 * D.POWER:.0f} % power for a scheme with no true drop, "
        "paired vs unpaired (per arm); time of one scheme's pass",
        "  paired n = (z_a + z_b)^2 (psi - t^2) / (L - t)^2, L the limit, t the true drop (0 here; t = L/2 needs "
        "about 4x), psi the discordant share = max(prior max(L, r 2p(1-p)), a pilot's 95 % upper bound); "
        "'resolves': the smallest limit the planned items decide (docs/long-context.md#sizing-a-decision)",
        "",
        line(header),
        *(line(c) for c in cells),
        "",
        *(f"psi and baseline of {s}" for s in sources),
        *([f"not sized (no item count known here): {', '.join(unsized)}"] if unsized else []),
    ]
    return "\n".join(lines)
