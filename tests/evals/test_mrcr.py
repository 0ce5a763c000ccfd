"""MRCR as the field scores it: openai/mrcr's grade, the length buckets, the AUC across lengths (recomputed by
hand, and held to the published leaderboard figures it is defined from), the recovery, the stand-in's
generator and the conversation sent as a chat."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from evalkit.evals.generation import mrcr
from evalkit.evals.generation.params import tasks_dir


def _task_module():
    spec = importlib.util.spec_from_file_location("mrcr_task", tasks_dir() / "mrcr.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grade_is_the_cards_prefix_then_sequence_matcher_ratio():
    grade = _task_module().grade
    assert grade("abcd", "XYabce", "XY") == 0.0  # no prefix: 0, however close the rest
    # with the prefix: both stripped, ratio = 2 * matches / total characters = 2 * 3 / 8
    assert grade("XYabcd", "XYabce", "XY") == 0.75
    assert grade("XYhello", "XYhello", "XY") == 1.0
    assert grade("XY", "XYab", "XY") == 0.0  # nothing after the prefix: no match


def test_bucket_edges_are_powers_of_two_closed_above():
    assert [mrcr.bucket_edge(n) for n in (700, 1024, 1025, 4096, 4097, 8192, 131072)] == [
        1024,
        1024,
        2048,
        4096,
        8192,
        8192,
        131072,
    ]
    assert mrcr.edge_label(8192) == "4k-8k" and mrcr.edge_label(131072) == "64k-128k"


def test_auc_equals_a_hand_trapezoid_on_the_linear_length_axis():
    x, y = [1024, 2048, 4096, 8192], [0.9, 0.8, 0.5, 0.2]
    by_hand = (1024 * (0.9 + 0.8) / 2 + 2048 * (0.8 + 0.5) / 2 + 4096 * (0.5 + 0.2) / 2) / (8192 - 1024)
    assert mrcr.auc(x, y) == pytest.approx(by_hand, abs=1e-12)
    assert by_hand == pytest.approx(3635.2 / 7168)
    # on a log2 axis every doubling weighs the same: (0.85 + 0.65 + 0.35) / 3
    assert mrcr.auc_log2(x, y) == pytest.approx((0.85 + 0.65 + 0.35) / 3)
    assert mrcr.auc([8192], [0.4]) == 0.4


@pytest.mark.parametrize(
    "scores, published",
    [
        ((99.5, 97.1, 94.4, 93.9, 84.3), 91.9),  # google/gemini-2.5-pro-preview, AUC @128k
        ((98.7, 94.3, 89.0, 88.9, 84.1), 88.5),  # google/gemini-2.5-pro-preview-03-25
        ((87.6, 68.0, 70.4, 57.5, 55.5), 61.6),  # openai/gpt-4.1
        ((99.5, 97.1, 94.4, 93.9, 84.3, 83.7, 71.0, 54.1), 72.5),  # gemini-2.5-pro-preview, AUC @1M
    ],
)
def test_auc_reproduces_the_mrcr_leaderboards_published_auc(scores, published):
    """contextarena.ai's MRCR table (per-bin % at 8k..1M, then "AUC @128k" / "AUC @1M"): the definition
    the module docstring states gives its published AUC to its rounding; log2 spacing does not."""
    x = [8192 * 2**j for j in range(len(scores))]
    assert mrcr.auc(x, scores) == pytest.approx(published, abs=0.05)
    if len(scores) == 5:
        assert abs(mrcr.auc_log2(x, scores) - published) > 0.5


def _rows(tokens, base, mine):
    rows = mrcr.curve_rows("mrcr_standin", "none", tokens, np.array(base, float), np.array(mine, float), {})
    return {(r.metric, r.labels.get("bucket")): r for r in rows}


def test_rows_give_pass_at_1_per_bucket_the_auc_and_the_recovery_by_hand():
    tokens = [700, 900, 1500, 1900, 3000, 3500]  # buckets 1k, 2k, 4k: two items each
    base = [[1.0, 0.8], [0.6, 0.6], [0.5, 0.7], [0.4, 0.4], [0.3, 0.1], [0.2, 0.2]]
    mine = [[0.9, 0.7], [0.5, 0.5], [0.3, 0.5], [0.2, 0.2], [0.0, 0.0], [0.1, 0.1]]
    rows = _rows(tokens, base, mine)
    pass1 = {b: rows[("mrcr_standin/mrcr_pass@1_by_length", b)].value for b in ("512-1k", "1k-2k", "2k-4k")}
    assert pass1 == pytest.approx({"512-1k": 0.65, "1k-2k": 0.3, "2k-4k": 0.05})
    base_curve = [0.75, 0.5, 0.2]
    auc_base = (1024 * (0.75 + 0.5) / 2 + 2048 * (0.5 + 0.2) / 2) / 3072
    auc_mine = (1024 * (0.65 + 0.3) / 2 + 2048 * (0.3 + 0.05) / 2) / 3072
    auc = rows[("mrcr_standin/mrcr_auc", None)]
    assert auc.value == pytest.approx(auc_mine)
    assert auc.info["baseline_auc"] == pytest.approx(auc_base)
    assert auc.info["baseline_pass@1"] == pytest.approx(base_curve)
    assert rows[("mrcr_standin/mrcr_auc_delta", None)].value == pytest.approx(auc_mine - auc_base)
    assert rows[("mrcr_standin/mrcr_recovery", None)].value == pytest.approx(100 * auc_mine / auc_base)
    # the AUC's interval: t with 3 degrees of freedom on sum_b w_b^2 var_b / n_b, by hand
    from scipy import stats

    w = np.array([1024 / 2, 1024 / 2 + 2048 / 2, 2048 / 2]) / 3072
    item_means = np.array(mine).mean(1).reshape(3, 2)
    var = sum(w[b] ** 2 * np.var(item_means[b], ddof=1) / 2 for b in range(3))
    half = stats.t.ppf(0.975, 3) * np.sqrt(var)
    assert (auc.ci_low, auc.ci_high) == pytest.approx((auc_mine - half, auc_mine + half))


def test_the_baseline_against_itself_recovers_100_percent_with_no_width():
    tokens, scores = [700, 900, 1500, 1900], [[0.9], [0.5], [0.4], [0.2]]
    rows = _rows(tokens, scores, scores)
    rec = rows[("mrcr_standin/mrcr_recovery", None)]
    assert rec.value == 100.0 and (rec.ci_low, rec.ci_high) == (100.0, 100.0)
    assert rows[("mrcr_standin/mrcr_auc_delta", None)].value == 0.0


def test_no_recovery_row_when_the_baseline_scores_zero_and_no_interval_from_one_item():
    rows = _rows([700, 1500], [[0.0], [0.0]], [[0.2], [0.0]])
    assert ("mrcr_standin/mrcr_recovery", None) not in rows
    assert rows[("mrcr_standin/mrcr_auc", None)].ci_low is None


def test_a_graded_score_is_kept_and_never_read_as_right_or_wrong():
    from evalkit.evals.generation.items import sample_records

    class Tok:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": list(range(len(text.split())))}

    results = {
        "samples": {
            "mrcr_standin": [
                {
                    "doc_id": 0,
                    "resps": [["AB hi"]],
                    "filtered_resps": ["AB hi"],
                    "metrics": ["mrcr_score"],
                    "mrcr_score": 1.0,
                },
            ]
        }
    }
    sample = sample_records(results, Tok(), 0, 64)["mrcr_standin"][0]["samples"][0]
    assert sample["correct"] is None and sample["scores"] == {"mrcr_score": 1.0}


def test_the_generator_reproduces_the_committed_stand_in():
    spec = importlib.util.spec_from_file_location("make_mrcr_standin", tasks_dir() / "make_mrcr_standin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.render(module.make_items()) == (tasks_dir() / "mrcr_standin.json").read_text()
    items = json.loads((tasks_dir() / "mrcr_standin.json").read_text())["test"]
    assert {i["n_needles"] for i in items} == {2, 4}
    for item in items:
        chat = json.loads(item["prompt"])
        assert item["answer"].startswith(item["random_string_to_prepend"])
        assert chat[item["desired_msg_index"]]["content"] == item["answer"][len(item["random_string_to_prepend"]) :]
        assert [m["role"] for m in chat[:-1]] == ["user", "assistant"] * (len(chat) // 2) and chat[-1]["role"] == "user"


def test_the_conversation_reaches_the_chat_template_as_a_chat():
    from lm_eval.tasks import TaskManager

    loaded = TaskManager(include_path=str(tasks_dir()), include_defaults=False).load(["mrcr_standin"])
    task = loaded["tasks"]["mrcr_standin"]
    doc = next(iter(task.test_docs()))
    seen = []

    def template(chat, add_generation_prompt=True):
        seen.append((chat, add_generation_prompt))
        return "RENDERED"

    assert task.fewshot_context(doc, 0, "be brief", True, False, template) == "RENDERED"
    chat, gen = seen[0]
    assert gen and chat[0] == {"role": "system", "content": "be brief"} and chat[1:] == json.loads(doc["prompt"])
    plain = task.fewshot_context(doc, 0, None, False, False, None)
    assert plain.startswith("User: ") and plain.endswith("\n\nAssistant:")
    assert task.process_results(doc, [doc["answer"]]) == {"mrcr_score": 1.0}


def test_runs_table_has_a_column_per_length_bucket():
    from evalkit.sweep.run_table import rows_table

    rows = [
        {"scheme": "auto", "metric": "t/mrcr_pass@1_by_length", "value": v, "labels": {"task": "t", "bucket": b}}
        for b, v in (("512-1k", 0.5), ("1k-2k", 0.25))
    ]
    table = rows_table(rows)
    assert "t/mrcr_pass@1_by_length [512-1k]" in table and "t/mrcr_pass@1_by_length [1k-2k]" in table
    assert "0.5" in table and "0.25" in table


def test_the_hub_mrcr_tasks_count_as_needing_the_network_and_the_stand_in_does_not():
    """So an offline run of mrcr_2needle without the set cached stops in one line naming openai/mrcr (the
    generation evaluation's network guard), while mrcr_standin never probes the hub."""
    from evalkit.evals.generation.serving import datasets_of, offline_own
    from evalkit.evals.lmeval.adapter import resolve_tasks

    tasks = offline_own(resolve_tasks(["mrcr_standin", "mrcr_2needle", "mrcr_4needle"], (str(tasks_dir()),)))
    assert tasks.external == ("mrcr_2needle", "mrcr_4needle")
    assert datasets_of(tasks) == {"mrcr_2needle": "openai/mrcr", "mrcr_4needle": "openai/mrcr"}
