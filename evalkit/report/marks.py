"""Marks on the table's scheme labels, and their notes: what a row is not.

* ``†`` **hypothetical**: no engine profile runs the scheme (:mod:`evalkit.report.engine_fit`); the
  "runs on" column names those that do (``~name``: with the engine's own rounding or storage).
* ``≈n`` **order not resolved**: rows of one model and backend with the same bytes per token whose
  Δppl intervals overlap, chained (A overlaps B, B overlaps C: one group n). Where the intervals include
  the float spread (perplexity ``float_noise_seeds``) the data do not resolve their order; where they
  are sampling-only, the note says the order may be unresolved even outside the groups.

The figures carry the same marks (:func:`styled`): a point or legend entry names a scheme exactly as
its table row does, so a hypothetical scheme is never read off a figure as an engine's number.
"""

from __future__ import annotations

import re

import pandas as pd

from evalkit.engines.profiles import PROFILES
from evalkit.kv.scheme import Scheme, parse_scheme
from evalkit.report import engine_fit
from evalkit.report.style import SchemeStyle

RUNS_ON = "runs_on"
ORDER_KEY = "ppl_delta_rel"


def add_runs_on(frame: pd.DataFrame, layouts: dict) -> pd.DataFrame:
    """``frame`` with a ``runs_on`` column (the engines that run each row's scheme) and the store's
    layouts in ``attrs`` (the recommendation checks head_dim requirements with them)."""
    frame[RUNS_ON] = [engine_fit.runs_on(s, layouts.get(m)) for m, s in zip(frame["model"], frame["scheme"])]
    frame.attrs["layouts"] = dict(layouts)
    return frame


def order_groups(frame: pd.DataFrame) -> dict[int, int]:
    """frame index -> group number (1, 2, ...) of rows whose order the Δppl intervals do not resolve."""
    if ORDER_KEY not in frame or f"{ORDER_KEY}_lo" not in frame:
        return {}
    out, n = {}, 0
    keys = ["model", "bytes_per_token"] + (["backend"] if "backend" in frame else [])
    rows = frame[(frame["scheme"] != str(Scheme())) & frame[ORDER_KEY].notna() & frame[f"{ORDER_KEY}_lo"].notna()]
    for _, g in rows.groupby(keys, sort=False, dropna=False):
        g = g.sort_values(f"{ORDER_KEY}_lo")
        chain, hi = [], None
        for i, r in g.iterrows():
            if chain and r[f"{ORDER_KEY}_lo"] > hi:
                if len(chain) > 1:
                    n += 1
                    out.update({j: n for j in chain})
                chain, hi = [], None
            chain.append(i)
            hi = r[f"{ORDER_KEY}_hi"] if hi is None else max(hi, r[f"{ORDER_KEY}_hi"])
        if len(chain) > 1:
            n += 1
            out.update({j: n for j in chain})
    return out


def row_marks(frame: pd.DataFrame) -> list[str]:
    """The marks of each row of ``frame`` (in order): ``" †"``, ``" ≈n"``, both or ``""``."""
    groups = order_groups(frame)
    out = []
    for i, r in frame.iterrows():
        mark = " †" if engine_fit.is_hypothetical(r.get(RUNS_ON)) else ""
        out.append(mark + (f" ≈{groups[i]}" if i in groups else ""))
    return out


def mark_labels(frame: pd.DataFrame, labels: list[str]) -> list[str]:
    """``labels`` (one per row of ``frame``, in order) with ``†`` and ``≈n`` appended where they apply."""
    return [label + mark for label, mark in zip(labels, row_marks(frame))]


def split_label(label: str) -> tuple[str, str]:
    """(the scheme's label, its marks) of a marked label: ``("fp8_e4m3/tensor/dynamic", " † ≈1")``."""
    m = re.search(r"( †)?( ≈\d+)?$", label)
    return label[: m.start()], label[m.start() :]


def label_marks(frame: pd.DataFrame) -> dict[tuple[str, str], str]:
    """(model, scheme) -> the marks its table row carries, for the figures: a figure draws a scheme once per
    model, so where an engine's rows sit beside the emulation's the emulation row's marks are taken."""
    out: dict[tuple[str, str], str] = {}
    rows = frame.assign(_mark=row_marks(frame))
    if "backend" in rows:
        rows = rows.sort_values("backend", key=lambda b: b != "emulation", kind="stable")
    for model, scheme, mark in zip(rows["model"], rows["scheme"], rows["_mark"]):
        out.setdefault((model, str(parse_scheme(scheme))), mark)
    return out


def styled(style: SchemeStyle, frame: pd.DataFrame) -> SchemeStyle:
    """``style`` with the marks of ``frame``'s table rows and their notes: every figure labels a scheme
    exactly as the table's row does, and explains the marks it shows."""
    symbols = {"†": hypothetical_note(), "≈": order_note(frame)}
    return style.with_marks(label_marks(frame), {k: v for k, v in symbols.items() if v})


def hypothetical_note() -> str:
    return "† " + engine_fit.HYPOTHETICAL_NOTE.format(names=", ".join(PROFILES))


def order_note(frame: pd.DataFrame) -> str:
    """The ``≈n`` note, or "" when no row of ``frame`` carries one."""
    if not order_groups(frame):
        return ""
    spread = "float_noise_seeds" in frame and (frame["float_noise_seeds"].fillna(0) > 0).all()
    why = (
        "the data do not resolve their order"
        if spread
        else "their order is not resolved; these intervals are sampling-only (float spread not measured), so "
        "rows outside a group may not be resolved either"
    )
    return f"≈n: rows of the same bytes/token whose Δppl intervals overlap (group n): {why}"


def notes(frame: pd.DataFrame) -> list[str]:
    out = []
    if RUNS_ON in frame:
        out.append(
            "runs on: the engine profiles whose kernels run the row's scheme as measured; ~name: the engine takes the "
            "same settings with its own rounding, storage or scale handling (the row is not its number; "
            "--engine-profile NAME measures it)"
        )
        gpus = engine_fit.runs_on_gpu_note(frame[RUNS_ON])  # vllm-cuda (H100/H200): the GPUs whose path runs it
        if gpus:
            out.append(gpus)
        if frame[RUNS_ON].map(engine_fit.is_hypothetical).any():
            out.append(hypothetical_note())
    order = order_note(frame)
    return out + ([order] if order else [])
