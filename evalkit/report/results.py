"""Read a results store for reporting: the rows of completed runs, plus each model's KV layout.

The store (see :mod:`evalkit.sweep.store`) is a folder with an append-only ``results.jsonl``:
``metric`` records (run_id, model, scheme, eval, metric, value, ci_low, ci_high, labels, info)
and one ``complete`` (or ``failed``) record per run attempt. Only runs whose latest attempt has a
completion record count; everything else is ignored, as the store's own reader does.

Runs of one spec (model, scheme, eval, parameters) carry different run ids when other code or
other library versions computed them (a run id hashes evalkit's code identity and the library
versions; see :mod:`evalkit.sweep.code_identity`). A resumed sweep recomputes such runs and keeps
the old records, so of the completed runs of one spec only the one that finished last counts: the
older ones are *superseded* (kept in the file, left out of every table). If the counted runs still
come from more than one code identity (a sweep stopped half-way through recomputing), the numbers
of one table would mix versions of the code: :func:`provenance_notes` says so, with the fix, and
the report prints it under the table. Runs written before evalkit recorded a code identity count
as "unrecorded".

Bytes per token need the model's KV layout, which is not a quality metric. It is taken, in this
order, from ``info.kv_layout`` of the completion records or from the ``config.json`` of the run's
``info.model_path`` (a folder, or a hub id already in the local Hugging Face cache; the config
only: no weights are read, nothing is evaluated, no network). Models whose layout cannot be found
get no bytes column rather than a guess.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from evalkit.errors import EvalkitError
from evalkit.models.info import KVLayout, kv_layout

RESULTS_FILE = "results.jsonl"
ROW_FIELDS = ("run_id", "model", "scheme", "eval", "metric", "value", "ci_low", "ci_high", "labels", "info")


@dataclass
class Results:
    folder: Path
    rows: pd.DataFrame  # one row per metric record of a counted run, columns ROW_FIELDS
    complete: dict[str, dict]  # run_id -> completion record
    failed: dict[str, dict] = field(default_factory=dict)
    layouts: dict[str, KVLayout] = field(default_factory=dict)  # model name -> layout (where known)
    superseded: dict[str, dict] = field(default_factory=dict)  # run_id -> completion record of an older run of a spec

    @property
    def codes(self) -> dict[str, str]:
        """run_id -> the code identity that computed it (``unrecorded`` for runs of older evalkit)."""
        return {run_id: code_of(rec) for run_id, rec in self.complete.items()}

    @property
    def platforms(self) -> dict[str, str]:
        """run_id -> the platform that computed it (CPU, instruction set, MKL mode; ``device`` for GPU
        runs), for runs that recorded one (:mod:`evalkit.runtime.numerics`)."""
        out = {}
        for run_id, rec in self.complete.items():
            info = rec.get("info") or {}
            p = info.get("platform")
            if isinstance(p, dict):
                device = str(info.get("device") or "cpu")
                where = f"{p.get('cpu')} [{p.get('cpu_id')}], {p.get('cpu_capability')}, MKL_CBWR={p.get('mkl_cbwr')}"
                out[run_id] = where if device == "cpu" else f"{device} on {where}"
        return out

    @property
    def dtypes(self) -> dict[str, str]:
        """model -> the dtype its weights (and unquantized KV cache) were in, where the runs recorded it."""
        out: dict[str, str] = {}
        for rec in self.complete.values():
            dtype = (rec.get("info") or {}).get("dtype")
            if dtype and rec.get("model") not in out:
                out[rec["model"]] = str(dtype)
        return out

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(self.rows["model"]))

    def metric(self, name: str, eval_name: str | None = None, labeled: bool | None = False) -> pd.DataFrame:
        """Rows of one metric; ``labeled=False``: only the unlabeled aggregate, True: only labeled ones."""
        df = self.rows[self.rows["metric"] == name]
        if eval_name:
            df = df[df["eval"] == eval_name]
        if labeled is not None:
            has = df["labels"].map(bool)
            df = df[has] if labeled else df[~has]
        return df


def load_store(folder: str | Path) -> Results:
    """Load the counted rows of a results folder; one clear error for a missing, empty or foreign one."""
    from evalkit.sweep.store import read_records

    folder = Path(folder)
    if not folder.is_dir():
        raise EvalkitError(
            f"results folder {folder} does not exist: give a folder written by `python -m evalkit sweep`"
        )
    path = folder / RESULTS_FILE
    if not path.is_file():
        raise EvalkitError(
            f"{folder} is not an evalkit results store (no {RESULTS_FILE}): give a folder written by `python -m evalkit sweep`"
        )
    view = read_records(path)
    if not view.rows:
        if view.failed:
            raise EvalkitError(
                f"{folder} has no completed runs ({len(view.failed)} failed): see the failures with `python -m evalkit sweep` and rerun"
            )
        if view.torn_lines and not view.complete:
            raise EvalkitError(
                f"{path} holds no evalkit records ({view.torn_lines} unreadable lines): is it a results file of `evalkit sweep`?"
            )
        raise EvalkitError(f"{folder} has no completed runs yet: run `python -m evalkit sweep --out {folder}` first")
    complete, superseded = supersede(view.complete)
    rows = [r for r in view.rows if r["run_id"] in complete]
    results = Results(folder, _rows_frame(rows), complete, view.failed, superseded=superseded)
    results.layouts = _layouts(results)
    return results


UNRECORDED = "unrecorded"


def code_of(record: dict) -> str:
    """The code identity in a completion record (``unrecorded`` before evalkit recorded one)."""
    versions = (record.get("info") or {}).get("versions") or {}
    return str(versions.get("evalkit_code") or UNRECORDED)


def _spec_key(run_id: str, record: dict) -> str:
    from evalkit.sweep.grid import RunSpec, canonical_json

    try:
        return canonical_json(RunSpec.from_dict(record["spec"]).canonical())
    except (KeyError, TypeError, ValueError):
        return run_id  # a record without a usable spec is never superseded


def supersede(complete: dict[str, dict]) -> tuple[dict[str, dict], dict[str, dict]]:
    """(counted, superseded): of the completed runs of one spec, the one that finished last counts."""
    latest: dict[str, tuple[tuple, str]] = {}
    for i, (run_id, rec) in enumerate(complete.items()):
        key, when = _spec_key(run_id, rec), (str(rec.get("finished") or ""), i)
        if key not in latest or when >= latest[key][0]:
            latest[key] = (when, run_id)
    keep = {run_id for _, run_id in latest.values()}
    return ({k: v for k, v in complete.items() if k in keep}, {k: v for k, v in complete.items() if k not in keep})


def provenance_notes(results: Results) -> list[str]:
    """Notes for a reader about which code computed the counted runs (empty when one code did)."""
    notes = []
    counts: dict[str, int] = {}
    for code in results.codes.values():
        counts[code] = counts.get(code, 0) + 1
    if len(counts) > 1:
        parts = ", ".join(
            f"{code[:15] if code != UNRECORDED else code}: {n} runs"
            for code, n in sorted(counts.items(), key=lambda kv: -kv[1])
        )
        notes.append(
            f"MIXED CODE: these runs were computed by {len(counts)} versions of evalkit's code ({parts}), so "
            f"rows may not be comparable; resume the sweep (`python -m evalkit sweep GRID --out {results.folder}`) "
            "with the current code to recompute the others"
        )
    elif counts and UNRECORDED in counts:
        notes.append(
            "these runs carry no code identity (written by an evalkit that did not record one): resume the "
            f"sweep (`python -m evalkit sweep GRID --out {results.folder}`) to recompute them with a recorded one"
        )
    platforms: dict[str, int] = {}
    for where in results.platforms.values():
        platforms[where] = platforms.get(where, 0) + 1
    if len(platforms) > 1:
        parts = "; ".join(f"{where}: {n} runs" for where, n in sorted(platforms.items(), key=lambda kv: -kv[1]))
        notes.append(
            f"MIXED PLATFORM: these runs were computed on {len(platforms)} platforms ({parts}); a quantized "
            "forward amplifies the float rounding that differs between them, so differences between rows of "
            "different platforms are partly numerical noise"
        )
    if results.superseded:
        notes.append(
            f"{len(results.superseded)} older runs of the same specs (other code or libraries) are superseded "
            "by newer ones and not shown"
        )
    return notes


def add_rows_file(results: Results, path: str | Path) -> Results:
    """Add the rows of a ``rows.jsonl`` (``evalkit run --out`` / ``evalkit sensitivity --out``: no completion
    records, every row counts) to ``results``, e.g. per-layer sensitivity for the plots."""
    path = Path(path)
    if path.is_dir():
        path = path / "rows.jsonl"
    if not path.is_file():
        raise EvalkitError(
            f"{path} does not exist: give the rows.jsonl (or its folder) written by `evalkit sensitivity --out DIR`"
        )
    recs = []
    with open(path) as fh:
        for n, line in enumerate(fh, 1):
            try:
                rec = json.loads(line)
            except ValueError:
                raise EvalkitError(f"{path} line {n} is not JSON: give a rows.jsonl written by evalkit") from None
            if not isinstance(rec, dict) or not {"model", "scheme", "metric", "value"} <= set(rec):
                raise EvalkitError(f"{path} line {n} is not an evalkit result row (needs model, scheme, metric, value)")
            recs.append(rec | {"run_id": rec.get("run_id") or f"{path}:{n}", "eval": rec.get("eval") or "rows"})
    results.rows = pd.concat([results.rows, _rows_frame(recs)], ignore_index=True)
    return results


def _rows_frame(records: list[dict]) -> pd.DataFrame:
    """Metric records as a frame of ROW_FIELDS: labels and info always dicts, numbers numeric."""
    frame = pd.DataFrame([{k: r.get(k) for k in ROW_FIELDS} for r in records], columns=list(ROW_FIELDS))
    frame["labels"] = frame["labels"].map(lambda d: d if isinstance(d, dict) else {})
    frame["info"] = frame["info"].map(lambda d: d if isinstance(d, dict) else {})
    for col in ("value", "ci_low", "ci_high"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    return frame


def _layout_from_dict(d: dict) -> KVLayout:
    d = dict(d)
    for key in ("sliding_layers", "attention_layers"):
        if d.get(key) is not None:
            d[key] = tuple(d[key])
    return KVLayout(**{k: v for k, v in d.items() if k in KVLayout.__dataclass_fields__})


def _layouts(results: Results) -> dict[str, KVLayout]:
    from evalkit.models.presets import config_namespace

    out: dict[str, KVLayout] = {}
    for rec in results.complete.values():
        model, info = rec.get("model"), rec.get("info") or {}
        if model in out:
            continue
        if isinstance(info.get("kv_layout"), dict):
            out[model] = _layout_from_dict(info["kv_layout"])
            continue
        path = info.get("model_path")
        if not path:
            continue
        try:
            config = Path(str(path)) / "config.json"
            if config.is_file():
                out[model] = kv_layout(config_namespace(json.loads(config.read_text())))
            else:  # a hub id: its config from the local Hugging Face cache only, never the network
                from transformers import AutoConfig

                out[model] = kv_layout(AutoConfig.from_pretrained(str(path), local_files_only=True))
        except (OSError, ValueError, TypeError, KeyError, EvalkitError):
            pass  # no layout: the table shows n/a for bytes rather than a guess
    return out
