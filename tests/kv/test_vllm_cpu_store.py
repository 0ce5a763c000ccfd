"""``+recipe=vllm_cpu``: evalkit's quantizer against a plain numpy reading of vLLM's CPU FP8 store
(``csrc/cpu/cpu_attn_fp8.hpp``: ``float_to_fp8e4m3_scalar``, ``float_to_fp8e5m2_scalar``), byte for byte,
on every E4M3/E5M2 value and its float32 neighbours, the midpoints, the subnormal range, ±0, float32
subnormal inputs and random values, at scales 1, 1/16 and 0.0371 (no vLLM needed; the vLLM-env test
tests/engines/test_vllm_kernel.py holds the same quantizer against the real op)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from evalkit.engines.vllm import kernel_conformance as kc
from evalkit.engines.vllm import kernel_inputs as ki
from evalkit.errors import SchemeError
from evalkit.kv.scheme import parse_scheme


def _e4m3(v: np.ndarray, inv: np.float32) -> np.ndarray:
    v = (v.astype(np.float32) * inv).astype(np.float32)
    v = np.maximum(np.float32(-448), np.minimum(np.float32(448), v))
    with np.errstate(under="ignore"):
        bits = (v * np.float32(2.0**-120)).astype(np.float32).view(np.uint32)
    sign = ((bits >> 24) & 0x80).astype(np.uint8)
    payload = np.minimum((bits >> 20) & 0x7F, 0x7E).astype(np.uint8)
    return np.where(v == 0, 0, np.where(payload == 0, sign, sign | payload)).astype(np.uint8)


def _e5m2(v: np.ndarray, inv: np.float32) -> np.ndarray:
    v = (v.astype(np.float32) * inv).astype(np.float32)
    v = np.maximum(np.float32(-57344), np.minimum(np.float32(57344), v))
    bits = v.view(np.uint32)
    sign = ((bits >> 24) & 0x80).astype(np.uint8)
    exp = ((bits >> 23) & 0xFF).astype(np.int64) - 127
    mant2 = ((bits >> 21) & 0x3).astype(np.uint8)
    shift = -14 - exp
    m = ((0x800000 | (bits & 0x7FFFFF)).astype(np.uint64) >> np.clip(shift + 21, 0, 63).astype(np.uint64)).astype(
        np.int64
    )
    sub = np.where(shift + 21 >= 32, sign, sign | np.minimum(m, 3).astype(np.uint8))
    normal = sign | (((exp + 15) & 0x1F).astype(np.uint8) << 2) | mant2
    return np.where(v == 0, 0, np.where(exp < -14, sub, normal)).astype(np.uint8)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("scale", ki.DEFAULT_SCALES)
def test_codes_equal_a_reading_of_vllms_cpu_store(fmt, scale):
    scale = ki.f32(scale)
    tiny = torch.tensor([1e-45, -1e-45, 1.1754942e-38, -1.1754942e-38, -0.0, 0.0])
    x = torch.cat(
        [ki.values_for(ki.edge_values(fmt), scale), tiny, (ki.random_values((128, 3, 96), 5) * scale).flatten()]
    )
    table, n = ki.as_table(x, 3, 96)
    ours = kc.evalkit_codes(table, scale, fmt, kc.VLLM_CPU).flatten()[:n].view(torch.uint8).numpy()
    inv = np.float32(1) / np.float32(scale)
    ref = (_e4m3 if fmt == "fp8_e4m3" else _e5m2)(x.numpy(), inv)
    differ = np.nonzero(ours != ref)[0]
    assert differ.size == 0, [(float(x[i]), int(ours[i]), int(ref[i])) for i in differ[:5]]
    plain = kc.evalkit_codes(table, scale, fmt, "rtz").flatten()[:n].view(torch.uint8).numpy()
    assert (plain != ref).sum() > 0  # plain rtz is not the store on this table: the recipe is what models it


def test_the_recipe_is_spelled_parsed_back_and_refused_where_it_does_not_apply():
    s = parse_scheme("fp8_e4m3/tensor/static+scales=t.safetensors+rounding=rtz+recipe=vllm_cpu")
    assert str(s) == "fp8_e4m3/tensor/static+recipe=vllm_cpu+scales=t.safetensors+rounding=rtz"
    assert parse_scheme(str(s)) == s
    for bad in ("fp8_e4m3/tensor/unit+recipe=vllm_cpu", "int8/tensor/unit+recipe=vllm_cpu+rounding=rtz"):
        with pytest.raises(SchemeError, match="recipe=vllm_cpu is vLLM's CPU FP8 store"):
            parse_scheme(bad)
    assert str(parse_scheme("fp8_e4m3/tensor/unit+rounding=rtz")) == "fp8_e4m3/tensor/unit+rounding=rtz"  # unchanged
