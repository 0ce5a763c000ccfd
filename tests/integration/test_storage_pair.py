"""K and V stored in one quantize call (stored.append_pair) hold bit for bit what two calls hold.

The storage cache stacks a layer's K and V along the batch and quantizes them once where both are
per-token (or per-group) dynamic stores of one format that treats K and V alike. Every such scale is
computed within a batch row, so the two halves must equal separate calls exactly: checked here on
padded batches, through a prefill and decode steps, for every scheme of that kind the grids use,
against the same cache with the joint path switched off."""

from __future__ import annotations

import pytest
import torch

from evalkit import quantized_kv
from evalkit.errors import NonFiniteKVError
from evalkit.integration import stored

from tests.integration.test_storage import teacher_forced

JOINT = [
    "int8/token/dynamic",
    "int4/group8/dynamic",
    "fp8_e4m3/token/dynamic",
    "fp8_e5m2/group16/dynamic",
    "nvfp4",
    "mxfp4",
    "mxfp8_e4m3",
    "fp4_e2m1/group16/dynamic",
    "vllm:int8_per_token_head",
    "vllm:fp8_per_token_head",
    "vllm:int4_per_token_head",
    "vllm:nvfp4",
    "vllm:nvfp4_4over6",
]
SEPARATE = ["fp8_e4m3/tensor/dynamic", "int8/head/dynamic", "fp8_e4m3/tensor/unit", "vllm:turboquant_k3v4_nc"]


@pytest.fixture(scope="module")
def model():
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        vocab_size=128,
        hidden_size=256,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    return tf.AutoModelForCausalLM.from_config(cfg).eval()  # head_dim 64: MX groups and every vLLM kernel head size


def run(model, scheme, prefill=11, steps=5):
    ids = torch.randint(3, 128, (2, prefill + steps), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding: the first write's valid mask travels with the stacked halves
    return teacher_forced(model, scheme, ids, mask, prefill)


def held(st):
    return {
        name: getattr(st, name)
        for name in ("codes", "values", "scale", "zero", "tensor_scale")
        if getattr(st, name) is not None
    }


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        a, b = a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    return torch.equal(a, b)


@pytest.mark.parametrize("scheme", JOINT)
def test_one_call_for_k_and_v_stores_what_two_calls_store(model, scheme, monkeypatch):
    joint = run(model, scheme)
    layers = joint.storage_layers()
    assert all(layer.k.shares_flag and layer.v.shares_flag for layer in layers if layer.active)
    monkeypatch.setattr(stored, "_joinable", lambda *a: False)
    apart = run(model, scheme)
    for a, b in zip(layers, apart.storage_layers()):
        for sa, sb in ((a.k, b.k), (a.v, b.v)):
            assert not sb.shares_flag
            ha, hb = held(sa), held(sb)
            assert ha.keys() == hb.keys()
            for name in ha:
                assert bit_equal(ha[name], hb[name]), (scheme, a.layer_idx, name)
            assert sa.nbytes() == sb.nbytes()


@pytest.mark.parametrize("scheme", SEPARATE)
def test_stores_that_differ_between_k_and_v_keep_their_own_calls(model, scheme):
    """Frozen per-tensor/head scales (each side's own) and K/V-specific codecs are never stacked."""
    assert not any(layer.k.shares_flag for layer in run(model, scheme, steps=1).storage_layers())


def test_a_shared_nan_flag_names_k_or_v(model):
    with torch.no_grad():
        w = model.model.layers[0].self_attn.k_proj.weight
        kept = w[0, 0].item()
        w[0, 0] = float("inf")
        try:
            with pytest.raises(NonFiniteKVError, match="layer 0 K or V contains NaN or inf"):
                with quantized_kv(model, "vllm:int8_per_token_head"):
                    model(torch.randint(0, 100, (1, 8)))
        finally:
            w[0, 0] = kept
