"""The quantization core against an independent per-group reference written with numpy and ml_dtypes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from evalkit.errors import SchemeError
from evalkit.kv.formats import FORMATS
from evalkit.kv.quantize import check_granularity, decode, dequantize, encode, quantize, quantize_dequantize
from evalkit.kv.scheme import Granularity, parse_scheme

TINY = np.finfo(np.float32).tiny  # the floor under every dynamic float32 scale
ML = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "fp8_e5m2": ml_dtypes.float8_e5m2}


def ref_group(x: np.ndarray, name: str) -> np.ndarray:
    """Quantize-dequantize one scale group, elementwise in float32, the obvious way."""
    fmt = FORMATS[name]
    x = x.astype(np.float32)
    if fmt.asymmetric:
        lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
        span = np.float32(hi) - np.float32(lo)
        scale = max(np.float32(span / np.float32(fmt.qmax)), TINY) if span > 0 else np.float32(1)
        zero = np.round(np.float32(-lo) / scale)
        codes = np.clip(np.round(x / scale) + zero, 0, fmt.qmax)
        return ((codes - zero) * scale).astype(np.float32)
    amax = np.float32(np.abs(x).max())
    scale = max(np.float32(amax / np.float32(fmt.qmax)), TINY) if amax > 0 else np.float32(1)
    y = np.clip(x / scale, -fmt.max, fmt.max).astype(np.float32)
    codes = y.astype(ML[name]).astype(np.float32) if fmt.kind == "float" else np.round(y)
    return (codes * scale).astype(np.float32)


def reference(x: np.ndarray, name: str, granularity: str) -> np.ndarray:
    g = Granularity.parse(granularity)
    out = np.empty_like(x)
    b, h, s, d = x.shape
    for i in range(b):
        if g.kind.value == "tensor":
            out[i] = ref_group(x[i], name)
            continue
        for j in range(h):
            if g.kind.value == "head":
                out[i, j] = ref_group(x[i, j], name)
            elif g.kind.value == "block":
                for t in range(0, s, g.size):
                    out[i, j, t : t + g.size] = ref_group(x[i, j, t : t + g.size], name)
            else:
                for t in range(s):
                    if g.kind.value == "token":
                        out[i, j, t] = ref_group(x[i, j, t], name)
                    else:
                        for c in range(0, d, g.size):
                            out[i, j, t, c : c + g.size] = ref_group(x[i, j, t, c : c + g.size], name)
    return out


FORMAT_NAMES = ["fp8_e4m3", "fp8_e4m3fnuz", "fp8_e5m2", "int8", "int8_asym", "int4", "int4_asym"]
GRANULARITIES = ["tensor", "head", "block4", "token", "group8"]


@pytest.mark.parametrize("name", FORMAT_NAMES)
@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_matches_independent_reference(name, granularity):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 3, 10, 16, generator=g) * torch.tensor([0.5, 4.0, 30.0]).reshape(1, 3, 1, 1)
    x[0, 1, 3] = 0.0  # an all-zero token
    ours = quantize_dequantize(x, FORMATS[name], Granularity.parse(granularity))
    ref = torch.from_numpy(reference(x.numpy(), name, granularity))
    assert torch.equal(ours, ref), f"max diff {(ours - ref).abs().max()}"


@pytest.mark.parametrize("name", FORMAT_NAMES)
@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_tiny_amax_matches_the_reference(name, granularity):
    """amax 1e-44 (amax / max underflows to 0 in float32) and 1e-40 (a subnormal quotient): the
    reference with its floor, bit for bit."""
    x = torch.zeros(2, 3, 10, 16)
    x[0, 0, 2, 3], x[0, 2, 7, 9], x[1, 1, 5, 0] = 1e-44, -1e-40, 3e-41
    ours = quantize_dequantize(x, FORMATS[name], Granularity.parse(granularity))
    assert torch.equal(ours, torch.from_numpy(reference(x.numpy(), name, granularity)))


TINY_SCHEMES = [f"{f}/{g}/dynamic" for f in FORMAT_NAMES for g in ["tensor", "head", "block16", "token", "group32"]] + [
    "fp4_e2m1/group16/dynamic",
    "nvfp4",
    "mxfp4",
    "mxfp8_e4m3",
    "sglang_fp4",
    "fp8_e4m3/group32/dynamic+scale_dtype=e8m0",
]


@pytest.mark.parametrize("scheme", TINY_SCHEMES)
@pytest.mark.parametrize("amax", [1e-44, 1e-45, 6e-43, 1e-40, 0.0])
def test_underflowing_amax_never_gives_nan(scheme, amax):
    """A group whose amax / max underflows float32 (below about 6e-43 for E4M3) would get scale 0 and
    store its zeros as 0 / 0 = NaN, unflagged: every scale is positive and finite instead, every value
    comes back within amax of itself (in practice 0), all-zero groups and blocks stay exactly 0 with
    scale 1, and nothing is flagged non-finite. Every granularity, every format, the MX/NVFP4 scales."""
    sch = parse_scheme(scheme)
    x = torch.zeros(1, 2, 40, 64)  # head 1, tokens 16..39 and every block but one stay all zero
    x[0, 0, 3, 5], x[0, 0, 20, 7] = amax, -amax / 2
    q = quantize(x, sch.kv_format, sch.granularity)
    back = dequantize(q)
    assert not bool(q.nonfinite) and bool(torch.isfinite(q.scale).all()) and bool((q.scale > 0).all())
    assert bool(torch.isfinite(back).all()) and float((back - x).abs().max()) <= float(x.abs().max())
    assert torch.equal(back[0, 1], torch.zeros(40, 64))  # an all-zero head: every block of it exactly 0
    if sch.granularity.kind.value in ("block", "token", "group") and sch.kv_format.scale_dtype.value == "fp32":
        zero_groups = q.scale[0, 1]
        assert bool((zero_groups == 1.0).all())  # an all-zero group keeps scale 1, as documented
    if sch.kv_format.scale_dtype.value == "fp32" and amax:
        assert float(q.scale.min()) >= np.finfo(np.float32).tiny


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2", "int8", "int4"])
def test_error_shrinks_with_finer_granularity(name):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 4, 64, 32, generator=g) * torch.exp(torch.randn(1, 4, 64, 1, generator=g))
    errors = [
        float(((quantize_dequantize(x, FORMATS[name], Granularity.parse(gr)) - x) ** 2).mean())
        for gr in ("tensor", "head", "token")
    ]
    assert errors[0] >= errors[1] >= errors[2] > 0


def test_static_scale_saturates_and_unit_scale_rounds():
    fmt = FORMATS["fp8_e4m3"]
    x = torch.tensor([1000.0, -1000.0, 0.3, 0.0]).reshape(1, 1, 1, 4)
    out = quantize_dequantize(x, fmt, Granularity.parse("tensor"), scale=torch.ones(1, 1, 1, 1))
    assert out.flatten().tolist() == [448.0, -448.0, 0.3125, 0.0]
    assert torch.isfinite(
        quantize_dequantize(x * 1e30, FORMATS["fp8_e5m2"], Granularity.parse("tensor"), scale=torch.ones(1, 1, 1, 1))
    ).all()


def test_padding_is_excluded_from_dynamic_scales():
    fmt = FORMATS["fp8_e4m3"]
    g = torch.Generator().manual_seed(0)
    real = torch.randn(1, 2, 8, 8, generator=g)
    pad = torch.full((1, 2, 3, 8), 1e4)  # huge padding values must not set the scale
    for gran in ("tensor", "head", "block4"):
        x = torch.cat([real, pad], dim=2)  # right padding: blocks still start at position 0
        valid = torch.tensor([[True] * 8 + [False] * 3])
        out = quantize_dequantize(x, fmt, Granularity.parse(gran), valid=valid)
        assert torch.equal(out[:, :, :8], quantize_dequantize(real, fmt, Granularity.parse(gran))), gran
        assert torch.isfinite(out).all()  # padding saturates at the real tokens' scale, it never turns inf


@pytest.mark.parametrize("name", FORMAT_NAMES)
@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_encoded_codes_decode_exactly_and_take_bits_per_element(name, granularity):
    fmt = FORMATS[name]
    x = torch.randn(2, 3, 10, 16, generator=torch.Generator().manual_seed(2)) * 5
    q = quantize(x, fmt, Granularity.parse(granularity))
    stored = encode(q.codes, fmt)
    assert torch.equal(decode(stored, fmt), q.codes)
    assert stored.numel() * stored.element_size() == x.numel() * fmt.bits // 8


def test_nonfinite_input_is_flagged_not_raised():
    fmt = FORMATS["fp8_e4m3"]
    x = torch.randn(1, 2, 4, 8)
    assert not bool(quantize(x, fmt, Granularity.parse("head")).nonfinite)
    x[0, 1, 2, 3] = float("nan")
    for gran in ("tensor", "head", "block2", "token", "group4"):
        assert bool(quantize(x, fmt, Granularity.parse(gran)).nonfinite), gran
    assert bool(quantize(x, fmt, Granularity.parse("tensor"), scale=torch.ones(1, 1, 1, 1)).nonfinite)
    x[0, 1, 2, 3] = float("inf")
    assert bool(quantize(x, FORMATS["int8_asym"], Granularity.parse("token")).nonfinite)


def test_identity_and_dtype():
    x = torch.randn(1, 2, 5, 8, dtype=torch.bfloat16)
    assert quantize_dequantize(x, FORMATS["auto"], Granularity.parse("tensor")) is x
    assert quantize_dequantize(x, FORMATS["fp8_e4m3"], Granularity.parse("head")).dtype == torch.bfloat16


def test_group_must_divide_head_dim():
    with pytest.raises(SchemeError, match="does not divide head_dim 64"):
        check_granularity(Granularity.parse("group48"), 64)


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e4m3fnuz", "fp8_e5m2"])
@pytest.mark.parametrize("shape", [(2, 3, 1, 64), (2, 3, 13, 64), (4, 8, 256, 64)])  # a decode token .. above SMALL
@pytest.mark.parametrize("granularity", ["tensor", "block16", "token"])
def test_the_stored_tensor_rounding_made_holds_the_bytes_encode_writes(name, shape, granularity):
    """Small FP8 tensors keep the float8 tensor their rounding cast produced (no second cast to store
    it); its bytes equal encode(codes) and decode back to the codes, also under a given scale."""
    from evalkit.kv.quantize import encode_quantized

    fmt = FORMATS[name]
    g = torch.Generator().manual_seed(7)
    x = torch.randn(*shape, generator=g) * 30
    x[0, 0, 0, :3] = torch.tensor([0.0, -0.0, 1e-9])
    for q in (
        quantize(x, fmt, Granularity.parse(granularity)),
        quantize(x, fmt, Granularity.parse(granularity), scale=torch.tensor(0.05)),
    ):
        assert (q.stored is not None) == (x.numel() <= 16384)
        stored = encode_quantized(q, fmt)
        assert stored.dtype == fmt.storage_dtype
        assert torch.equal(stored.view(torch.uint8), encode(q.codes, fmt).view(torch.uint8))
        assert torch.equal(decode(stored, fmt), q.codes)
