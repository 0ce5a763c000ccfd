"""Rows say what was used: a retrieval row records the haystack its prompts were cut from (not the
``corpus`` parameter a ``haystack`` overrides), and lm-eval's flip rate adds up from its parts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from evalkit.evals.base import get_eval
from evalkit.evals.retrieval.tasks import load_task


def retrieval_rows(params: dict, tasks: list[str]):
    ev = get_eval("retrieval")({**params, "tasks": tasks, "samples": 1})
    ev.specs = {t: load_task(t) for t in tasks}
    ev.digest = "0" * 64
    frame = pd.DataFrame(
        [dict(task=t, length=512, depth=50.0, score=1.0, baseline_score=1.0, realised_depth=0.5) for t in tasks]
    )
    return ev.rows(frame)


def info_of(rows, task=None):
    want = {} if task is None else {"task": task}
    return next(r.info for r in rows if r.metric == "accuracy" and r.labels == want)


def test_a_haystack_for_every_task_is_what_the_rows_record(tmp_path):
    hay = f"file:{tmp_path / 'hay.txt'}"
    rows = retrieval_rows({"haystack": hay}, ["passkey", "niah_single_number"])
    for task in ("passkey", "niah_single_number", None):
        assert info_of(rows, task)["haystack"] == hay and info_of(rows, task)["corpus"] == hay
    assert all(r.info["corpus"] != "embedded" for r in rows)


def test_each_task_records_its_own_haystack(tmp_path):
    rows = retrieval_rows({"corpus": "embedded"}, ["passkey", "niah_single_number"])
    assert info_of(rows, "passkey")["haystack"] == "filler" and info_of(rows, "passkey")["corpus"] is None
    assert info_of(rows, "niah_single_number")["haystack"] == "embedded"
    assert info_of(rows)["haystack"] == "embedded, filler" and info_of(rows)["corpus"] == "embedded"


def mc_item(doc_id, prediction, correct):
    return {
        "doc_id": doc_id,
        "filter": "none",
        "doc_hash": f"h{doc_id}",
        "prediction": prediction,
        "correct": float(correct),
        "gold_loglik": -1.0,
    }


def test_flip_rate_is_the_sum_of_its_parts():
    """Gold answer 0 everywhere: a changed wrong answer (2 -> 3) is a flip that is neither right to
    wrong nor wrong to right; flip_wrong_to_wrong counts it, so the parts add up to flip_rate."""
    from evalkit.evals.lmeval.items import compare_items

    base = [mc_item(0, 0, 1), mc_item(1, 1, 0), mc_item(2, 2, 0), mc_item(3, 0, 1), mc_item(4, 3, 0), mc_item(5, 1, 0)]
    new = [mc_item(0, 1, 0), mc_item(1, 0, 1), mc_item(2, 3, 0), mc_item(3, 0, 1), mc_item(4, 1, 0), mc_item(5, 1, 0)]
    stats = compare_items(base, new)["none"]
    n = len(base)
    assert stats["flip_rate"][0] == 4 / n  # items 0, 1, 2, 4 changed
    assert stats["flip_right_to_wrong"][0] == 1 / n and stats["flip_wrong_to_right"][0] == 1 / n
    assert stats["flip_wrong_to_wrong"][0] == 2 / n  # items 2 and 4
    assert stats["flip_wrong_to_wrong"][3] == {"n_items": n, "n_flipped": 2}
    parts = sum(stats[k][0] for k in ("flip_right_to_wrong", "flip_wrong_to_right", "flip_wrong_to_wrong"))
    assert parts == pytest.approx(stats["flip_rate"][0], abs=1e-15)
    low, high = stats["flip_wrong_to_wrong"][1:3]
    assert 0 <= low < 2 / n < high <= 1
    assert np.isclose(compare_items(base, base)["none"]["flip_wrong_to_wrong"][0], 0.0)
