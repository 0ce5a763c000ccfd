"""What ``evalkit run`` prints of the runs it made: each row with its model, scheme and evaluation, as a table
(one line per scheme, the evaluation's summary metrics as columns, each interval held inside its metric's
domain as the report shows it, :mod:`evalkit.evals.metric_domains`) or as JSON rows.

An engine that gives the top-k log-probs only gives the KL's lower bound (:data:`BOUND_METRICS`), and its noise
floor run (``auto`` against a second realisation of ``auto``, :func:`evalkit.sweep.grid.noise_floor_runs`)
is shown as ``auto (noise floor)``, not as a scheme of its own.
"""

from __future__ import annotations

import pandas as pd

from evalkit.evals.metric_domains import clip_interval

NOISE_FLOOR_LABEL = "noise floor"  # how run's table and the report name the auto-vs-auto realisation
BOUND_METRICS = {"kl_mean": "kl_lower_bound", "free_kl_mean": "free_kl_lower_bound"}


def run_rows(done: list, model_name: str) -> list[dict]:
    """The rows of each (run, rows) of ``done``, each with the model (as named), scheme and evaluation."""
    return [
        {**d, "model": model_name, "scheme": shown_scheme(spec), "eval": spec.eval} for spec, rows in done for d in rows
    ]


def run_table(rows: list[dict], metrics: tuple[str, ...]) -> str:
    """``rows`` as a table of the evaluation's summary ``metrics`` (their lower bounds where an engine's top-k
    gives the bound only)."""
    if any(r["metric"] in BOUND_METRICS.values() for r in rows):
        metrics = tuple(BOUND_METRICS.get(m, m) for m in metrics)
    return rows_table(rows, metrics)


def shown_scheme(spec) -> str:
    """How ``run`` names a run's rows: its scheme, and ``auto (noise floor)`` for the engine's noise floor run
    (auto against a second realisation of auto), which is not a scheme of its own."""
    return f"{spec.scheme} ({NOISE_FLOOR_LABEL})" if spec.engine_options.get("noise_floor") else spec.scheme


def _cell(row: dict) -> str:
    v = row["value"]
    if v is None:
        return "nan"
    if isinstance(v, str):
        return v
    text = f"{v:.4g}"
    low, high = row.get("ci_low"), row.get("ci_high")
    if low is not None and high is not None:
        low, high = clip_interval(row["metric"], low, high)  # as the report shows it: inside the metric's domain
        text += f" [{low:.3g}, {high:.3g}]"
    return text


def _column(row: dict) -> str:
    """A row's column: its metric, and its length bucket where it has one (one column per bucket)."""
    bucket = (row.get("labels") or {}).get("bucket")
    return row["metric"] if bucket is None else f"{row['metric']} [{bucket}]"


def rows_table(rows: list[dict], metrics: tuple[str, ...] = ()) -> str:
    """One line per scheme with the unlabeled metrics (or ``metrics``) as columns."""

    plain = [r for r in rows if not r.get("labels")]
    if metrics:
        plain = [r for r in plain if r["metric"] in metrics]
    if not plain:
        plain = rows
    order = list(dict.fromkeys(r["scheme"] for r in rows))
    cols = list(metrics) or list(dict.fromkeys(_column(r) for r in plain))
    table = pd.DataFrame(index=order, columns=cols, dtype=object)
    for r in plain:
        if _column(r) in table.columns:
            table.loc[r["scheme"], _column(r)] = _cell(r)
    table.index.name = "scheme"
    return table.fillna("").to_markdown()
