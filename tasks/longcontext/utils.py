"""Loaders and scoring of evalkit's offline long-context stand-ins (``tasks/longcontext``).

The items are shipped JSONL files written once by ``make_fixture.py`` (RULER items by lm-eval's own
generators, LongBench v2-shaped items from the frozen Python documentation). Scoring is lm-eval's own:
RULER's ``postprocess_pred`` and ``string_match_all`` (``lm_eval.tasks.ruler.common_utils``), under a
metric named by the item's context length as the real RULER tasks name it; LongBench v2 stand-ins are
multiple choice, scored by lm-eval's ``acc``.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
from lm_eval.tasks.ruler.common_utils import aggregate_metrics, postprocess_pred, string_match_all

HERE = Path(__file__).resolve().parent

__all__ = ["aggregate_metrics", "load_longbench2", "load_ruler_niah_single_1", "load_ruler_vt", "process_results"]


def read_items(name: str) -> list[dict]:
    with open(HERE / name) as f:
        return [json.loads(line) for line in f if line.strip()]


def fixture_lengths(name: str) -> list[int]:
    """The context lengths a RULER stand-in holds items for."""
    return sorted({int(item["max_length"]) for item in read_items(name)})


def _ruler(name: str, kwargs: dict) -> dict[str, datasets.Dataset]:
    """The stand-in's items at the requested ``max_seq_lengths`` (lm-eval's RULER metadata), all without it."""
    items = read_items(name)
    wanted = kwargs.get("max_seq_lengths")
    if wanted:
        missing = sorted(set(int(n) for n in wanted) - set(fixture_lengths(name)))
        if missing:
            raise ValueError(
                f"the offline stand-in {name} holds items at {fixture_lengths(name)} tokens only, not {missing}"
            )
        items = [item for item in items if int(item["max_length"]) in {int(n) for n in wanted}]
    return {"test": datasets.Dataset.from_list(items, split=datasets.Split.TEST)}


def load_ruler_niah_single_1(**kwargs) -> dict[str, datasets.Dataset]:
    return _ruler("ruler_niah_single_1.jsonl", kwargs)


def load_ruler_vt(**kwargs) -> dict[str, datasets.Dataset]:
    return _ruler("ruler_vt.jsonl", kwargs)


def load_longbench2(**kwargs) -> dict[str, datasets.Dataset]:
    return {"test": datasets.Dataset.from_list(read_items("longbench2.jsonl"), split=datasets.Split.TEST)}


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """RULER's score (share of the expected values found in the answer) under the item's length."""
    return {str(doc["max_length"]): string_match_all(postprocess_pred(results), [doc["outputs"]])}
