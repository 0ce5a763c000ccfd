"""Perplexity through chunked prefill: a TurboQuant row on windows longer than one prefill chunk is
measured and says so; every other scheme's rows are unchanged bit for bit by the chunk setting.

The reference is computed the plain way: each window fed to the causal LM chunk by chunk into one
storage cache (``model(ids[a:b], past_key_values=cache)``), log-softmax of its logits, the target's NLL.
"""

from __future__ import annotations

import math

import pytest
import torch

from evalkit.data.corpus import load_corpus
from evalkit.evals.perplexity.evaluation import PerplexityEval
from evalkit.integration.hf_compat import cache_inputs
from evalkit.integration.install import quantized_kv
from evalkit.kv.scheme import parse_scheme

from tests.tiny_models import turboquant_llama

TQ = "vllm:turboquant_4bit_nc"


@pytest.fixture(scope="module")
def deep(tmp_path_factory, tiny_tokenizer_dir):
    """A tiny llama of 6 layers, head_dim 64 (TurboQuant quantizes layers 2 and 3), loaded as evalkit loads a folder."""
    return turboquant_llama(tmp_path_factory.mktemp("deep"), tiny_tokenizer_dir)


@pytest.fixture(scope="module")
def prose(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "prose.txt"
    path.write_text(load_corpus("embedded").text[:20_000], encoding="utf-8")
    return f"file:{path}"


def _eval(deep, folder, prose, **params):
    ev = PerplexityEval(dict(window=300, max_windows=3, bos=False, corpus=prose, **params))
    ev.prepare(deep, folder)
    return ev


def _top(rows):
    return {r.metric: r for r in rows if not r.labels}


def _chunked_ppl(lm, ev, scheme, chunk):
    """Perplexity over the evaluation's windows, each fed to the causal LM chunk by chunk (plain scoring)."""
    total, n = 0.0, 0
    model = lm.model
    with torch.inference_mode(), quantized_kv(model, scheme) as session:
        for ids, t0 in ev.window_inputs():
            ids = ids[None]
            cache = session.new_cache()
            logits = torch.cat(
                [
                    model(input_ids=ids[:, a : a + chunk], **cache_inputs(model, cache)).logits
                    for a in range(0, ids.shape[1], chunk)
                ],
                dim=1,
            )
            lp = logits[0, t0 - 1 : -1].double().log_softmax(-1)
            total -= float(lp.gather(1, ids[0, t0:, None]).sum())
            n += ids.shape[1] - t0
    return math.exp(total / n)


def test_turboquant_window_longer_than_a_chunk_is_measured_and_says_so(deep, tmp_path, prose):
    ev = _eval(deep, tmp_path, prose, prefill_chunk=128)
    top = _top(ev.evaluate(deep, parse_scheme(TQ)))
    assert top["ppl"].info["prefill"] == "chunked prefill, chunk 128"
    assert top["ppl"].value == pytest.approx(_chunked_ppl(deep, ev, TQ, 128), rel=1e-5)
    assert top["kl_mean"].value > 0 and top["ppl_delta"].value != 0.0  # one forward would give exactly 0 (raw K/V)
    assert "not_measured" not in top["ppl"].info
    assert ev.canonical_params()["prefill_chunk"] == 128  # it decides these numbers: in the run id


def test_turboquant_window_within_one_chunk_stays_not_measured(deep, tmp_path, prose):
    ev = _eval(deep, tmp_path, prose)  # the default chunk, 8192, holds the 300-token window
    top = _top(ev.evaluate(deep, parse_scheme(TQ)))
    assert math.isnan(top["ppl"].value) and "fits one prefill chunk (8192)" in top["ppl"].info["not_measured"]
    assert "prefill_chunk" not in ev.canonical_params()  # runs made before the setting keep their ids


@pytest.mark.parametrize("scheme", ["auto", "fp8_e4m3/tensor/unit", "fp8_e4m3/tensor/dynamic"])
def test_other_schemes_rows_do_not_depend_on_the_chunk(deep, tmp_path, prose, scheme):
    one = _eval(deep, tmp_path, prose).evaluate(deep, parse_scheme(scheme))
    cut = _eval(deep, tmp_path, prose, prefill_chunk=128).evaluate(deep, parse_scheme(scheme))
    key = [(r.metric, r.labels, r.value, r.ci_low, r.ci_high) for r in one]
    assert key == [(r.metric, r.labels, r.value, r.ci_low, r.ci_high) for r in cut]
    assert all("prefill" not in r.info for r in cut)
