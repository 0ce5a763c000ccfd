"""lm-eval's automatic batch size sees what a row costs on the static decode path: its static cache
for the longest generation (the compiled step's bucket) and one step's logits, held beside each of
the probe's forwards."""

from __future__ import annotations

import pytest
import torch

from evalkit import quantized_kv
from evalkit.evals.lmeval.batching import static_row_bytes
from evalkit.kv.scheme import parse_scheme

FP8 = "fp8_e4m3/tensor/dynamic"


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    from evalkit.models.loading import load_model

    return load_model(str(tiny_llama_dir))


def test_a_rows_bytes_are_its_cache_and_one_steps_logits(tiny):
    """By hand: FP8 codes (1 byte) for K and V of every layer, head and position of the bucket, one
    float32 scale per layer and side, and the float32 model's logits 4 times (head output, its float32
    copy, warped scores, probabilities); and no less than a real one-row static cache allocates."""
    from evalkit.integration.static_decode import StaticDecoder

    c = tiny.model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    cache = c.num_hidden_layers * 2 * (c.num_key_value_heads * head_dim * 640 + 4)  # 600 -> its bucket, 640
    assert static_row_bytes(tiny.model, parse_scheme(FP8), 600, compiled=True) == cache + c.vocab_size * 16
    assert (
        static_row_bytes(tiny.model, parse_scheme(FP8), 600, compiled=True, sampled=False) == cache + c.vocab_size * 8
    )
    ids = torch.randint(3, 100, (1, 600), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), quantized_kv(tiny.model, FP8) as session:
        dec = StaticDecoder(session, tiny.model.base_model, torch.ones_like(ids), 600, 600, compiled=True)
        dec.prefill(ids, torch.arange(600)[None])
        assert dec.cache.held_bytes() == cache


def test_the_batch_size_probe_holds_each_rows_bytes(tiny, monkeypatch):
    """A device that holds 5 rows of the static path: the probe (64 rows, then fewer on each
    out-of-memory) settles on 5; on the eager path nothing is held beside the forward."""
    from evalkit.evals.lmeval.adapter import make_hflm

    hflm = make_hflm(tiny.model, tiny.tokenizer, "auto")
    asked = []

    def reserve(rows):
        asked.append(rows)
        if rows * hflm._row_bytes > 5 * row:
            raise RuntimeError("CUDA out of memory. Tried to allocate the static rows")
        return torch.empty(0)

    monkeypatch.setattr(hflm, "_reserve", reserve)
    row = static_row_bytes(tiny.model, parse_scheme(FP8), hflm.max_length, compiled=True)
    with torch.inference_mode(), quantized_kv(tiny.model, FP8) as session, hflm.decode_through(session, "compiled"):
        assert hflm._detect_batch_size() == 5
    fits = asked.index(5)
    assert asked[0] == 64 and all(rows > 5 for rows in asked[:fits]) and set(asked[fits:]) == {5}
    assert hflm._row_bytes == 0  # only while probing
    asked.clear()
    with torch.inference_mode(), quantized_kv(tiny.model, FP8) as session, hflm.decode_through(session, "eager"):
        monkeypatch.setattr(hflm, "max_batch_size", 2)
        assert hflm._detect_batch_size() == 2
    assert asked == []
