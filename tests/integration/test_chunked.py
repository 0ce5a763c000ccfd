"""Chunked prefill and prefix-cache hits in the storage cache, against plain readings of vLLM's attention.

vLLM's TurboQuant/UltraQuant backends (``turboquant_attn.py`` ``_prefill_attention``) attend a first chunk
over its raw K/V, a continuation chunk of at most 128 tokens entirely from the quantized cache (the decode
kernel), and a longer continuation chunk over the dequantized earlier tokens followed by its own raw K/V.
Here each case is written straight into a storage cache and what attention receives is compared with the
raw inputs and with what a later decode step reads from the same stored codes.
"""

from __future__ import annotations

import pytest
import torch

from evalkit.evals.perplexity.params import PerplexityParams
from evalkit.integration import chunked
from evalkit.integration.install import quantized_kv

from tests.tiny_models import llama_head64

TQ = "vllm:turboquant_4bit_nc"


@pytest.fixture(scope="module")
def model():
    return llama_head64(layers=6)  # TurboQuant keeps layers 0, 1, 4, 5 unquantized: 2 and 3 store codes


def test_chunk_bounds_and_prefix_hits_by_hand():
    assert chunked.chunk_bounds(300, 128) == [(0, 128), (128, 256), (256, 300)]
    assert chunked.chunk_bounds(256, 128) == [(0, 128), (128, 256)]
    assert chunked.chunk_bounds(5, 8) == [(0, 5)]
    # whole 16-token blocks, never the last token (vLLM recomputes it for its logits)
    assert [chunked.prefix_hit_length(s, t) for s, t in ((40, 100), (15, 100), (100, 100), (33, 33), (0, 9))] == [
        32,
        0,
        96,
        32,
        0,
    ]
    prompts = [[1] * 40 + [2] * 10, [1] * 40 + [3] * 10, [1] * 20 + [4] * 30, [5] * 50]
    assert chunked.shared_prefixes(prompts) == [32, 32, 16, 0]
    assert chunked.shared_prefixes(prompts, block=1) == [40, 40, 20, 0]


def test_default_chunk_is_the_flag_default():
    assert PerplexityParams().prefill_chunk == chunked.DEFAULT_CHUNK == 8192


def test_which_schemes_are_chunked():
    assert chunked.chunked_prefill_applies(TQ, 300, 128)
    assert chunked.chunked_prefill_applies("vllm:ultraquant_4bit", 300, 128)
    assert not chunked.chunked_prefill_applies(TQ, 128, 128)  # fits one chunk
    for other in ("auto", "fp8_e4m3/tensor/unit", "fp8_e4m3/tensor/dynamic", "vllm:int8_per_token_head"):
        assert not chunked.chunked_prefill_applies(other, 300, 128)


def _kv(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, n, 64, generator=g), torch.randn(1, 2, n, 64, generator=g)


@pytest.mark.parametrize("second", [200, 100])
def test_turboquant_reads_as_its_backend(model, second):
    """First chunk raw; a continuation over 128 tokens: earlier tokens dequantized, its own raw; at most
    128: everything from the cache. Layer 2 stores codes; layer 0 (a boundary layer) stays raw."""
    (k1, v1), (k2, v2), (k3, v3) = _kv(64, 1), _kv(second, 2), _kv(1, 3)
    with quantized_kv(model, TQ) as session:
        cache = session.new_cache()
        got1 = cache.update(k1, v1, 2)
        got2 = cache.update(k2, v2, 2)
        later_k, later_v = cache.update(k3, v3, 2)  # a decode step reads every stored token from the codes
        raw_layer = session.new_cache()
        raw_layer.update(k1, v1, 0)
        boundary = raw_layer.update(k2, v2, 0)
    assert torch.equal(got1[0], k1) and torch.equal(got1[1], v1)
    stored_k, stored_v = later_k[:, :, : 64 + second], later_v[:, :, : 64 + second]
    assert not torch.equal(stored_k[:, :, :64], k1)  # the codes are lossy: the test can tell the two apart
    if second > chunked.CONTINUATION_DECODE_THRESHOLD:
        assert torch.equal(got2[0], torch.cat([stored_k[:, :, :64], k2], 2))
        assert torch.equal(got2[1], torch.cat([stored_v[:, :, :64], v2], 2))
    else:
        assert torch.equal(got2[0], stored_k) and torch.equal(got2[1], stored_v)
    assert torch.equal(boundary[0], torch.cat([k1, k2], 2)) and torch.equal(boundary[1], torch.cat([v1, v2], 2))


@pytest.mark.parametrize("scheme, bound", [("auto", 1e-5), ("fp8_e4m3/tensor/unit", 1e-3)])
def test_store_and_read_all_schemes_change_only_in_float_order(model, scheme, bound):
    """For a scheme that stores on write and reads everything back, cutting the prefill changes no value
    read, only sdpa's summation order: the hidden states of one forward and of 128-token chunks differ by
    at most ``bound`` (measured: 1.2e-6 for auto; 2.1e-6 for FP8 unit scale at chunk 128, 2.7e-4 at chunk
    100, where that rounding flips an FP8 code). The perplexity evaluation keeps these schemes' one forward."""
    ids = torch.randint(0, 128, (2, 300), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), quantized_kv(model, scheme) as session:
        one = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
        cut = chunked.prefill_in_chunks(model.base_model, ids, 128, session.new_cache())
    assert torch.equal(one[:, :128], cut[:, :128])  # the first chunk: the same shapes, the same bits
    assert 0 < (one - cut).abs().max() <= bound


def test_turboquant_chunked_prefill_reads_quantized(model):
    """One forward under TurboQuant is the plain model bit for bit (raw K/V); chunked, the later chunks
    are not: they read the first chunk through its codes."""
    ids = torch.randint(0, 128, (1, 300), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        plain = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
        with quantized_kv(model, TQ) as session:
            one = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
            cut = chunked.prefill_in_chunks(model.base_model, ids, 128, session.new_cache())
    assert torch.equal(one, plain)
    assert torch.equal(cut[:, :128], plain[:, :128])
    assert (cut[:, 128:] - plain[:, 128:]).abs().amax(-1).min() > 1e-4  # every later position moved
