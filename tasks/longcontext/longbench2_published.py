"""Loaders and scoring of LongBench v2 in its authors' protocol (``*longbench2_published*.yaml``).

The protocol itself (prompts, middle truncation, answer extraction) is
:mod:`evalkit.evals.longcontext.longbench2`; these are the functions the YAMLs name. The truncation needs
the model's tokenizer and ``max_len``: both come in lm-eval's metadata (``pretrained``, as for RULER, and
``longbench2_max_len``, default 120,000 as published), with the YAML's ``longbench2_protocol``.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets

from evalkit.evals.longcontext import longbench2 as lb

HERE = Path(__file__).resolve().parent
DATASET = "THUDM/LongBench-v2"  # the authors' dataset, split train (pred.py line 127)

__all__ = ["load_published", "load_standin", "process_results", "process_results_cot"]


def _docs(items: list[dict], kwargs: dict) -> dict[str, datasets.Dataset]:
    docs = lb.published_docs(
        items,
        kwargs.get("longbench2_protocol"),
        kwargs.get("pretrained"),
        int(kwargs.get("longbench2_max_len") or lb.PUBLISHED_MAX_LEN),
    )
    return {"test": datasets.Dataset.from_list(docs, split=datasets.Split.TEST)}


def load_standin(**kwargs) -> dict[str, datasets.Dataset]:
    """The offline stand-in's items (``longbench2.jsonl``, shared with the log-likelihood stand-in)."""
    with open(HERE / "longbench2.jsonl") as f:
        items = [json.loads(line) for line in f if line.strip()]
    return _docs(items, kwargs)


def load_published(**kwargs) -> dict[str, datasets.Dataset]:
    """LongBench v2's 503 items from the hub (``THUDM/LongBench-v2``, fields ``choice_A`` ... ``choice_D``)."""
    items = [dict(row) for row in datasets.load_dataset(DATASET, split="train")]
    return _docs(items, kwargs)


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """The direct answer, judged by its extracted letter."""
    return {"acc": lb.judge(doc, results[0])}


def process_results_cot(doc: dict, results: list[str]) -> dict[str, float]:
    """The chain of thought alone is not scored: evalkit's second request fills ``acc`` (NaN until then)."""
    return {"acc": float("nan")}
