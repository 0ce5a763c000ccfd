"""The storage cache: real 1-byte codes, exact bytes, prefill quantized, agreement with the hook."""

from __future__ import annotations

import pytest
import torch

from evalkit import quantized_kv
from evalkit.integration.storage import QuantizedKVCache, quantized_cache
from evalkit.memory import layer_cache_bytes
from evalkit.model_info import kv_layout
from evalkit.kv.scheme import parse_scheme
from tests.tiny_models import tiny_model

NEW_TOKENS = 9


def generate(model, ids, mask, scheme, via_cache: bool):
    kwargs = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, output_scores=True,
                  return_dict_in_generate=True)
    with torch.no_grad():
        if via_cache:
            with quantized_cache(model, scheme) as new_cache:
                cache = new_cache(mask)
                out = model.generate(ids, cache=cache, **kwargs)
            return out, cache
        with quantized_kv(model, scheme):
            return model.generate(ids, **kwargs), None


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def inputs(pad=True):
    ids = torch.randint(3, 128, (2, 21), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    if pad:
        mask[1, :4] = 0
    return ids, mask


@pytest.mark.parametrize("scheme", ["fp8_e4m3/token/dynamic", "fp8_e5m2/group8/dynamic", "int4/group8/dynamic",
                                    "int8_asym/token/dynamic", "fp8_e4m3/tensor/unit", "fp8_e4m3/block16/unit",
                                    "fp8_e5m2/token/unit", "int4/group8/unit", "bf16"])
def test_per_token_scales_equal_the_hook_bit_for_bit(llama, scheme):
    ids, mask = inputs()
    hook, _ = generate(llama, ids, mask, scheme, via_cache=False)
    cache, _ = generate(llama, ids, mask, scheme, via_cache=True)
    assert torch.equal(hook.sequences, cache.sequences)
    assert all(torch.equal(a, b) for a, b in zip(hook.scores, cache.scores))


@pytest.mark.parametrize("scheme", ["fp8_e4m3/tensor/dynamic", "fp8_e4m3/head/dynamic", "fp8_e4m3/block16/dynamic"])
def test_prefill_is_quantized_and_matches_hook(llama, scheme):
    """The first step reads the stored prefill: equal to the hook's prefill, unlike the baseline."""
    ids, mask = inputs(pad=False)
    base, _ = generate(llama, ids, mask, "bf16", via_cache=True)
    hook, _ = generate(llama, ids, mask, scheme, via_cache=False)
    cache, _ = generate(llama, ids, mask, scheme, via_cache=True)
    assert torch.equal(cache.scores[0], hook.scores[0])
    assert not torch.equal(cache.scores[0], base.scores[0])


def expected_bytes(model, scheme_text, batch, stored_per_layer):
    scheme = parse_scheme(scheme_text)
    layout = kv_layout(model.config)
    total = 0
    for layer in range(layout.num_layers):
        quantized = not scheme.is_identity and not scheme.skips_layer(layer, layout.is_sliding(layer))
        for dim in (layout.head_dim, layout.v_head_dim):
            total += layer_cache_bytes(scheme, batch, layout.num_kv_heads, stored_per_layer(layer), dim, quantized)
    return total


@pytest.mark.parametrize("scheme", ["bf16", "fp8_e4m3/tensor/dynamic", "fp8_e4m3/head/dynamic", "fp8_e4m3/block16/dynamic",
                                    "fp8_e4m3/token/dynamic", "int4/group8/dynamic", "int4_asym/token/dynamic",
                                    "fp8_e4m3/tensor/unit", "fp8_e4m3/head/unit", "fp8_e4m3/block16/unit",
                                    "fp8_e4m3/token/unit", "fp8_e5m2/head/dynamic+skip=1"])
def test_bytes_equal_the_analytic_count(llama, scheme):
    ids, mask = inputs()
    _, cache = generate(llama, ids, mask, scheme, via_cache=True)
    seq = ids.shape[1] + NEW_TOKENS - 1  # the last generated token is never written
    assert cache.get_seq_length() == seq
    assert cache.nbytes() == expected_bytes(llama, scheme, 2, lambda layer: seq)


def test_codes_are_one_byte_and_int4_packs_two_per_byte(llama):
    ids, mask = inputs()
    _, fp8 = generate(llama, ids, mask, "fp8_e4m3/head/dynamic", via_cache=True)
    _, int4 = generate(llama, ids, mask, "int4/token/dynamic", via_cache=True)
    layer = fp8.layers[0]
    assert layer.k.codes.dtype == torch.float8_e4m3fn and layer.k.codes.shape[-1] == 16
    assert int4.layers[0].k.codes.dtype == torch.uint8 and int4.layers[0].k.codes.shape[-1] == 8
    assert isinstance(fp8, QuantizedKVCache)


def test_sliding_window_layers_are_capped():
    model = tiny_model("gemma3")  # layers 0-2 slide over 8 tokens, layer 3 is full
    ids, mask = inputs(pad=False)
    for scheme in ("fp8_e4m3/token/dynamic", "fp8_e4m3/head/dynamic"):
        _, cache = generate(model, ids, mask, scheme, via_cache=True)
        seq = ids.shape[1] + NEW_TOKENS - 1
        layout = kv_layout(model.config)
        stored = lambda layer: min(seq, layout.sliding_window - 1) if layout.is_sliding(layer) else seq  # noqa: E731
        assert cache.nbytes() == expected_bytes(model, scheme, 2, stored)
    hook, _ = generate(model, ids, mask, "fp8_e4m3/token/dynamic", via_cache=False)
    cached, _ = generate(model, ids, mask, "fp8_e4m3/token/dynamic", via_cache=True)
    assert all(torch.equal(a, b) for a, b in zip(hook.scores, cached.scores))


def test_fa3_through_the_cache_matches_the_hook_for_token_scales(llama):
    ids, mask = inputs()
    hook, _ = generate(llama, ids, mask, "fp8_e4m3/token/dynamic+attn=fa3", via_cache=False)
    cache, _ = generate(llama, ids, mask, "fp8_e4m3/token/dynamic+attn=fa3", via_cache=True)
    plain, _ = generate(llama, ids, mask, "fp8_e4m3/token/dynamic", via_cache=True)
    assert all(torch.equal(a, b) for a, b in zip(hook.scores, cache.scores))
    assert not torch.equal(cache.scores[0], plain.scores[0])
