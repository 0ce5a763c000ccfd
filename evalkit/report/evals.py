"""The evaluations as the report sees them: each one's declared :class:`~evalkit.evals.base.ReportSpec`.

The report never filters by an evaluation's name: it iterates over the registered evaluations
(built-ins, plugins from ``EVALKIT_EVALS``, evals registered at run time), in their declared
``order``, and each one's columns, hooks, notes, plots and budget criteria act on that
evaluation's rows only. An evaluation whose module cannot be imported here (a missing optional
dependency) is left out of the report.

A declared column keeps, beside its value and interval, what its row's info says of them
(:data:`INFO_COLUMNS`): the per-unit numbers of a paired comparison, "not measured by this protocol"
(shown as such, never as a blank or 0) and the interval's description. A not-measured row that an
evaluation's own frame hook fills (lm-eval's tasks) gets ``<metric>_not_measured`` too.
"""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import replace

import pandas as pd

from evalkit.errors import EvalkitError
from evalkit.evals.base import Column, Criterion, ReportSpec, eval_names, get_eval, resolve
from evalkit.units import value_with_interval


def specs() -> list[tuple[str, ReportSpec]]:
    """(eval name, its ReportSpec) of every evaluation that declares one, lowest ``order`` first."""
    out = []
    for name in eval_names():
        try:
            cls = get_eval(name)
        except ImportError:
            continue
        if cls.report != ReportSpec():
            out.append((name, cls.report))
    return sorted(out, key=lambda item: item[1].order)


# what a cell's row says beyond its numbers, kept beside them as ``<key><suffix>`` summary columns: the per-unit
# numbers a paired comparison of two rows needs (evalkit.report.order), "not measured by this protocol" (a NaN
# that is no missing number: evalkit.report.marks, recommend), and what the interval is (float spread or not)
INFO_COLUMNS = {"units": "_units", "not_measured": "_not_measured", "ci": "_ci_text"}
NOT_DATA = ("_units", "_ci_text")  # left out of the CSV (which keeps why a number is not measured)


def _with_ci(out: dict, key: str, row) -> None:
    out[key] = row["value"]
    out[f"{key}_lo"] = row["ci_low"]
    out[f"{key}_hi"] = row["ci_high"]
    info = row["info"] or {}
    for name, suffix in INFO_COLUMNS.items():
        if info.get(name) is not None:
            out[f"{key}{suffix}"] = info[name]


def _label_start(label) -> float:
    m = re.match(r"\s*(\d+)", str(label))
    return float(m.group(1)) if m else math.nan


def _fill(rows: pd.DataFrame, col: Column, slot) -> None:
    sel = rows[rows["metric"] == col.metric]
    if col.labels == "none":
        for _, r in sel[~sel["labels"].map(bool)].iterrows():
            _with_ci(slot(r["model"], r["scheme"]), col.column, r)
        return
    kind, _, label = col.labels.partition(":")
    if kind != "last" or not label:
        raise EvalkitError(f"report column {col.column!r} has labels {col.labels!r}: use 'none' or 'last:<label>'")
    sel = sel[sel["labels"].map(lambda d: label in (d or {})).astype(bool)]  # astype: an empty mask stays a mask
    for (model, scheme), g in sel.groupby(["model", "scheme"], sort=False):
        last = g.loc[g["labels"].map(lambda d: _label_start(d[label])).idxmax()]
        out = slot(model, scheme)
        _with_ci(out, col.column, last)
        out[f"{col.column}_{label}"] = last["labels"][label]


def fill_frame(df: pd.DataFrame, slot) -> None:
    """Every declared column (and frame hook) of every evaluation, from its own rows of ``df``."""
    for name, spec in specs():
        rows = df[df["eval"] == name]
        if rows.empty:
            continue
        for col in spec.columns:
            _fill(rows, col, slot)
        for hook in spec.frames:
            resolve(hook)(rows, slot)
        _not_measured(rows, spec, slot)


def _not_measured(rows: pd.DataFrame, spec: ReportSpec, slot) -> None:
    """``<metric>_not_measured`` for the rows an evaluation's own frame hook filled (lm-eval's tasks): a
    declared column carries it already (:func:`_with_ci`), under its key."""
    declared = {col.metric for col in spec.columns}
    marked = rows["info"].map(lambda i: bool((i or {}).get("not_measured")))
    for _, r in rows[marked & ~rows["metric"].isin(declared)].iterrows():
        slot(r["model"], r["scheme"])[f"{r['metric']}_not_measured"] = r["info"]["not_measured"]


def number(v, fmt: str) -> str:
    """A table cell's number in ``fmt``; empty for a missing value."""
    return "" if v is None or pd.isna(v) else format(v, fmt)


NOT_MEASURED = "not measured"  # the cell of a column the row's protocol does not measure (never a 0 or a blank)


def _cell(r: dict, col: Column, base: bool) -> str:
    if base and col.baseline is not None:
        return col.baseline
    if isinstance(r.get(f"{col.column}_not_measured"), str):  # NaN where another row of the frame has one
        return NOT_MEASURED
    if col.interval:
        return value_with_interval(r, col.column, col.scale, col.fmt, col.unit)
    v = r.get(col.column)
    text = number(math.nan if v is None or pd.isna(v) else v * col.scale, col.fmt)
    return text + col.unit if text else ""


def display(r: dict, base: bool, groups: tuple[str, ...] = ()) -> dict[str, str]:
    """``{heading: text}`` of one summary row, evaluation by evaluation (optional groups when asked)."""
    out: dict[str, str] = {}
    for _, spec in specs():
        for col in spec.columns:
            if col.heading and (col.when or col.column) in r and (not col.group or col.group in groups):
                out[col.heading] = _cell(r, col, base)
        for hook in spec.displays:
            out.update(resolve(hook)(r, base))
    return out


def notes(frame: pd.DataFrame) -> list[str]:
    """The evaluations' own lines under the table."""
    return [line for _, spec in specs() for hook in spec.notes for line in resolve(hook)(frame)]


def criteria() -> list[Criterion]:
    """Every evaluation's budget criteria, in report order."""
    return [c for _, spec in specs() for c in spec.criteria]


# The figures the report itself draws, by the name an evaluation's ReportSpec.plots gives them; every other
# plot is a "module:function" of the evaluation's own, in its folder (evals/decode/plots.py,
# evals/retrieval/plots.py, a plugin's figures).
FIGURES = {
    "positions": "evalkit.report.plots:positions_figures",  # per token-position bucket (perplexity)
}


def figures(results, **options) -> dict:
    """name -> figure of every evaluation's declared plots, each called on a view of the store
    holding that evaluation's rows only, with the ``options`` its signature accepts (style, bands)."""
    out: dict = {}
    for name, spec in specs():
        if not spec.plots:
            continue
        view = replace(results, rows=results.rows[results.rows["eval"] == name])
        if view.rows.empty:
            continue
        for hook in spec.plots:
            fn = resolve(FIGURES.get(hook, hook))
            params = inspect.signature(fn).parameters
            takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
            out.update(fn(view, **{k: v for k, v in options.items() if takes_any or k in params}))
    return out


def names() -> list[str]:
    return [name for name, _ in specs()]


def declaring(results, plot: str):
    """A view of ``results`` holding the rows of the evaluations whose ReportSpec declares ``plot`` (a name of
    :data:`FIGURES` or a ``module:function``)."""
    names = [name for name, spec in specs() if plot in spec.plots]
    return replace(results, rows=results.rows[results.rows["eval"].isin(names)])
