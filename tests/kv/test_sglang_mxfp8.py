"""SGLang's ``--kv-cache-dtype mxfp8`` (``sglang:mxfp8``): codes, scale bytes and values against a plain reading of
SGLang's kernel, the edge values, Q quantized alike, the stored bytes, the profile and the byte count.

The reference (:func:`reference_block`) is a per-value Python loop written from the kernel's text
(``_mxfp8_quant_store_qkv_kernel``, quoted in :mod:`evalkit.kv.codecs.sglang.mxfp8`): ``math.log2`` in double
precision for the exponent and the nearest E4M3 value found by search over a table built from the format's bit
fields, ties to the even code; nothing from evalkit's code path.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from evalkit.cli import main
from evalkit.engines.registry import get_profile
from evalkit.errors import SchemeError
from evalkit.kv.codec import codec_for, family_of
from evalkit.kv.codecs.sglang import mxfp8
from evalkit.kv.memory import bytes_per_token
from evalkit.kv.scheme import parse_scheme
from evalkit.models.info import kv_layout
from evalkit.models.presets import PRESETS, config_namespace

SCHEME = parse_scheme("sglang:mxfp8")
CODEC = codec_for(SCHEME.recipe)

# every finite non-negative E4M3 (fn) value by its byte: exponent field e (bias 7), mantissa m; 0x7F is NaN
E4M3 = [
    (b, (m / 8) * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)) for b in range(127) for e, m in [(b >> 3, b & 7)]
]


def e4m3_byte(y: float) -> int:
    """The E4M3 byte nearest ``y`` (|y| <= 448), ties to the even byte; the sign kept (a negative that rounds to
    zero is -0, 0x80, as a cast keeps the sign)."""
    a = abs(y)
    best = min(E4M3, key=lambda bv: (abs(a - bv[1]), bv[0] & 1))
    return best[0] | (0x80 if math.copysign(1.0, y) < 0 else 0)


def reference_block(x: list[float]) -> tuple[list[int], int, list[float]]:
    """One block of 32 float32 values -> (code bytes, scale byte, values read back), as the kernel computes them."""
    amax = max(max(abs(v) for v in x), float(np.float32(1e-30)))
    q = float(np.float32(amax) / np.float32(448.0))  # the float32 quotient
    exponent = math.ceil(math.log2(q)) if math.isfinite(q) else 10**6
    byte = min(max(exponent + 127, 0), 254)
    scale = 2.0 ** (byte - 127)
    codes = [e4m3_byte(min(max(v / scale, -448.0), 448.0)) for v in x]
    values = [math.copysign(dict(E4M3)[c & 0x7F], -1.0 if c & 0x80 else 1.0) * scale for c in codes]
    return codes, byte, values


def reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = x.float().reshape(-1, x.shape[-1]).tolist()
    codes, scales, values = [], [], []
    for row in rows:
        for i in range(0, len(row), 32):
            c, s, v = reference_block(row[i : i + 32])
            codes += c
            scales.append(s)
            values += v
    shape = x.shape
    return (
        torch.tensor(codes, dtype=torch.uint8).reshape(shape),
        torch.tensor(scales, dtype=torch.uint8).reshape(*shape[:-1], shape[-1] // 32),
        torch.tensor(values, dtype=torch.float32).reshape(shape),
    )


def edge_rows() -> torch.Tensor:
    """(1, 1, 8, 64) float32 rows: random magnitudes, zeros, +-448 exactly, amax exactly 448 * 2**k, E4M3 ties,
    tiny (float32 subnormal) and huge values."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 64, generator=g) * torch.logspace(-8, 4, 64)[torch.randperm(64, generator=g)]
    x[1, :32] = 0.0  # an all-zero block: amax floored to 1e-30, byte 19
    x[1, 32:] = -0.0
    x[2, :32] = torch.tensor([448.0, -448.0] + [1.0] * 30)  # scale byte 127, codes at the top
    x[2, 32:] = torch.tensor([896.0, 1.0625 * 2, 1.1875 * 2, 17.0 * 2, 19.0 * 2, -(1.0625 * 2)] + [0.01] * 26)  # ties
    x[3, :32] = 1e-40  # float32 subnormals, below the 1e-30 floor: byte 19, all scaled by 2**108
    x[3, 32:] = torch.linspace(-1, 1, 32) * 3e38  # near float32's top: byte 247
    x[4, :32] = 448.0 * 2.0**-20 * torch.linspace(-1, 1, 32)  # amax exactly 448 * 2**-20: byte 107
    x[4, 32:] = 1.0e-3 * torch.arange(32)
    x[5] = x[5].to(torch.bfloat16).float()
    return x[None, None]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_codes_scales_and_values_match_the_plain_reading_of_sglangs_kernel(dtype):
    x = edge_rows().to(dtype)
    codes, scales = mxfp8.encode(x)
    ref_codes, ref_scales, ref_values = reference(x)
    assert torch.equal(codes.view(torch.uint8), ref_codes)
    assert torch.equal(scales, ref_scales)
    assert torch.equal(mxfp8.decode(codes, scales), ref_values)


def test_the_edge_values_get_the_bytes_the_formula_gives():
    x = edge_rows()
    _, scales = mxfp8.encode(x)
    s = scales[0, 0]
    assert s[1].tolist() == [19, 19]  # ceil(log2(1e-30 / 448)) + 127 = -108 + 127
    assert s[2, 0] == 127 and s[4, 0] == 107  # amax 448 * 2**k: exponent k, not k + 1
    assert s[3].tolist() == [19, 247]
    assert s[2, 1] == 128  # 896 = 448 * 2
    codes, _ = mxfp8.encode(x[..., 2:3, 32:64])
    # 2.125/2 = 1.0625 ties between 1 and 1.125: to 1 (even); 1.1875 ties to 1.25; 17 ties to 16; 19 ties to 20
    assert mxfp8.decode(codes, torch.tensor([[[[128]]]], dtype=torch.uint8))[0, 0, 0, :6].tolist() == [
        896.0, 2.0, 2.5, 32.0, 40.0, -2.0
    ]  # fmt: skip
    inf = torch.tensor([float("inf")] + [1.0] * 31)
    codes, sb = mxfp8.encode(inf)
    assert sb.tolist() == [254] and codes.float()[0].item() == 448.0  # the byte clamp, then the value clamp


def test_not_ocp_mx_the_scale_rule_differs_from_mxfp8_e4m3():
    """OCP MX takes floor(log2(amax)) - 8, SGLang ceil(log2(amax / 448)): amax 500 gets 2**0 there (500 then
    saturates to 448) and 2**1 here (250 rounds to 256 in E4M3: 512)."""
    x = torch.tensor([500.0] + [1.0] * 31)
    codes, sb = mxfp8.encode(x)
    assert sb.tolist() == [128] and mxfp8.decode(codes, sb)[0].item() == 512.0
    from evalkit.kv.quantize import quantize_dequantize

    ocp = parse_scheme("mxfp8_e4m3")
    assert quantize_dequantize(x[None, None, None], ocp.kv_format, ocp.granularity)[0, 0, 0, 0].item() == 448.0


def test_q_is_quantized_by_the_same_rule_and_read_back_in_its_dtype():
    q = edge_rows()[..., :3, :].to(torch.bfloat16).float()
    _, _, ref_values = reference(q)
    assert torch.equal(mxfp8.round_query(q), ref_values)
    qb = q.to(torch.bfloat16)
    out = mxfp8.round_query(qb)
    assert out.dtype == torch.bfloat16 and torch.equal(out.float(), ref_values)  # exact in BF16
    assert torch.equal(mxfp8.round_query(out), out)  # MXFP8 values come back bit for bit
    assert family_of(SCHEME.recipe).query_rounding(SCHEME) is mxfp8.round_query


def test_the_stored_slot_reads_back_and_counts_head_dim_plus_one_byte_per_32():
    x = edge_rows()
    for role in ("k", "v"):
        q = CODEC.encode(x, role)
        assert q.stored.shape[-1] == CODEC.width(role, 64) == 64 + 2
        assert torch.equal(CODEC.decode(q.stored, role, 64), q.values)
        codes, sb, values = reference(x)
        assert torch.equal(q.stored, torch.cat([codes, sb], dim=-1)) and torch.equal(q.values, values)
    assert bool(CODEC.encode(torch.full((1, 1, 1, 32), float("nan")), "k").nonfinite)


def test_bytes_per_token_and_the_profile():
    layout = kv_layout(config_namespace(PRESETS["llama-3.1-8b"]["config"]))
    assert bytes_per_token(layout, SCHEME) == 32 * 8 * 2 * (128 + 4) == 67_584
    sglang = get_profile("sglang")
    assert sglang.kv_cache_dtype_of(SCHEME) == "mxfp8"
    assert sglang.dtype("auto").format is None  # auto stays the model's dtype


def test_refused_in_one_line_where_sglang_would_not_store_it():
    family = family_of(SCHEME.recipe)
    with pytest.raises(SchemeError, match=r"head_dim % 32 == 0.*this model's is 80"):
        family.check_layout(SCHEME, False, (80, 80))
    with pytest.raises(SchemeError, match="multi-head latent attention is not modelled"):
        family.check_layout(SCHEME, True, (512, 64))
    with pytest.raises(SchemeError, match="use sglang:mxfp8"):
        parse_scheme("sglang:nvfp4")


def test_schemes_lists_mxfp8_with_its_source_line(capsys):
    assert main(["schemes", "--engine-profile", "sglang"]) == 0
    out = capsys.readouterr().out
    assert "mxfp8            sglang:mxfp8" in out and "mxfp8_quant.py:98-163" in out


def test_attention_reads_q_rounded_and_bf16_is_untouched(monkeypatch):
    """On a tiny llama (head_dim 64): sglang:mxfp8 hands attention the MXFP8-rounded Q on its quantized layers
    (only those), which moves the logits; bf16 reproduces the model bit for bit."""
    from evalkit.integration.install import quantized_kv

    from tests.tiny_models import llama_head64

    model = llama_head64(layers=2).to(torch.bfloat16)
    ids = torch.arange(1, 30)[None]
    with torch.inference_mode():
        plain = model(input_ids=ids).logits
        for dtype in ("auto", "bf16"):  # SGLang's unquantized dtypes
            with quantized_kv(model, get_profile("sglang").scheme_for(dtype)):
                assert torch.equal(model(input_ids=ids).logits, plain)
        seen = []
        original = mxfp8.round_query

        def spy(query):
            seen.append(query.shape)
            return original(query)

        monkeypatch.setattr(mxfp8, "round_query", spy)
        with quantized_kv(model, parse_scheme("sglang:mxfp8+skip=0")):
            rounded = model(input_ids=ids).logits
        assert len(seen) == 1 and seen[0][-1] == 64  # layer 1 only: layer 0 is skipped
        monkeypatch.setattr(mxfp8, "round_query", lambda query: query)
        with quantized_kv(model, parse_scheme("sglang:mxfp8+skip=0")):
            unrounded = model(input_ids=ids).logits
    assert not torch.equal(rounded, unrounded)
    assert (rounded.float() - plain.float()).abs().max() < 0.5  # an 8-bit cache and Q: close to the model, not equal


def test_the_storage_cache_holds_sglangs_bytes_through_prefill_and_decode():
    """A left-padded prefill and one-token steps through the storage cache: every real token's layer-0 K and V are
    the plain reference's values, read back from the bytes held, and the cache holds 64 + 2 bytes per value row."""
    from tests.integration.test_storage import PREFILL, inputs, teacher_forced
    from tests.tiny_models import llama_head64

    model = llama_head64(kv_heads=2, layers=2, heads=4)
    ids, mask = inputs()
    raw = teacher_forced(model, "auto", ids, mask).layers[0]
    cache = teacher_forced(model, "sglang:mxfp8", ids, mask)
    real = mask.bool()[:, None, :, None]
    for got, want in ((cache.layers[0].k, raw.k.values), (cache.layers[0].v, raw.v.values)):
        expected = reference(want.float())[2]
        r = real.expand_as(got.values)
        assert torch.equal(got.values.float()[r], expected[r]) and PREFILL < ids.shape[1]
        assert torch.equal(got.decoded()[r], got.values.float()[r])
    per_layer_side = ids.shape[0] * 2 * ids.shape[1] * (64 + 2)  # sequences x KV heads x tokens x slot bytes
    assert cache.layers[0].k.nbytes() == per_layer_side and cache.nbytes() == 2 * 2 * per_layer_side
