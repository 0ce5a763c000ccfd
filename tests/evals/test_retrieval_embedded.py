"""Retrieval on the embedded SmolLM2-135M-Instruct at 1k tokens: the baseline retrieves the pass
key, and a destructive scheme (INT4 with unit scales: K/V rounded to integers in [-8, 7]) makes
accuracy collapse, so the eval can fail. Slow: six 1k-token prompts per scheme on CPU."""

from __future__ import annotations

import pytest

from evalkit.evals.retrieval.evaluation import RetrievalEval
from evalkit.kv.scheme import Scheme, parse_scheme

pytestmark = pytest.mark.slow


def _overall(rows):
    return next(r for r in rows if r.metric == "accuracy" and not r.labels)


def test_passkey_baseline_retrieves_and_int4_unit_collapses(embedded, tmp_path):
    ev = RetrievalEval({"tasks": "passkey", "lengths": "1k", "depths": "0,50,100", "samples": 1, "batch_size": 3})
    ev.prepare(embedded, tmp_path)
    tok = embedded.tokenizer
    for s in ev.samples:
        assert len(s.ids) == 1024
        text = tok.decode(list(s.ids))
        assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\nThe pass key is")
        assert text.count(s.answers[0]) == 2  # the needle states the key twice, nothing else does
    base = _overall(ev.evaluate(embedded, Scheme()))
    assert base.value >= 2 / 3, base
    broken_rows = ev.evaluate(embedded, parse_scheme("int4/tensor/unit"))
    broken = _overall(broken_rows)
    assert broken.value <= 1 / 3, broken
    diff = next(r for r in broken_rows if r.metric == "accuracy_diff" and not r.labels)
    assert diff.value == pytest.approx(broken.value - base.value) and diff.value <= -1 / 3
