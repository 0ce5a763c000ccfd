"""llama.cpp's Q rounding (evalkit.kv.codecs.llamacpp.attention) against a plain computation, and in attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from evalkit.kv.codecs.llamacpp.attention import VEC_DOT_TYPE, round_query
from evalkit.kv.codecs.llamacpp.ggml_blocks import hadamard_matrix


def q8_0_plain(x: np.ndarray) -> np.ndarray:
    """Blocks of 32: d = amax / 127 (fp16), codes = round-half-even(x * (127 / amax)), values = codes * d."""
    out = np.empty_like(x)
    for i in range(0, x.shape[-1], 32):
        b = x[..., i : i + 32].astype(np.float32)
        amax = np.abs(b).max(-1, keepdims=True)
        with np.errstate(divide="ignore"):
            idv = np.where(amax > 0, np.float32(127) / amax, np.float32(0))
        codes = np.rint((b * idv).astype(np.float32))
        d = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
        out[..., i : i + 32] = codes * d
    return out


@pytest.mark.parametrize("type_k", ["q8_0", "q4_0", "iq4_nl", "q5_1"])
def test_a_block_type_k_rounds_the_rotated_q_to_q8_0(type_k):
    torch.manual_seed(0)
    q = torch.randn(1, 3, 5, 64)
    h = hadamard_matrix(64).float().numpy()
    want = q8_0_plain(q.numpy() @ h) @ h  # rotated, rounded, rotated back (H H = I)
    got = round_query(q, type_k, 64).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)  # the butterflies' float32 order, not the matrix's
    assert not torch.equal(round_query(q, type_k, 64), q)


def test_without_a_rotation_the_blocks_run_over_the_head_as_stored():
    q = torch.randn(2, 1, 3, 96)  # head_dim 96: a multiple of 32, not of 64, so nothing is rotated
    np.testing.assert_array_equal(round_query(q, "q8_0", 96).numpy(), q8_0_plain(q.numpy()))


def test_float_types_round_q_to_their_own_dtype():
    q = torch.randn(1, 2, 3, 64)
    assert torch.equal(round_query(q, "f32", 64), q)
    assert torch.equal(round_query(q, "f16", 64), q.half().float())
    assert torch.equal(round_query(q, "bf16", 64), q.bfloat16().float())
    assert set(VEC_DOT_TYPE) == {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"}


def test_attention_reads_the_rounded_q_on_quantized_layers_only(tiny_llama_dir):
    """A llamacpp: scheme's logits change with the Q rounding; a skipped layer's attention is untouched."""
    from evalkit.integration import install
    from evalkit.integration.install import quantized_kv
    from evalkit.kv.scheme import parse_scheme
    from evalkit.models.loading import load_model

    lm = load_model(str(tiny_llama_dir), dtype="float32")
    ids = torch.arange(1, 40)[None]
    seen = []
    original = install._query_handler

    def spy(binding, round_query):
        inner_handler = original(binding, round_query)

        def handler(module, query, key, value, attention_mask, inner, **kwargs):
            def record(m, qq, *a, **k):
                seen.append((module.layer_idx, torch.equal(qq, query)))
                return inner(m, qq, *a, **k)

            return inner_handler(module, query, key, value, attention_mask, record, **kwargs)

        return handler

    install._query_handler = spy
    try:
        with torch.inference_mode(), quantized_kv(lm.model, parse_scheme("llamacpp:f16+skip=0")):
            lm.model(input_ids=ids)
    finally:
        install._query_handler = original
    unchanged = dict(seen)
    assert unchanged[0] is True  # the skipped layer keeps its Q
    assert any(v is False for layer, v in unchanged.items() if layer != 0)  # the others read f16-rounded Q
