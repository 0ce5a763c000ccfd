"""evalkit_recall (tasks/lmeval): complete a sentence seen earlier in the prompt, a generate_until
task whose answer sits in the stored K/V of the passage."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def task_utils():
    spec = importlib.util.spec_from_file_location("evalkit_task_utils", ROOT / "tasks" / "lmeval" / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_documents_are_seeded_and_the_answer_follows_the_prefix_in_the_passage():
    utils = task_utils()
    docs = utils.recall_documents(20)
    assert docs == utils.recall_documents(20) and len(docs) == 20
    for d in docs:
        words, prefix, target = utils._words(d["passage"]), utils._words(d["prefix"]), utils._words(d["target"])
        starts = [i for i in range(len(words)) if words[i : i + len(prefix)] == prefix]
        assert starts, d["prefix"]
        assert words[starts[0] + len(prefix) : starts[0] + len(prefix) + len(target)] == target


def test_scoring_compares_the_first_words_ignoring_case_and_punctuation():
    utils = task_utils()
    doc = {"target": "are determined by"}
    assert utils.recall_results(doc, ["Are determined, by the module"]) == {"exact_match": 1.0}
    assert utils.recall_results(doc, ["is determined by"]) == {"exact_match": 0.0}
    assert utils.recall_results(doc, [""]) == {"exact_match": 0.0}


def test_the_task_resolves_next_to_evalkits_other_tasks():
    from evalkit.evals.lmeval.adapter import resolve_tasks

    assert resolve_tasks(["evalkit_recall", "evalkit_mmlu4"]).names == ("evalkit_recall", "evalkit_mmlu4")
