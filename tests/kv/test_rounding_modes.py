"""Rounding modes (``+rounding=rne|rtz|rna``) for every format, bit for bit against an independent reference.

The reference knows nothing of evalkit's rounding: it takes the full table of each float format's
finite values from ml_dtypes (every bit pattern decoded), and for each input picks the neighbour
by plain float64 logic: toward zero (the lower magnitude), to nearest with ties away from zero
(the upper) or ties to even (the one whose code is even), after saturating at the largest value.
Integer codes: ``np.trunc``, ``floor(|x| + 0.5)`` and ``np.round`` in float64, then clamped.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

from evalkit.kv import microscaling as mx
from evalkit.kv.formats import FORMATS, FormatKind
from evalkit.kv.quantize import decode, dequantize, encode, encode_quantized, quantize, round_codes
from evalkit.kv.rounding import SMALL, Rounding, round_integer, round_to_fp8, round_to_fp8_by_cast, round_to_grid
from evalkit.kv.scheme import Granularity, GranularityKind, parse_scheme

ROOT = Path(__file__).resolve().parents[2]
FLOATS = {
    "fp8_e4m3": ml_dtypes.float8_e4m3fn,
    "fp8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "fp8_e5m2": ml_dtypes.float8_e5m2,
    "fp4_e2m1": ml_dtypes.float4_e2m1fn,
}
INTS = ["int8", "int8_asym", "int4", "int4_asym"]
MODES = list(Rounding)
F32 = np.float32


# -- the independent reference --------------------------------------------------------------------
def positive_table(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(magnitudes ascending as float64, their codes) of every finite non-negative value of the format."""
    dtype = FLOATS[name]
    n = 2 ** FORMATS[name].bits  # every code: float4_e2m1fn holds one per byte
    codes = np.arange(n, dtype=np.uint8)
    values = codes.view(dtype)  # float4_e2m1fn too: one code per byte
    values = values.astype(np.float64)
    keep = np.isfinite(values) & ~np.signbit(values)
    values, codes = values[keep], codes[keep].astype(np.int64)
    order = np.argsort(values, kind="stable")
    values, codes = values[order], codes[order]
    assert np.all(np.diff(values) > 0), "one code per magnitude"
    return values, codes


def reference_float(x: np.ndarray, name: str, mode: Rounding) -> np.ndarray:
    """Round float32 ``x`` to the format by ``mode`` with plain neighbour search, saturating; float32 out."""
    values, codes = positive_table(name)
    x = x.astype(np.float32).astype(np.float64)
    m = np.minimum(np.abs(x), values[-1])  # saturate (NaN stays NaN here and is put back below)
    m_safe = np.where(np.isnan(m), 0.0, m)
    lo_i = np.searchsorted(values, m_safe, side="right") - 1  # values[lo_i] <= m
    hi_i = np.minimum(lo_i + 1, len(values) - 1)
    lo, hi = values[lo_i], values[hi_i]
    below, above = m_safe - lo, hi - m_safe  # exact in float64
    if mode is Rounding.RTZ:
        r = lo
    else:
        tie = hi if mode is Rounding.RNA else np.where(codes[lo_i] % 2 == 0, lo, hi)
        r = np.where(below < above, lo, np.where(above < below, hi, tie))
    r = np.where(below == 0, lo, r)
    r = np.copysign(r, x)
    if name == "fp8_e4m3fnuz":
        r = np.where(r == 0, 0.0, r)  # no negative zero
    return np.where(np.isnan(x), np.nan, r).astype(np.float32)


def reference_int(y: np.ndarray, mode: Rounding) -> np.ndarray:
    y = y.astype(np.float32).astype(np.float64)
    if mode is Rounding.RTZ:
        return np.trunc(y)
    if mode is Rounding.RNA:
        return np.copysign(np.floor(np.abs(y) + 0.5), y)
    return np.round(y)  # half to even


def bits(t) -> np.ndarray:
    a = t.numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    a = a.astype(np.float32)
    a = np.where(np.isnan(a), np.float32(np.nan), a)  # one NaN pattern: the sign of NaN is not compared
    return a.view(np.uint32)


def assert_bits(ours, ref, what: str) -> None:
    o, r = bits(ours), bits(ref)
    bad = np.nonzero(o != r)[0]
    if bad.size:
        i = bad[0]
        raise AssertionError(
            f"{what}: {bad.size} of {o.size} differ, first at {i}: "
            f"ours {o.view(np.float32)[i]!r} vs reference {r.view(np.float32)[i]!r}"
        )


def fmt_of(name: str, mode: Rounding):
    return FORMATS[name].with_rounding(mode)


# -- inputs ---------------------------------------------------------------------------------------
def edge_inputs(name: str) -> np.ndarray:
    """Every value, every midpoint between neighbours, one float32 ulp either side of both, the
    subnormals, ±0, values above max up to inf, float32 subnormals, NaN; both signs."""
    values, _ = positive_table(name)
    mids = (values[:-1] + values[1:]) / 2
    top = values[-1]
    spacing = values[-1] - values[-2]
    beyond = [top + spacing / 2, top + spacing, top * 1.0001, top * 2, 3e38, np.inf]
    pts = np.concatenate([values, mids, beyond, [2.0**-149, 2.0**-126, 1e-30]]).astype(np.float32)
    pts = np.concatenate([pts, np.nextafter(pts, F32(np.inf)), np.nextafter(pts, F32(0))])
    out = np.concatenate([pts, -pts, [np.nan, -np.nan, 0.0, -0.0]]).astype(np.float32)
    return out


def random_inputs(seed: int, n: int, scale: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * np.exp(rng.standard_normal(n) * 4) * scale
    return x.astype(np.float32)


# -- every float format x mode, bit for bit ----------------------------------------------------------
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("name", list(FLOATS))
def test_edge_table_matches_reference(name, mode):
    x = edge_inputs(name)
    fmt = fmt_of(name, mode)
    ref = reference_float(x, name, mode)
    assert_bits(round_codes(torch.from_numpy(x), fmt), ref, f"{name} {mode.value} round_codes")
    assert_bits(round_to_grid(torch.from_numpy(x), fmt), ref, f"{name} {mode.value} round_to_grid")
    assert x.size > (100 if FORMATS[name].bits < 8 else 1500)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("name", list(FLOATS))
def test_large_random_tensors_match_reference(name, mode):
    fmt = fmt_of(name, mode)
    x = random_inputs(7 + MODES.index(mode), 1_000_000, FORMATS[name].max / 20)
    assert_bits(round_codes(torch.from_numpy(x), fmt), reference_float(x, name, mode), f"{name} {mode.value}")


def test_the_modes_differ_where_they_should():
    # E4M3 around 1: spacing 1/8, so 1 + 1/16 is a tie, 1 + 3/32 lies between tie and next value
    x = torch.tensor([1 + 1 / 16, 1 + 3 / 16, 1 + 3 / 32, -(1 + 1 / 16), 1 + 1 / 32, 500.0, -1e-9])
    e4m3 = FORMATS["fp8_e4m3"]
    assert round_to_grid(x, e4m3, Rounding.RNE).tolist() == [1.0, 1.25, 1.125, -1.0, 1.0, 448.0, -0.0]
    assert round_to_grid(x, e4m3, Rounding.RTZ).tolist() == [1.0, 1.125, 1.0, -1.0, 1.0, 448.0, -0.0]
    assert round_to_grid(x, e4m3, Rounding.RNA).tolist() == [1.125, 1.25, 1.125, -1.125, 1.0, 448.0, -0.0]
    assert math.copysign(1, round_to_grid(x, e4m3, Rounding.RTZ)[-1].item()) == -1


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_saturation_nan_and_zero_signs(mode):
    for name in FLOATS:
        fmt = fmt_of(name, mode)
        out = round_codes(torch.tensor([math.inf, -math.inf, 1e30, math.nan, -0.0, 0.0, -1e-30]), fmt)
        top = FORMATS[name].max
        assert out[:3].tolist() == [top, -top, top] and math.isnan(out[3].item()), name
        signs = [math.copysign(1, v) for v in out[4:].tolist()]
        assert signs == ([1, 1, 1] if name == "fp8_e4m3fnuz" else [-1, 1, -1]), name
    # E5M2 has inf: it is never produced, the value saturates first
    assert torch.isfinite(round_codes(torch.tensor([6e4, 1e6, math.inf]), fmt_of("fp8_e5m2", mode))).all()


def test_rtz_truncates_between_max_and_the_next_would_be_value():
    e4m3 = fmt_of("fp8_e4m3", Rounding.RTZ)
    assert round_codes(torch.tensor([448.0, 463.9, 479.9, 480.0, 1e4]), e4m3).tolist() == [448.0] * 5
    rne = round_codes(torch.tensor([463.9, 464.0]), FORMATS["fp8_e4m3"])
    assert rne.tolist() == [448.0, 448.0]  # saturating nearest even, as before


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e4m3fnuz", "fp8_e5m2"])
def test_rne_is_torchs_cast_as_before(name):
    fmt = FORMATS[name]
    assert fmt.rounding is Rounding.RNE
    x = torch.from_numpy(random_inputs(3, 500_000, fmt.max / 10)).clamp(-fmt.max, fmt.max)
    cast = round_to_fp8_by_cast(x, fmt)
    assert torch.equal(round_to_fp8(x, fmt).view(torch.int32), cast.view(torch.int32))
    assert torch.equal(round_to_grid(x, fmt).view(torch.int32), cast.view(torch.int32))
    small = x[:100]  # a decode-sized tensor: rounded by the cast itself, whose float8 tensor is stored
    q = quantize(small.reshape(1, 1, 1, -1), fmt, Granularity(GranularityKind.TENSOR), scale=torch.ones(1, 1, 1, 1))
    assert torch.equal(q.codes.flatten().view(torch.int32), round_to_fp8_by_cast(small, fmt).view(torch.int32))
    assert q.stored is not None and torch.equal(
        q.stored.flatten().view(torch.uint8), small.to(fmt.torch_dtype).view(torch.uint8)
    )


# -- integer formats --------------------------------------------------------------------------------
def int_edges() -> np.ndarray:
    k = np.arange(-300, 301, dtype=np.float64)
    pts = np.concatenate([k, k + 0.5, k - 0.5, k + 0.25, [1e9, -1e9, 2.0**24 + 2, 0.49999997, -0.49999997]])
    pts = pts.astype(np.float32)
    return np.concatenate([pts, np.nextafter(pts, F32(np.inf)), np.nextafter(pts, F32(-np.inf)), [np.nan, -0.0]])


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("name", INTS)
def test_integer_codes_follow_the_mode(name, mode):
    fmt = fmt_of(name, mode)
    for y in (int_edges(), random_inputs(11, 200_000, 20.0)):
        ref = np.clip(reference_int(y, mode), fmt.qmin, fmt.qmax).astype(np.float32)
        if not fmt.asymmetric:
            assert_bits(round_codes(torch.from_numpy(y), fmt), ref, f"{name} {mode.value}")
        assert_bits(round_integer(torch.from_numpy(y), mode), reference_int(y, mode), f"round_integer {mode.value}")


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_asymmetric_codes_round_x_over_scale_and_keep_a_nearest_even_zero_point(mode):
    fmt = fmt_of("int8_asym", mode)
    x = torch.from_numpy(random_inputs(5, 4 * 64, 1.0)).reshape(1, 2, 2, 64)
    q = quantize(x, fmt, Granularity(GranularityKind.TOKEN))
    y = (x / q.scale).numpy()
    zero = q.zero.numpy()
    assert np.array_equal(zero, np.round(zero))  # zero points are integers, as before
    ref = np.clip(reference_int(y, mode) + zero, 0, fmt.qmax).astype(np.float32)
    assert_bits(q.codes, ref, f"int8_asym {mode.value}")
    rne = quantize(x, FORMATS["int8_asym"], Granularity(GranularityKind.TOKEN))
    assert torch.equal(rne.zero, q.zero) and torch.equal(rne.scale, q.scale)


# -- what the cache stores ---------------------------------------------------------------------------
SCHEMES = [
    "fp8_e4m3/tensor/dynamic",
    "fp8_e4m3/head/unit",
    "fp8_e5m2/tensor/unit",
    "fp8_e4m3fnuz/token/dynamic",
    "fp8_e4m3/block16/dynamic",
    "fp4_e2m1/group16/dynamic",
    "fp8_e4m3/group32/dynamic+scale_dtype=e8m0",
    "fp4_e2m1/group32/dynamic+scale_dtype=e8m0",
    "fp4_e2m1/group16/dynamic+scale_dtype=e4m3+tensor_scale=fp32",
]


def float_name(scheme) -> str:
    return scheme.format


@pytest.mark.parametrize("mode", [Rounding.RTZ, Rounding.RNA], ids=lambda m: m.value)
@pytest.mark.parametrize("text", SCHEMES)
def test_quantize_stores_the_modes_codes(text, mode):
    """quantize()'s codes and stored bytes (the cache's) are the reference rounding of x / scale,
    for small tensors (a decode token: no cast shortcut) and large ones; the scales are those of rne."""
    scheme = parse_scheme(f"{text}+rounding={mode.value}")
    assert str(scheme).endswith(f"+rounding={mode.value}") and scheme.name is None
    fmt = scheme.kv_format
    assert fmt.rounding is mode
    base = parse_scheme(text).kv_format
    g = torch.Generator().manual_seed(2)
    for shape in ((1, 2, 1, 64), (2, 4, 160, 64)):  # 128 and 81,920 elements: below and above SMALL
        x = torch.randn(*shape, generator=g) * torch.exp(torch.randn(*shape, generator=g))
        scale = torch.ones(1, 1, 1, 1) if scheme.scales.value == "unit" else None
        q = quantize(x, fmt, scheme.granularity, scale=scale)
        q_rne = quantize(x, base, scheme.granularity, scale=scale)
        assert torch.equal(q.scale, q_rne.scale)
        y = dequantize_ratio(x, q)
        ref = reference_float(y, float_name(scheme), mode)
        assert_bits(q.codes, ref, f"{text} {mode.value} {shape}")
        stored = encode_quantized(q, fmt)
        assert q.stored is None  # the cast shortcut is nearest-even only
        assert torch.equal(decode(stored, fmt), q.codes) and torch.equal(stored, encode(q.codes, fmt))
        if not fmt.packed:  # the float8 bytes are ml_dtypes' bytes of the reference values
            assert np.array_equal(stored.view(torch.uint8).numpy(), ref.astype(FLOATS[scheme.format]).view(np.uint8))
    assert shape[0] * shape[1] * shape[2] * shape[3] > SMALL


def dequantize_ratio(x: torch.Tensor, q) -> np.ndarray:
    """x / scale broadcast as the quantizer divides (float32), for any granularity."""
    ones = type(q)(torch.ones_like(q.codes), q.scale, q.zero, q.granularity, q.nonfinite)
    scale = dequantize(ones)  # the scale of every element, laid out like x
    return (x.float() / scale).numpy()


def test_storage_cache_threads_the_rounding():
    """BoundScheme hands StoredTensor the format with its rounding: the stored bytes follow the mode."""
    from evalkit.integration.binding import BoundScheme
    from evalkit.integration.stored import StoredTensor
    from evalkit.models.info import KVLayout

    layout = KVLayout("llama", 2, 2, 64, 64, (), None, 4096)
    x = torch.randn(1, 2, 40, 64, generator=torch.Generator().manual_seed(4)) * 50
    for text, mode in (("fp8_e4m3/tensor/unit+rounding=rtz", Rounding.RTZ), ("fp8_e4m3/tensor/unit", Rounding.RNE)):
        bound = BoundScheme(parse_scheme(text), layout)
        assert bound.fmt.rounding is mode
        st = StoredTensor(bound.fmt, bound.scheme.granularity, bound.fixed_scale("k", 0, x.device), True)
        st.append(x[:, :, :39])
        st.append(x[:, :, 39:])  # a decode step: small, once the cast path
        ref = reference_float(x.numpy(), "fp8_e4m3", mode)
        assert np.array_equal(st.codes.view(torch.uint8).numpy(), ref.astype(ml_dtypes.float8_e4m3fn).view(np.uint8))
        assert_bits(st.values, ref, text)


# -- sglang_fp4: one option owns rounding, and its numbers are unchanged -------------------------------
_SGLANG_TIE_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def sglang_thresholds(v: torch.Tensor) -> torch.Tensor:
    """SGLang's element rule as evalkit computed it before rounding was an option: the magnitude index
    is how many of the thresholds |v| reaches, the sign is v < 0, NaN stays NaN."""
    index = torch.bucketize(v.abs().contiguous(), torch.tensor(_SGLANG_TIE_BOUNDS), right=True)
    magnitude = torch.tensor(_E2M1)[index]
    out = torch.where(v < 0, -magnitude, magnitude)
    return out.masked_fill_(torch.isnan(v), float("nan"))


def test_sglang_fp4_is_the_sglang_scale_rule_plus_rna():
    s = parse_scheme("sglang_fp4")
    assert s.rounding is Rounding.RNA and s.recipe.value == "sglang" and str(s) == "sglang_fp4"
    assert parse_scheme("fp4_e2m1/group16/dynamic+scale_dtype=e8m0+recipe=sglang+rounding=rna") == s
    plain = parse_scheme("fp4_e2m1/group16/dynamic+scale_dtype=e8m0+recipe=sglang")
    assert plain.rounding is Rounding.RNE and plain.name is None and str(plain).endswith("recipe=sglang")


def test_sglang_fp4_numbers_are_unchanged():
    """Codes, scales and bytes of sglang_fp4 equal the threshold rule on edge values and random K/V."""
    fmt = parse_scheme("sglang_fp4").kv_format
    edges = torch.tensor(
        [
            0.25,
            0.75,
            1.25,
            1.75,
            2.5,
            3.5,
            5.0,
            5.5,
            6.0,
            7.0,
            math.inf,
            -0.0,
            0.0,
            -0.1,
            -0.25,
            -2.5,
            -5.0,
            math.nan,
            1e-40,
            -1e-40,
            0.2499999,
            0.2500001,
            4.9999995,
        ]
    )
    assert_bits(mx.round_to_e2m1(edges, Rounding.RNA), sglang_thresholds(edges).abs().copysign(edges), "rna")
    assert_bits(mx.sglang_zero_sign(edges, mx.round_to_e2m1(edges, Rounding.RNA)), sglang_thresholds(edges), "sign")
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 3, 33, 64, generator=g) * torch.exp(torch.randn(2, 3, 33, 1, generator=g) * 2)
    x[0, 0, 0, :16] = torch.tensor(
        [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, -5.0, 0.1, -0.1, 0.0, -0.0, 4.0]
    )
    q = quantize(x, fmt, Granularity(GranularityKind.GROUP, 16))
    amax = x.reshape(2, 3, 33, 4, 16).abs().amax(-1, keepdim=True)
    scale = mx.sglang_e8m0_scale(amax)
    assert torch.equal(q.scale, scale.squeeze(-1))
    expected = sglang_thresholds(x.reshape(2, 3, 33, 4, 16) / scale).reshape(x.shape)
    assert_bits(q.codes, expected, "sglang_fp4 codes")
    codes = expected.numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    codes = np.where(expected.numpy() == 0, np.where(np.signbit(expected.numpy()), 8, 0), codes)
    assert np.array_equal(encode_quantized(q, fmt).numpy(), codes[..., 0::2] | (codes[..., 1::2] << 4))


# -- canonical strings and run ids ----------------------------------------------------------------------
def test_published_store_and_grids_keep_their_scheme_strings():
    """rne is never written (another rounding always is), so every stored run's and grid's scheme string
    (part of its run id) parses back to itself."""
    import yaml

    records = [
        json.loads(line)
        for line in (ROOT / "published" / "default" / "results.jsonl").read_text().splitlines()
        if line.strip()
    ]
    texts = {r["spec"]["scheme"] for r in records if r.get("spec")}
    for grid in sorted((ROOT / "sweeps").glob("*.yaml")):  # the grids' scheme strings as written
        texts |= {
            str(parse_scheme(t)) for t in yaml.safe_load(grid.read_text()).get("schemes", []) if isinstance(t, str)
        }
    assert len(texts) > 10
    for text in texts:
        scheme = parse_scheme(text)
        assert str(scheme) == text and "rounding=rne" not in text
        assert ("+rounding=" in text) == (scheme.rounding is not Rounding.RNE)


def test_a_different_rounding_is_a_different_run():
    from evalkit.sweep.grid import ModelSpec, RunSpec

    def run(scheme: str) -> RunSpec:
        return RunSpec(ModelSpec("embedded"), str(parse_scheme(scheme)), "perplexity", "{}")

    ids = {
        run(t).run_id
        for t in ("fp8_e4m3/tensor/unit", "fp8_e4m3/tensor/unit+rounding=rtz", "fp8_e4m3/tensor/unit+rounding=rna")
    }
    assert len(ids) == 3
    assert run("fp8_e4m3/tensor/unit+rounding=rne").run_id == run("fp8_e4m3/tensor/unit").run_id


def test_every_quantized_format_takes_every_mode():
    for name, fmt in FORMATS.items():
        if fmt.is_unscaled:
            continue
        for mode in MODES:
            text = f"{name}/group16/dynamic" if fmt.group_scaled else f"{name}/token/dynamic"
            s = parse_scheme(text + (f"+rounding={mode.value}" if mode is not Rounding.RNE else ""))
            assert s.kv_format.rounding is mode and s.kv_format.kind in (FormatKind.FLOAT, FormatKind.INT)
