"""Per-item answers of generate-until tasks, from lm-eval's logged samples, one record per item and filter
with every sample's generation.

One lm-eval run gives, per task, a logged sample per document and filter (``log_samples=True``); the
evaluation runs lm-eval once per sample seed and merges the runs here (:func:`merge_samples`). Per
item (``doc_id``, ``filter``) the record keeps the document's hash and target and, per sample:

* ``seed``: the seed the sample was drawn with;
* ``text``: the generated text, as lm-eval returns it (stop sequences removed);
* ``answer``: the answer lm-eval's filter extracted from it (the filtered response);
* ``correct``: the task's first 0/1 metric (``exact_match``...), or None when it has none (a graded
  score such as MRCR's ``mrcr_score``, :data:`GRADED_METRICS`, is never read as one, even where it is 0 or 1);
* ``scores``: the task's graded metrics (:data:`GRADED_METRICS`) by name, where it has any;
* ``tokens``: the length of ``text`` in tokens of the model's tokenizer (re-encoded: lm-eval returns
  text, so every backend is counted alike; equal to the generated ids but where the model produced
  a tokenization its tokenizer would not, and without the end-of-sequence token);
* ``truncated``: whether ``tokens`` reached the output budget (``max_gen_toks``), i.e. the answer
  was cut off rather than finished.

and, once per item, the ``prompt`` lm-eval sent (chat template, system prompt and few-shot turns
applied) and the ``request``'s generation settings (those of the first sample).

Records are plain JSON (the run's ``generation_items.json``, the cached baseline), never pickled.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evalkit.errors import EvalkitError

GRADED_METRICS = frozenset({"mrcr_score"})  # per-sample scores in [0, 1] that are not right/wrong


def first_binary_metric(sample: dict) -> float | None:
    """The sample's first metric whose value is 0 or 1 (lm-eval's ``metrics`` order), else None; graded
    scores (:data:`GRADED_METRICS`) are not 0/1 outcomes, whatever their value."""
    for name in sample.get("metrics", []):
        if name in GRADED_METRICS:
            continue
        value = sample.get(name)
        if isinstance(value, (bool, int, float, np.number)) and float(value) in (0.0, 1.0):
            return float(value)
    return None


def graded_scores(sample: dict) -> dict[str, float]:
    """The sample's graded metrics (:data:`GRADED_METRICS`) by name."""
    return {n: float(sample[n]) for n in sample.get("metrics", []) if n in GRADED_METRICS and n in sample}


def _first(value):
    while isinstance(value, (list, tuple)):
        if not value:
            return ""
        value = value[0]
    return value


def _jsonable(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def output_types(results: dict) -> dict[str, str]:
    """task -> lm-eval output type, for every leaf task of a results dict."""
    return {task: (cfg or {}).get("output_type") for task, cfg in results.get("configs", {}).items()}


def check_generate_until(results: dict) -> None:
    """EvalkitError naming any task that is not a generate_until task (its items have no generation)."""
    other = {t: kind for t, kind in output_types(results).items() if kind != "generate_until"}
    if other:
        names = ", ".join(f"{t} ({k})" for t, k in sorted(other.items()))
        raise EvalkitError(f"generation runs generate_until tasks only, not {names}: run those with --eval lmeval")


def budget_of(results: dict, task: str, default: int) -> int:
    """The output budget a task generated with: its ``max_gen_toks`` after the evaluation's settings, or
    the lm-eval model's default where the task sets none."""
    kwargs = (results.get("configs", {}).get(task) or {}).get("generation_kwargs") or {}
    value = kwargs.get("max_gen_toks")
    return int(value) if value is not None else int(default)


def sample_records(results: dict, tokenizer, seed: int, default_budget: int) -> dict[str, list[dict]]:
    """{task: [item with one sample]} from one lm-eval run at ``seed``."""
    out: dict[str, list[dict]] = {}
    cache: dict[str, int] = {}

    def count(text: str) -> int:
        if text not in cache:
            cache[text] = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        return cache[text]

    for task, samples in results.get("samples", {}).items():
        budget = budget_of(results, task, default_budget)
        records = []
        for s in samples:
            text = str(_first(s.get("resps", "")))
            tokens = count(text)
            args = (s.get("arguments") or [[None, None]])[0]
            records.append(
                {
                    "doc_id": int(s["doc_id"]),
                    "filter": s.get("filter", "none"),
                    "doc_hash": s.get("doc_hash"),
                    "target": _jsonable(s.get("target")),
                    "prompt": args[0] if isinstance(args[0], str) else _jsonable(args[0]),
                    "request": _jsonable(args[1]) if len(args) > 1 and isinstance(args[1], dict) else None,
                    "budget": budget,
                    "samples": [
                        {
                            "seed": seed,
                            "text": text,
                            "answer": _jsonable(_first(s.get("filtered_resps", ""))),
                            "correct": first_binary_metric(s),
                            **({"scores": graded_scores(s)} if graded_scores(s) else {}),
                            "tokens": tokens,
                            "truncated": tokens >= budget,
                        }
                    ],
                }
            )
        out[task] = sorted(records, key=lambda r: (r["doc_id"], r["filter"]))
    return out


def merge_samples(runs: list[dict[str, list[dict]]]) -> dict[str, list[dict]]:
    """One record per item with the samples of every run, in run order (runs must hold the same items)."""
    if not runs:
        return {}
    merged = {task: [dict(r, samples=list(r["samples"])) for r in records] for task, records in runs[0].items()}
    for run in runs[1:]:
        if set(run) != set(merged):
            raise EvalkitError("lm-eval returned other tasks for another sample seed: the task list changed mid-run")
        for task, records in run.items():
            mine = merged[task]
            keys = [(r["doc_id"], r["filter"], r["doc_hash"]) for r in records]
            if keys != [(r["doc_id"], r["filter"], r["doc_hash"]) for r in mine]:
                raise EvalkitError(
                    f"lm-eval returned other items of {task} for another sample seed: the task data changed"
                )
            for into, r in zip(mine, records):
                into["samples"] += r["samples"]
    return merged


def filters(records: list[dict]) -> list[str]:
    """The filters of a task's records, in first-seen order."""
    return list(dict.fromkeys(r["filter"] for r in records))


def paired(base: list[dict], other: list[dict], task: str) -> list[tuple[dict, dict]]:
    """(baseline record, scheme record) per item, matched by doc id and filter; EvalkitError when the
    items, their documents or their samples differ (another limit, task version or sample count)."""
    index = {(b["doc_id"], b["filter"]): b for b in base}
    if len(index) != len(other) or any((o["doc_id"], o["filter"]) not in index for o in other):
        raise EvalkitError(
            f"the items of {task} differ from the baseline's (another limit, few-shot or task version?): "
            "rerun with the baseline's parameters"
        )
    pairs = []
    for o in other:
        b = index[(o["doc_id"], o["filter"])]
        if b["doc_hash"] != o["doc_hash"] or [s["seed"] for s in b["samples"]] != [s["seed"] for s in o["samples"]]:
            raise EvalkitError(f"item {o['doc_id']} of {task} is another document or sample set than the baseline's")
        pairs.append((b, o))
    return pairs


def record_summary(records: dict[str, list[dict]]) -> dict[str, Any]:
    """Counts for a run's info: items and samples per task."""
    return {t: {"items": len({r["doc_id"] for r in rs}), "filters": filters(rs)} for t, rs in records.items()}
