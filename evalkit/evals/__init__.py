"""Evaluations: perplexity/KL/agreement, long-context retrieval, lm-eval tasks."""

from evalkit.evals.base import Evaluation, MetricRow, eval_names, get_eval

__all__ = ["Evaluation", "MetricRow", "eval_names", "get_eval"]
