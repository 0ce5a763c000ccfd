"""What the report shows of an evaluation, declared by the evaluation: its summary :class:`Column` s,
budget :class:`Criterion` s, frames and notes as ``"module:function"`` strings of its own modules
(:class:`ReportSpec`, resolved with :func:`resolve`), and its plots by the names of the report's figures,
so an evaluation never imports, nor names, the report.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from evalkit.errors import EvalkitError


# ---- what the report shows -------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    """One summary-table column of an evaluation: its ``metric`` row (value and 95 % interval) per
    model x scheme, kept in the summary frame as ``key`` (default: the metric).

    ``labels="none"`` takes the unlabelled row; ``labels="last:bucket"`` the row whose ``bucket``
    label starts latest (the frame also keeps that label as ``<key>_bucket``). With a ``heading``
    the column is shown: the value times ``scale`` in ``fmt`` with ``unit``, its interval with
    ``interval``; ``baseline`` is what the baseline row shows instead (None: its value). It is shown
    when the frame has the column ``when`` (default: its own), and, with a ``group``, only when the
    report is asked for that group (``report --columns GROUP``)."""

    metric: str
    key: str = ""
    heading: str = ""
    fmt: str = ".3g"
    scale: float = 1.0
    unit: str = ""
    interval: bool = False
    baseline: str | None = None
    labels: str = "none"
    when: str = ""
    group: str = ""

    @property
    def column(self) -> str:
        return self.key or self.metric


@dataclass(frozen=True)
class Criterion:
    """One quality-budget criterion of ``evalkit report``'s recommendation, on a summary column.

    ``column`` may be ``*/<suffix>``: one criterion per column ending so, named with ``{task}``
    (the part before the suffix). The value compared is the column, its ``abs`` or its negation
    (``transform``), against the :class:`evalkit.report.budget.Budget` field ``budget``. A
    ``required`` criterion is listed (unmeasured) even when the column is missing, and a scheme is
    recommended only when every required criterion is measured."""

    name: str
    column: str
    budget: str
    lower_is_better: bool
    text: str
    unit: str = "%"
    digits: int = 2
    transform: str = ""  # "", "abs" or "neg"
    signed: bool = False  # show the column's own signed value rather than the compared one
    required: bool = False


@dataclass(frozen=True)
class ReportSpec:
    """What ``evalkit report`` shows of an evaluation, iterated over by the report (never by name).

    ``columns``: summary-table columns (:class:`Column`); ``frames`` / ``displays`` / ``notes``:
    ``"module:function"`` strings of the evaluation's own modules, resolved by the report, for what a plain
    column cannot say: ``frame(rows, slot)`` adds summary-frame columns from this eval's rows (``slot(model,
    scheme)`` is that row's dict), ``display(row, is_baseline)`` returns ``{heading: text}``, ``note(frame)``
    returns lines printed under the table. ``plots``: the figures of this eval's rows: a ``"module:function"`` of the evaluation's own, in its folder
    (``evals/<name>/plots.py``), ``plot(results, style=..., bands=...)``, which draws from a view of the store
    holding this eval's rows only and returns ``{name: figure}`` (the report saves each as PNG and SVG; it
    passes only the options the function accepts), or the name of a figure the report itself draws
    (``"positions"``: :data:`evalkit.report.evals.FIGURES`). ``criteria``: budget criteria (:class:`Criterion`).
    ``order``: where the eval's columns, notes and plots sit among the others (lowest first)."""

    columns: tuple[Column, ...] = ()
    frames: tuple[str, ...] = ()
    displays: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    plots: tuple[str, ...] = ()
    criteria: tuple[Criterion, ...] = ()
    order: int = 100


def resolve(path: str) -> Any:
    """The object a ``"module:name"`` string names (EvalkitError naming it when it cannot be imported)."""
    module, _, name = path.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in name.split(".") if name else ():
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise EvalkitError(f"{path!r} cannot be resolved ({type(exc).__name__}: {exc}): fix the declaration") from None
    return obj
