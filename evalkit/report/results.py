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
of one table would mix versions of the code: :func:`evalkit.report.provenance.provenance_notes` says so, with the fix, and
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
from evalkit.report import kl_bound, resolved
from evalkit.report.domains import clip_to_domains

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
    folders: tuple[Path, ...] = ()  # every store read (``report DIR1 DIR2``); ``folder`` is the first
    sources: dict[str, Path] = field(default_factory=dict)  # run_id -> the store its counted records come from
    cut_off: list = field(default_factory=list)  # (store, evalkit.sweep.store_records.CutOffRun): runs a crash cut off
    merge_notes: list[str] = field(default_factory=list)  # how runs found in several stores were counted

    @property
    def codes(self) -> dict[str, str]:
        """run_id -> the code identity that computed it (``unrecorded`` for runs of older evalkit)."""
        return {run_id: code_of(rec) for run_id, rec in self.complete.items()}

    @property
    def components(self) -> dict[str, str]:
        """run_id -> the bumped numerics versions of the components it went through, as its code record names
        them (``eval:retrieval 1``; empty for a run through none: :func:`evalkit.sweep.code_identity.components`)."""
        out = {}
        for run_id, rec in self.complete.items():
            parts = ((rec.get("info") or {}).get("code") or {}).get("components") or {}
            out[run_id] = ", ".join(f"{k} {v}" for k, v in sorted(parts.items()))
        return out

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


def _read_store(folder: Path):
    """The store's records (evalkit.sweep.store_records.StoreView); one clear error for a missing, empty or foreign one."""
    from evalkit.sweep.store_records import read_records

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
        if view.torn_lines and not view.complete and not any(c.run_id or c.attempt or c.rows for c in view.cut_off):
            raise EvalkitError(
                f"{path} holds no evalkit records ({view.torn_lines} unreadable lines): is it a results file of `evalkit sweep`?"
            )
        lost = f" ({len(view.cut_off)} cut off by a crash)" if view.cut_off else ""
        raise EvalkitError(
            f"{folder} has no completed runs yet{lost}: run `python -m evalkit sweep GRID --out {folder}` first"
        )
    return view


def load_store(folder: str | Path) -> Results:
    """Load the counted rows of a results folder; one clear error for a missing, empty or foreign one."""
    return load_stores([folder])


def _values(rows: list[dict]) -> list:
    return sorted((r["metric"], json.dumps(r.get("labels") or {}, sort_keys=True), r["value"]) for r in rows)


def load_stores(folders) -> Results:
    """The counted rows of one or more results stores as one :class:`Results` (``report DIR1 DIR2``).

    A run is one run id: the same spec computed by the same code and libraries. Found in several
    stores (a ``run --out`` repeated into two folders, a copied store) it counts once: the store
    that finished it last. Where their numbers differ (other platforms: the run id does not cover
    the machine) a CONFLICT note names the run and the stores. Runs of one spec under other run ids
    (other code) are superseded as within one store (:func:`supersede`). Stores whose runs of one
    evaluation used different parameters are refused: one table compares one protocol."""
    folders = [Path(f) for f in folders]
    complete: dict[str, dict] = {}
    rows_of: dict[str, list[dict]] = {}
    sources: dict[str, Path] = {}
    failed: dict[str, dict] = {}
    cut_off: list = []
    notes: list[str] = []
    duplicates, conflicts = 0, []
    for folder in dict.fromkeys(folders):
        view = _read_store(folder)
        cut_off += [(folder, c) for c in view.cut_off]
        failed.update({k: v for k, v in view.failed.items() if k not in complete})
        mine: dict[str, list[dict]] = {}
        for r in view.rows:
            mine.setdefault(r["run_id"], []).append(r)
        for run_id, rec in view.complete.items():
            if run_id in complete:
                if _values(rows_of[run_id]) == _values(mine.get(run_id, [])):
                    duplicates += 1
                    continue
                conflicts.append((run_id, rec, sources[run_id], folder))
                if str(rec.get("finished") or "") < str(complete[run_id].get("finished") or ""):
                    continue
            complete[run_id], rows_of[run_id], sources[run_id] = rec, mine.get(run_id, []), folder
            failed.pop(run_id, None)
    if duplicates:
        notes.append(
            f"{duplicates} runs are in more than one of these stores (the same run id and numbers): counted once"
        )
    for run_id, rec, a, b in conflicts:
        notes.append(
            f"CONFLICT: run {run_id[:16]} ({rec.get('model')} {rec.get('scheme')} {rec.get('eval')}) is in {a} and {b} "
            "with different numbers (the run id does not cover the machine: other platforms?); the one finished "
            f"last ({sources[run_id]}) is shown"
        )
    if len(folders) > 1:
        _check_one_protocol(complete, sources)
    complete, superseded = supersede(complete)
    rows = [r for run_id in complete for r in rows_of[run_id]]
    for folder in dict.fromkeys(folders):  # runs sweep --resolve grew: the latest stage, at its level
        rows, grown, earlier = resolved.apply(rows, complete, folder)
        notes += grown
        complete = {k: v for k, v in complete.items() if k not in earlier}
    rows = kl_bound.apply(rows)  # KL rows' high end skew-calibrated (the stores keep Student's t)
    results = Results(
        folders[0],
        _rows_frame(rows),
        complete,
        failed,
        superseded=superseded,
        folders=tuple(dict.fromkeys(folders)),
        sources={k: sources[k] for k in complete},
        cut_off=cut_off,
        merge_notes=notes,
    )
    results.layouts = _layouts(results)
    return results


def _check_one_protocol(complete: dict[str, dict], sources: dict[str, Path]) -> None:
    """Refuse stores whose runs of one evaluation (model, eval, engine) used different parameters."""
    seen: dict[tuple, tuple[str, Path]] = {}
    for run_id, rec in complete.items():
        spec = rec.get("spec") or {}
        if not isinstance(spec.get("params"), dict):
            continue
        params = {k: v for k, v in spec["params"].items() if k != "seed"}  # seeds are runs of one protocol
        key = (rec.get("model"), rec.get("eval"), spec.get("engine", "emulation"))
        text = json.dumps(params, sort_keys=True)
        if key not in seen:
            seen[key] = (text, sources[run_id])
            continue
        other, where = seen[key]
        a, b = json.loads(other), params
        shared = sorted(set(a) & set(b))  # a parameter only one side has was added later, with its old behaviour
        diff = ", ".join(f"{k} {a[k]!r} vs {b[k]!r}" for k in shared if a[k] != b[k])
        if diff and where != sources[run_id]:
            raise EvalkitError(
                f"{where} and {sources[run_id]} ran {key[1]} on {key[0]} with different parameters ({diff}): "
                "one table compares one protocol; report them separately"
            )


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
    results.rows = pd.concat([results.rows, _rows_frame(kl_bound.apply(recs))], ignore_index=True)
    return results


SERVING_FILE = "serving.jsonl"  # `evalkit capacity --engine vllm --out DIR`


def add_serving_rows(results: Results | None, folder: str | Path) -> Results:
    """Add the rows of a capacity folder (``capacity --engine vllm --out DIR``: ``serving.jsonl``,
    metric records of eval ``serving`` without completion records) to ``results`` (None: a report of
    the capacity folder alone). Each row is labelled with the engine that measured it, as the
    serving evaluation of a sweep labels its rows, so the report shows them on the engine's line."""
    folder = Path(folder)
    path = folder / SERVING_FILE
    recs = []
    with open(path) as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                raise EvalkitError(
                    f"{path} line {n} is not JSON (torn by a crash?): re-run `python -m evalkit capacity --engine vllm "
                    f"--out {folder}`"
                ) from None
            if not isinstance(rec, dict) or not {"model", "scheme", "metric", "value"} <= set(rec):
                raise EvalkitError(
                    f"{path} line {n} is not an evalkit serving row (needs model, scheme, metric, value)"
                )
            info = rec.get("info") if isinstance(rec.get("info"), dict) else {}
            if "backend" not in info and info.get("engine_package"):
                info = {**info, "backend": f"{info['engine_package']} {info.get('engine_version') or ''}".strip()}
            recs.append(rec | {"run_id": f"{path}:{n}", "eval": "serving", "info": info})
    if not recs:
        raise EvalkitError(f"{path} holds no rows: re-run `python -m evalkit capacity --engine vllm --out {folder}`")
    frame = _rows_frame(recs)
    if results is None:
        return Results(folder, frame, {}, folders=(folder,))
    results.rows = pd.concat([results.rows, frame], ignore_index=True)
    results.folders = (*results.folders, folder)
    return results


def _rows_frame(records: list[dict]) -> pd.DataFrame:
    """Metric records as a frame of ROW_FIELDS: labels and info always dicts, numbers numeric."""
    frame = pd.DataFrame([{k: r.get(k) for k in ROW_FIELDS} for r in records], columns=list(ROW_FIELDS))
    frame["labels"] = frame["labels"].map(lambda d: d if isinstance(d, dict) else {})
    frame["info"] = frame["info"].map(lambda d: d if isinstance(d, dict) else {})
    for col in ("value", "ci_low", "ci_high"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    return clip_to_domains(frame)  # no interval past what its metric can be (a KL below 0, a share above 1)


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
