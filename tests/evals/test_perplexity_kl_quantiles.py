"""The per-token KL percentiles (kl_p50, kl_p99, kl_p999, kl_max, as llama.cpp's KL tool reports
them) against a plain numpy computation over the full vocabulary, and the rows they sit beside unchanged."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from evalkit.data.corpus import load_corpus
from evalkit.evals import kl_topk
from evalkit.evals.emulation import perplexity as emulated_perplexity
from evalkit.evals.perplexity.evaluation import KL_QUANTILES, PerplexityEval, kl_quantile_rows
from evalkit.integration.install import quantized_kv
from evalkit.kv.scheme import Scheme, parse_scheme

QUANT = "int4/tensor/unit"  # coarse (scale 1.0): per-token KLs far above the summary's float16/float32 resolution


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    from evalkit.models.loading import load_model

    return load_model(str(tiny_llama_dir))


@pytest.fixture(scope="module")
def prose(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "prose.txt"
    path.write_text(load_corpus("embedded").text[:20_000], encoding="utf-8")
    return f"file:{path}"


def linear_percentile(values: np.ndarray, q: float) -> float:
    """The q-th percentile by hand: linear interpolation between the sorted values at (n - 1) q / 100."""
    s = np.sort(values)
    h = (len(s) - 1) * q / 100
    lo = math.floor(h)
    return float(s[lo] + (h - lo) * (s[min(lo + 1, len(s) - 1)] - s[lo]))


def test_quantile_rows_are_the_order_statistics():
    kl = np.random.default_rng(0).exponential(0.01, 5000) ** 2
    rows = {r.metric: r for r in kl_quantile_rows(kl, {"n_windows": 3})}
    assert list(rows) == ["kl_p50", "kl_p99", "kl_p999", "kl_max"]
    assert rows["kl_p50"].value == pytest.approx(float(np.median(kl)), rel=1e-12)
    assert rows["kl_p99"].value == pytest.approx(linear_percentile(kl, 99), rel=1e-12)
    assert rows["kl_p999"].value == pytest.approx(linear_percentile(kl, 99.9), rel=1e-12)
    assert rows["kl_max"].value == float(kl.max())
    assert all(r.labels == {} and r.ci_low is None and r.info["n_windows"] == 3 for r in rows.values())


def plain_token_kl(ev, lm, scheme) -> np.ndarray:
    """KL(baseline || scheme) of every scored token, float64 log-softmax of the full logits, in numpy."""
    ids = lm.tokenizer(load_corpus(ev.params["corpus"]).text, add_special_tokens=False)["input_ids"]
    c = ev.params["window"] - int(ev.bos)
    out = []
    with torch.inference_mode():
        for start, t0 in ev.plan:
            x = torch.tensor([([lm.tokenizer.bos_token_id] if ev.bos else []) + ids[start : start + c]])
            base = lm.model(x).logits[0, t0 - 1 : -1].double().numpy()
            with quantized_kv(lm.model, scheme):
                quant = lm.model(x).logits[0, t0 - 1 : -1].double().numpy()
            lp = base - np.logaddexp.reduce(base, axis=-1, keepdims=True)
            lq = quant - np.logaddexp.reduce(quant, axis=-1, keepdims=True)
            out.append((np.exp(lp) * (lp - lq)).sum(-1))
    return np.concatenate(out)


def test_percentiles_match_numpy_over_the_full_vocabulary(tiny, tmp_path, prose, monkeypatch):
    """With the summary's head holding the whole vocabulary (no sampled tail) each token's KL is exact
    up to the stored float16 weights and float32 sums. A percentile moves by at most the largest
    per-token difference (sorting and interpolating are 1-Lipschitz in the max norm), so each row is
    numpy's percentile of the full-vocabulary KLs to within that difference, which is small."""
    vocab = tiny.model.config.vocab_size
    monkeypatch.setattr(kl_topk, "TOP_K", vocab)
    monkeypatch.setattr(emulated_perplexity, "TOP_K", vocab)  # the baseline file's head width
    monkeypatch.setattr(emulated_perplexity, "summarize", functools.partial(kl_topk.summarize, top_k=vocab))
    ev = PerplexityEval(dict(window=128, max_windows=3, bootstrap_samples=200, corpus=prose))
    ev.prepare(tiny, tmp_path)
    scheme = parse_scheme(QUANT)
    per_token = ev.token_scores(tiny, scheme).kl.numpy()
    rows = {r.metric: r for r in ev.evaluate(tiny, scheme) if not r.labels}
    ref = plain_token_kl(ev, tiny, scheme)
    assert len(ref) == len(per_token) == rows["n_tokens"].value
    worst = float(np.abs(per_token - ref).max())
    assert worst < 0.05 * float(np.median(ref)), (worst, float(np.median(ref)))
    for name, q in KL_QUANTILES.items():
        assert abs(rows[name].value - float(np.percentile(ref, q))) <= worst + 1e-15, name
    assert rows["kl_p50"].value <= rows["kl_p99"].value <= rows["kl_p999"].value <= rows["kl_max"].value
    base = {r.metric: r.value for r in ev.evaluate(tiny, Scheme()) if not r.labels}
    assert all(base[name] == 0.0 for name in KL_QUANTILES)  # the baseline against itself


def test_the_other_rows_do_not_change(tiny, tmp_path, prose):
    """The percentile rows are added after the existing ones, which keep their values and order."""
    ev = PerplexityEval(dict(window=96, max_windows=2, bootstrap_samples=200, corpus=prose))
    ev.prepare(tiny, tmp_path)
    scores = ev.token_scores(tiny, parse_scheme(QUANT))
    rows = ev._rows(scores)
    names = [r.metric for r in rows]
    assert names[-len(KL_QUANTILES) :] == list(KL_QUANTILES)
    without = [r for r in rows if r.metric not in KL_QUANTILES]
    assert [r.metric for r in without[:7]] == [
        "ppl",
        "ppl_delta",
        "ppl_delta_rel",
        "kl_mean",
        "top1_agreement",
        "p_value",
        "n_tokens",
    ]
    kl = scores.kl.numpy()
    assert {r.metric: r.value for r in rows[-4:]} == {r.metric: r.value for r in kl_quantile_rows(kl, {})}
