"""Baseline accuracies of the models operators serve, from their model cards: what decision sizing assumes.

The items a decision needs (:mod:`evalkit.planning.decision`) depend on the baseline accuracy ``p``: a
model that solves half of AIME discords far more under a KV change than one that solves 5 %. The dry run
takes, per model and task, the first of: the grid's own pilot (an ``auto`` run of the task already in the
results store, :func:`pilot_baselines`), this table of model-card figures (:data:`CARDS`, each with its
source), else the default of :mod:`evalkit.evals.accuracy_tasks` (Llama-3.1-8B-Instruct's card, or an
assumption it states). The decision table says which it used.

The figures are the cards' own settings (shots, CoT, Avg@k, output budget), not evalkit's lm-eval task
configurations: a prior for sizing, never a result.
"""

from __future__ import annotations

import math

LLAMA_31 = "https://huggingface.co/meta-llama/Llama-3.1-{}-Instruct (model card, instruction tuned models)"
KIMI_K2 = "https://github.com/MoonshotAI/Kimi-K2 (README, Kimi-K2-Instruct evaluation, 8k output tokens)"

# normalised model name (the hub id's last part, lower case) -> (source, {evalkit / lm-eval task: (accuracy, what)})
CARDS: dict[str, tuple[str, dict[str, tuple[float, str]]]] = {
    "llama-3.1-8b-instruct": (
        LLAMA_31.format("8B"),
        {
            "gsm8k_cot_llama": (0.845, "GSM-8K (8-shot, CoT) 84.5"),
            "gsm8k": (0.845, "GSM-8K (8-shot, CoT) 84.5"),
            "minerva_math500": (0.519, "MATH (0-shot, CoT) 51.9; MATH-500 is its 500-problem subset"),
            "gpqa_diamond_cot_zeroshot": (0.304, "GPQA (0-shot) 30.4; the diamond set assumed alike"),
            "mmlu": (0.694, "MMLU (5-shot) 69.4"),
        },
    ),
    "llama-3.1-70b-instruct": (
        LLAMA_31.format("70B"),
        {
            "gsm8k_cot_llama": (0.951, "GSM-8K (8-shot, CoT) 95.1"),
            "gsm8k": (0.951, "GSM-8K (8-shot, CoT) 95.1"),
            "minerva_math500": (0.680, "MATH (0-shot, CoT) 68.0; MATH-500 is its 500-problem subset"),
            "gpqa_diamond_cot_zeroshot": (0.467, "GPQA (0-shot) 46.7; the diamond set assumed alike"),
            "mmlu": (0.836, "MMLU (5-shot) 83.6"),
        },
    ),
    "kimi-k2-instruct": (
        KIMI_K2,
        {
            "aime24": (0.696, "AIME 2024 Avg@64 69.6"),
            "aime25": (0.495, "AIME 2025 Avg@64 49.5"),
            "minerva_math500": (0.974, "MATH-500 97.4"),
            "gpqa_diamond_cot_zeroshot": (0.751, "GPQA-Diamond Avg@8 75.1"),
            "mmlu": (0.895, "MMLU (EM) 89.5"),
        },
    ),
}


def _key(model: str) -> str:
    return model.strip().rstrip("/").split("/")[-1].lower()


def card_baseline(model: str, task: str) -> tuple[float, str] | None:
    """``(accuracy, source)`` of ``task`` on ``model``'s card, or None where the table has none."""
    entry = CARDS.get(_key(model))
    if entry is None or task not in entry[1]:
        return None
    source, tasks = entry
    value, what = tasks[task]
    return value, f"{model} model card: {what} ({source})"


def pilot_baselines(rows) -> dict[str, float]:
    """Per task label, the ``auto`` run's own accuracy in a results store's rows (the grid's pilot):
    ``<task>/accuracy`` of the generation evaluation, ``<task>/score`` of longcontext (per length as
    ``task@length``)."""
    out: dict[str, float] = {}
    for row in rows:
        if row.get("scheme") != "auto":
            continue
        metric, value, labels = str(row.get("metric")), row.get("value"), row.get("labels") or {}
        if not isinstance(value, (int, float)) or math.isnan(value):
            continue
        task, _, stat = metric.rpartition("/")
        if stat == "accuracy" and row.get("eval") == "generation":
            out[task] = float(value)
        elif stat == "score" and row.get("eval") == "longcontext":
            length = labels.get("length", "all")
            out[task if length == "all" else f"{task}@{length}"] = float(value)
    return out
