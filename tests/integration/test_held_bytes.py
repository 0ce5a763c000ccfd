"""The storage cache holds what the engine holds: codes and scales, no full-precision copy.

For every scheme kind (tensor, head, block, token and group scales; static, unit and dynamic
sources; the 4-bit formats; every ``vllm:``, ``llamacpp:`` and ``sglang:`` codec; MLA), after a prefill and
decode steps the bytes the cache keeps between forwards (``held_bytes``: allocated codes, scales,
zero points, the open block's tokens, growth room) are at most the engine's bytes (``nbytes``)
plus one layer's K/V in the model's dtype, which is what attention borrows while one layer reads
its K/V (and drops after it). The growth room is made small here (``GrowingTensor.CHUNK``) so that
the bound is the literal one; at the default 256 tokens it is the documented "small overhead".
Dynamic block scales also keep each layer's open block as it arrived (at most N - 1 tokens per
sequence and head, in the model's dtype, whatever the context length): that is allowed on top.
"""

from __future__ import annotations

import pytest
import torch

from evalkit import quantized_kv
from evalkit.evals.decode.loop import position_ids
from evalkit.integration.growing import GrowingTensor
from evalkit.integration.hf_compat import cache_inputs
from evalkit.kv.codecs.llamacpp.family import CODECS as LLAMACPP_CODECS
from evalkit.kv.codecs.vllm.dtypes import VLLM_DTYPES, Arch, Status
from evalkit.models.info import kv_layout

from tests.tiny_models import ds_mla_512, llama_head64, tiny_model

PREFILL, STEPS, B = 24, 16, 2

KINDS = [
    "fp8_e4m3/tensor/dynamic",
    "fp8_e4m3/head/dynamic",
    "fp8_e4m3/tensor/unit",
    "fp8_e5m2/block16/dynamic",
    "int4/block8/dynamic",
    "fp8_e4m3/token/dynamic",
    "int8/token/dynamic",
    "int4_asym/group8/dynamic",
    "int8_asym/head/dynamic",
    "fp8_e4m3/tensor/dynamic+skip=0",
    "nvfp4",
    "mxfp4",
    "mxfp8_e4m3",
]
VLLM = [
    f"vllm:{name}"
    for name, d in VLLM_DTYPES.items()
    if d.status is Status.MODELLED and d.arch is not Arch.MLA and name not in ("fp8", "fp8_e4m3", "fp8_e5m2")
]
LLAMACPP = sorted({f"llamacpp:{c.name}" for c in LLAMACPP_CODECS if c.name not in ("f32", "f16", "bf16")})
SGLANG = ["sglang:mxfp8"]
MLA = ["fp8_e4m3/tensor/dynamic", "fp8_e4m3/group128/dynamic+rope=bf16", "vllm:fp8_ds_mla", "vllm:nvfp4_ds_mla"]


@pytest.fixture(autouse=True)
def small_growth_room(monkeypatch):
    monkeypatch.setattr(GrowingTensor, "CHUNK", 4)


@pytest.fixture(scope="module")
def models():
    return {"llama": llama_head64(kv_heads=2, layers=6, heads=4), "mla": ds_mla_512(), "gemma3": tiny_model("gemma3")}


@torch.inference_mode()
def decoded_cache(model, scheme):
    """A left-padded prefill, then STEPS one-token forwards, through the dynamic storage cache."""
    ids = torch.randint(3, 128, (B, PREFILL + STEPS), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    pos = position_ids(mask)
    with quantized_kv(model, scheme) as session:
        cache = session.new_cache(mask[:, :PREFILL])
        model.base_model(
            ids[:, :PREFILL],
            attention_mask=mask[:, :PREFILL],
            position_ids=pos[:, :PREFILL],
            **cache_inputs(model, cache),
        )
        for t in range(PREFILL, ids.shape[1]):
            model.base_model(
                ids[:, t : t + 1],
                attention_mask=mask[:, : t + 1],
                position_ids=pos[:, t : t + 1],
                **cache_inputs(model, cache),
            )
    return cache


def one_layer_kv(model, tokens: int) -> int:
    """The largest layer's K plus V (or latent plus RoPE key) for ``tokens`` tokens, in the model's dtype."""
    layout = kv_layout(model.config)
    width = (
        layout.mla_latent_dim + layout.mla_rope_dim
        if layout.is_mla
        else layout.num_kv_heads * (layout.head_dim + layout.v_head_dim)
    )
    return B * tokens * width * model.dtype.itemsize


def open_blocks(model, scheme) -> int:
    """Every layer's open-block tokens as they arrived (dynamic block scales only): N - 1 tokens each."""
    from evalkit.kv.scheme import GranularityKind, ScaleSource, parse_scheme

    s = parse_scheme(scheme)
    if s.granularity.kind is not GranularityKind.BLOCK or s.scales is not ScaleSource.DYNAMIC:
        return 0
    return kv_layout(model.config).num_layers * one_layer_kv(model, s.granularity.size - 1)


def check(model, scheme):
    cache = decoded_cache(model, scheme)
    held = sum(st.held_bytes() for layer in cache.storage_layers() for st in (layer.k, layer.v))
    engine = cache.nbytes()
    # an unquantized layer is counted at 2 bytes a value (a bf16 cache) but held in the model's dtype
    # (float32 here), as an engine serving in that dtype holds it
    widened = sum(
        st.held_bytes() - st.nbytes()
        for layer in cache.storage_layers()
        for st in (layer.k, layer.v)
        if not st.quantized
    )
    engine += widened
    bound = engine + one_layer_kv(model, PREFILL + STEPS) + open_blocks(model, scheme)
    assert engine <= held <= bound, (held, engine, bound)
    for layer in cache.storage_layers():  # nothing dequantized survives a forward
        for side, st in ((layer.keys, layer.k), (layer.values, layer.v)):
            assert st.quantized is False or side.numel() == 0


@pytest.mark.parametrize("scheme", KINDS)
def test_every_scheme_kind_holds_the_engine_bytes_plus_at_most_one_layer(models, scheme):
    check(models["llama"], scheme)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", VLLM + LLAMACPP + SGLANG)
def test_every_engine_codec_holds_the_engine_bytes_plus_at_most_one_layer(models, scheme):
    check(models["llama"], scheme)


@pytest.mark.parametrize("scheme", MLA)
def test_mla_holds_the_engine_bytes_plus_at_most_one_layer(models, scheme):
    check(models["mla"], scheme)


def test_sliding_window_layers_hold_the_window(models):
    check(models["gemma3"], "fp8_e4m3/token/dynamic")


def test_the_codec_lists_are_not_empty():
    assert len(VLLM) >= 10 and len(LLAMACPP) >= 6
