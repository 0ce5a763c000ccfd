"""Per-item records of a long-context lm-eval run, and which documents a run evaluates.

A record is one logged lm-eval sample (``log_samples=True``): its task, document id and hash, its
context length and its score. The **length** of an item is the context length its task built it at:
RULER's ``max_length`` (tokens: 4096 ... 131072), else the document's ``length`` field when it is a
word (LongBench v2's ``short`` / ``medium`` / ``long``), else ``all``. The **score** is the task's own
per-item metric: RULER names its metric by the item's length (``sample["4096"]``); other tasks' first
metric (LongBench v2's ``acc``). ``prediction`` keeps the answer (generated text, or the argmax choice
of a multiple-choice item) so a changed answer shows even when its score does not.

:func:`select_documents` picks the first ``limit`` documents of each length of each task (lm-eval's
``limit`` would take the first documents of the task, all of one length for RULER, whose documents
come length by length).
"""

from __future__ import annotations

from typing import Any

from evalkit.errors import EvalkitError


def length_of(doc: dict) -> str:
    """The context length an item was built at, as a label: ``"4096"``, ``"short"``, or ``"all"``."""
    if isinstance(doc.get("max_length"), int):
        return str(doc["max_length"])
    if isinstance(doc.get("length"), str) and doc["length"]:
        return doc["length"]
    return "all"


def length_order(label: str) -> tuple:
    """Sort key of length labels: token counts in order, then LongBench v2's words, then the rest."""
    words = ("short", "medium", "long")
    if label.isdigit():
        return (0, int(label), "")
    return (1, words.index(label), "") if label in words else (2, 0, label)


def score_of(sample: dict) -> float:
    """The sample's own per-item score (see the module docstring)."""
    doc = sample.get("doc") or {}
    key = str(doc["max_length"]) if isinstance(doc.get("max_length"), int) else None
    if key is not None and key in sample:
        return float(sample[key])
    for name in sample.get("metrics", []):
        value = sample.get(name)
        if isinstance(value, (bool, int, float)):
            return float(value)
    raise EvalkitError(f"lm-eval sample {sample.get('doc_id')} has no numeric metric to pair: use a scored task")


def record(task: str, sample: dict, output_type: str) -> dict[str, Any]:
    resps = sample.get("filtered_resps")
    if output_type == "multiple_choice":
        lls = [float(r[0]) for r in resps]
        prediction: Any = max(range(len(lls)), key=lambda i: lls[i])  # first maximum, as lm-eval's acc
    else:
        prediction = str(resps[0] if isinstance(resps, list) and resps else resps)
    return {
        "task": task,
        "doc_id": int(sample["doc_id"]),
        "filter": sample.get("filter", "none"),
        "doc_hash": sample.get("doc_hash"),
        "length": length_of(sample.get("doc") or {}),
        "score": score_of(sample),
        "prediction": prediction,
    }


def records_from_results(results: dict) -> list[dict]:
    """Every leaf task's records, in lm-eval's order."""
    out = []
    for task, samples in results.get("samples", {}).items():
        output_type = results["configs"][task]["output_type"]
        out += [record(task, s, output_type) for s in samples]
    return out


def pair(base: list[dict], other: list[dict]) -> list[tuple[dict, dict]]:
    """(baseline record, scheme record) of each item; EvalkitError when the items are not the same."""
    index = {(r["task"], r["doc_id"], r["filter"]): r for r in base}
    if len(index) != len(other) or any((r["task"], r["doc_id"], r["filter"]) not in index for r in other):
        raise EvalkitError(
            "longcontext items differ from the baseline's (another limit, length or task version?): "
            "rerun prepare for these parameters"
        )
    pairs = []
    for r in other:
        b = index[(r["task"], r["doc_id"], r["filter"])]
        if b["doc_hash"] != r["doc_hash"]:
            raise EvalkitError(f"{r['task']} item {r['doc_id']} is another document than the baseline's: data changed")
        pairs.append((b, r))
    return pairs


def select_documents(tasks: dict, limit: int | None, limits: dict | None = None) -> dict[str, list[int]] | None:
    """lm-eval's ``samples`` argument: per task, the first ``limit`` document indices of each length, or
    the task's own limit in ``limits`` (None: all its documents); None when every task runs every document."""
    limits = limits or {}
    if limit is None and all(v is None for v in limits.values()):
        return None
    chosen = {}
    for name, task in tasks.items():
        cap = limits.get(name, limit)
        seen: dict[str, int] = {}
        picked = []
        for i, doc in enumerate(task.eval_docs):
            label = length_of(doc)
            if cap is None or seen.get(label, 0) < cap:
                seen[label] = seen.get(label, 0) + 1
                picked.append(i)
        chosen[name] = picked
    return chosen
