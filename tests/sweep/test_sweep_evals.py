"""Checks of the test-only ``toy`` evaluation (``tests/toy_eval.py``) that the sweep tests run on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.toy_eval import ToyEval


def test_toy_metrics_against_numpy(tiny_llama_dir):
    """The toy eval's numbers equal a plain numpy computation of NLL and KL."""
    from evalkit.integration.install import quantized_kv
    from evalkit.models.loading import load_model

    lm = load_model(str(tiny_llama_dir))
    ev = ToyEval({"max_tokens": 16})
    ev.prepare(lm, Path("."))
    rows = ev.evaluate(lm, __import__("evalkit").parse_scheme("fp8_e5m2/tensor/unit"))
    with torch.no_grad():
        base = lm.model(ev.ids).logits[0].double().numpy()
        with quantized_kv(lm.model, "fp8_e5m2/tensor/unit"):
            q = lm.model(ev.ids).logits[0].double().numpy()
    ids = ev.ids[0].numpy()

    def logsoftmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lq, lb = logsoftmax(q[:-1]), logsoftmax(base[:-1])
    nll = -lq[np.arange(len(ids) - 1), ids[1:]]
    kl = (np.exp(lb) * (lb - lq)).sum(-1)
    assert rows[0].metric == "nll" and rows[0].value == pytest.approx(nll.mean(), rel=1e-9)
    half = len(nll) // 2
    se = nll.std(ddof=1) / np.sqrt(len(nll))
    assert rows[0].ci_low == pytest.approx(nll.mean() - 1.96 * se, rel=1e-9)
    assert rows[1].value == pytest.approx(kl.mean(), rel=1e-6, abs=1e-12)
    assert rows[1].value > 0  # e5m2 with unit scales changes this random model's outputs
    assert rows[2].value == pytest.approx(nll[:half].mean(), rel=1e-9)
    assert rows[3].value == pytest.approx(nll[half:].mean(), rel=1e-9)
