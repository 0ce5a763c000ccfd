"""Marks on the table's scheme labels, and their notes: what a row is not.

* ``†`` **hypothetical**: no engine profile runs the scheme (:mod:`evalkit.report.engine_fit`); the
  "runs on" column names those that do (``~name``: with the engine's own rounding or storage).
* ``‡`` **not measured by this protocol**: some of the row's columns have no number because the
  evaluation's protocol reads no quantized value for the scheme (``info["not_measured"]``: vLLM's
  TurboQuant and UltraQuant attend a one-forward prefill from the raw K/V); their cells read "not
  measured" (or stay empty where an evaluation's own display shows them), never a 0, and the note
  gives the reason.
* ``≈n`` **order not resolved**, from the PAIRED test of two rows' Δppl difference, Holm-adjusted over
  the group's pairs (:mod:`evalkit.report.order`): among rows of one model, backend and bytes/token, each number is a
  maximal set of rows no two of which the data order; a row carries every number it is in
  (``≈1,2``), two rows sharing a number are not ordered, two sharing none are. ``≈?``: the order
  against some rows of its bytes/token is not assessed (no per-window units in the store, other
  windows): nothing is said about it, and never from overlapping marginal intervals.

The figures carry the same marks (:func:`styled`): a point or legend entry names a scheme exactly as
its table row does, so a hypothetical scheme is never read off a figure as an engine's number.
"""

from __future__ import annotations

import re

import pandas as pd

from evalkit.engines.registry import PROFILES
from evalkit.kv.scheme import parse_scheme
from evalkit.report import engine_fit, order
from evalkit.report.style import SchemeStyle

RUNS_ON = "runs_on"
NOT_MEASURED = "_not_measured"  # summary columns <key>_not_measured: info["not_measured"] (evalkit.report.evals)


def add_runs_on(frame: pd.DataFrame, layouts: dict) -> pd.DataFrame:
    """``frame`` with a ``runs_on`` column (the engines that run each row's scheme) and the store's
    layouts in ``attrs`` (the recommendation checks head_dim requirements with them)."""
    frame[RUNS_ON] = [engine_fit.runs_on(s, layouts.get(m)) for m, s in zip(frame["model"], frame["scheme"])]
    frame.attrs["layouts"] = dict(layouts)
    return frame


def not_measured(row) -> dict[str, str]:
    """column -> why, of a summary row's columns its protocol does not measure (``<column>_not_measured``)."""
    return {
        str(k)[: -len(NOT_MEASURED)]: str(v)
        for k, v in dict(row).items()
        if str(k).endswith(NOT_MEASURED) and isinstance(v, str) and v
    }


def row_marks(frame: pd.DataFrame, assessed: order.Order | None = None) -> list[str]:
    """The marks of each row of ``frame`` (in order): ``" †"``, ``" ‡"``, ``" ≈1,2"``, ``" ≈?"``, some or ``""``."""
    assessed = order.assess(frame) if assessed is None else assessed
    out = []
    for i, r in frame.iterrows():
        mark = " †" if engine_fit.is_hypothetical(r.get(RUNS_ON)) else ""
        mark += " ‡" if not_measured(r) else ""
        out.append(mark + assessed.mark(i))
    return out


def mark_labels(frame: pd.DataFrame, labels: list[str]) -> list[str]:
    """``labels`` (one per row of ``frame``, in order) with ``†`` and ``≈n`` appended where they apply."""
    return [label + mark for label, mark in zip(labels, row_marks(frame))]


def split_label(label: str) -> tuple[str, str]:
    """(the scheme's label, its marks) of a marked label: ``("fp8_e4m3/tensor/dynamic", " † ≈1")``."""
    m = re.search(r"( †)?( ‡)?( ≈[\d?]+(?:,[\d?]+)*)?$", label)
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
    symbols = {"†": hypothetical_note(), "‡": not_measured_note(frame), "≈": order_note(frame)}
    return style.with_marks(label_marks(frame), {k: v for k, v in symbols.items() if v})


def hypothetical_note() -> str:
    return "† " + engine_fit.HYPOTHETICAL_NOTE.format(names=", ".join(PROFILES))


def not_measured_note(frame: pd.DataFrame) -> str:
    """The ``‡`` note, or "" when no row of ``frame`` carries one. Each reason is said once: where schemes
    share one (their names aside), it names the scheme as ``the scheme`` and lists them after it."""
    schemes_of: dict[str, list[str]] = {}
    for _, r in frame.iterrows():
        scheme = str(r.get("scheme", ""))
        for why in not_measured(r).values():
            shared = why.replace(scheme, "the scheme") if scheme else why
            schemes_of.setdefault(shared, [])
            if scheme not in schemes_of[shared]:
                schemes_of[shared].append(scheme)
    if not schemes_of:
        return ""
    reasons = [
        why if "the scheme" not in why else f"{why} ({', '.join(schemes)})" for why, schemes in schemes_of.items()
    ]
    return "‡ no number, not a 0 (cells 'not measured'): " + "; ".join(reasons)


def order_note(frame: pd.DataFrame, assessed: order.Order | None = None) -> str:
    """The ``≈`` note: how the order of rows of one bytes/token was assessed (paired intervals), or ""
    when ``frame`` has no two such rows."""
    assessed = order.assess(frame) if assessed is None else assessed
    lines = []
    if assessed.pairs:
        n = assessed.realisations()
        spread = (
            "where the rows have one float realisation (float_noise_seeds 0) it is sampling-only, so another float "
            "realisation (processor, BLAS, engine) can reorder rows it orders"
            if 1 in n
            else "its variance is one over the windows x the rows' "
            f"{', '.join(str(k) for k in sorted(n))} float realisations (the float spread counted once)"
        )
        lines.append(
            "≈n: among rows of one model, backend and bytes/token, rows sharing a number are not ordered by the data: "
            "Holm's step-down test over all the group's pairs (family-wise error 5 %) does not reject a zero "
            "difference of their paired Δppl (the same windows and float realisations). Each number is a largest set "
            "of rows no two of which are ordered, so a row can carry several (≈1,2) and rows sharing none are ordered, "
            f"lower Δppl first; an order's interval is given at the level Holm tested it at, and {spread}"
        )
    if assessed.unassessed:
        why = "; ".join(dict.fromkeys(w for ws in assessed.unassessed.values() for w in ws))
        lines.append(
            f"≈?: the order against some rows of the same bytes/token is not assessed ({why}); overlapping "
            "marginal intervals are no substitute: re-make the store to assess it"
        )
    return "\n".join(lines)  # two notes in one string: notes() splits them


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
    if any(not_measured(r) for _, r in frame.iterrows()):
        out.append(not_measured_note(frame))
    text = order_note(frame)
    return out + (text.split("\n") if text else [])
