"""Loaders of RULER's QA tasks over evalkit's disk cache (:mod:`evalkit.evals.longcontext.ruler_data`).

``ruler_qa_squad.yaml`` and ``ruler_qa_hotpot.yaml`` here take lm-eval's task names, so they replace
lm-eval's (which download their sources on every run); the items and the scoring are lm-eval's own.
"""

from __future__ import annotations

from lm_eval.tasks.ruler.common_utils import aggregate_metrics, process_results_part

from evalkit.evals.longcontext.ruler_data import qa_dataset

__all__ = ["aggregate_metrics", "get_hotpotqa", "get_squad", "process_results_part"]


def get_squad(**kwargs):
    return qa_dataset("squad", **kwargs)


def get_hotpotqa(**kwargs):
    return qa_dataset("hotpotqa", **kwargs)
