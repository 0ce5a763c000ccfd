"""The storage path on CUDA (marked ``gpu``; skipped without a CUDA device): the same checks as on
the CPU, plus what only a GPU can show (every kept tensor on the device, no host synchronisation
per layer under torch's sync debug mode, CUDA's float8 cast equal to the emulation)."""

from __future__ import annotations

import pytest
import torch

from evalkit import quantized_kv
from evalkit.integration.hf_compat import cache_inputs, output_cache

from tests.tiny_models import tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SCHEMES = [
    "fp8_e4m3/tensor/dynamic",
    "fp8_e4m3/head/dynamic",
    "fp8_e4m3/block16/dynamic",
    "fp8_e4m3/token/dynamic",
    "fp8_e4m3/tensor/unit",
    "fp8_e4m3/head/unit",
    "int4_asym/group8/dynamic",
    "fp8_e4m3/head/dynamic+attn=fa3",
]


def batch(device):
    ids = torch.randint(3, 128, (2, 24), generator=torch.Generator().manual_seed(0)).to(device)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    return ids, mask


@pytest.fixture(scope="module")
def llama_bf16():
    return tiny_model("llama").to("cuda", torch.bfloat16)


@torch.no_grad()
def test_identity_is_bit_exact_in_bf16_on_cuda(llama_bf16):
    ids, mask = batch("cuda")
    ref = llama_bf16(ids, attention_mask=mask).logits
    gen = llama_bf16.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    with quantized_kv(llama_bf16, "auto"):
        assert torch.equal(llama_bf16(ids, attention_mask=mask).logits, ref)
        assert torch.equal(llama_bf16.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False), gen)


@torch.no_grad()
@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_runs_on_cuda_with_tensors_on_the_device(llama_bf16, scheme):
    ids, mask = batch("cuda")
    with quantized_kv(llama_bf16, scheme) as session:
        cache = session.new_cache(mask)
        llama_bf16.generate(
            ids, attention_mask=mask, max_new_tokens=6, do_sample=False, **cache_inputs(llama_bf16, cache)
        )
    for layer in cache.storage_layers():
        for st in (layer.k, layer.v):
            for t in (st.codes, st.values, st.scale, st.zero, st.fixed, st.nonfinite):
                if t is not None:
                    assert t.device.type == "cuda"
            real = mask.bool()[:, None, :, None]
            n = st.values.shape[2]
            full = torch.cat([real, torch.ones(2, 1, n - real.shape[2], 1, dtype=torch.bool, device="cuda")], dim=2)
            full = full.expand_as(st.values)
            assert torch.equal(st.decoded().to(st.values.dtype)[full], st.values[full])


@torch.no_grad()
@pytest.mark.parametrize("scheme", ["fp8_e4m3/tensor/dynamic", "fp8_e4m3/block16/dynamic", "fp8_e4m3/head/unit"])
def test_no_host_synchronisation_in_a_decode_step(llama_bf16, scheme):
    ids, _ = batch("cuda")
    with quantized_kv(llama_bf16, scheme):
        cache = output_cache(llama_bf16(ids))
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for layer in cache.storage_layers():  # the per-layer write path alone, as a decode step runs it
                layer.update(layer.k.values[:, :, -1:], layer.v.values[:, :, -1:])
        finally:
            torch.cuda.set_sync_debug_mode("default")


def test_cuda_float8_cast_equals_the_emulation():
    from evalkit.kv.formats import FORMATS
    from evalkit.kv.rounding import round_to_fp8_by_cast, round_to_fp8_emulated

    g = torch.Generator(device="cuda").manual_seed(1)
    for name in ("fp8_e4m3", "fp8_e4m3fnuz", "fp8_e5m2"):
        fmt = FORMATS[name]
        x = (torch.randn(2**20, device="cuda", generator=g) * 50).clamp(-fmt.max, fmt.max)
        assert torch.equal(
            round_to_fp8_by_cast(x, fmt).view(torch.int32), round_to_fp8_emulated(x, fmt).view(torch.int32)
        )
