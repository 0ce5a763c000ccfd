"""evalkit.kv.microscaling against independent references, bit for bit.

Two references for every rounding: ml_dtypes' casts (float4_e2m1fn, float8_e4m3fn,
float8_e8m0fnu) and a table-driven numpy quantizer written here (nearest value of the format's
table, ties to the even code), whose E2M1 and E4M3 tables are built from the formats' definitions.
The E8M0 rule is checked against numpy's frexp and against a float64 search for floor(log2).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from evalkit.errors import SchemeError
from evalkit.kv.microscaling import (
    E2M1_EMAX,
    E4M3_EMAX,
    code_to_e2m1,
    e2m1_to_code,
    e8m0_scale,
    nvfp4_scales,
    pack_fp4,
    round_scale_to_e4m3,
    round_to_e2m1,
    unpack_fp4,
)

NAN = float("nan")
INF = float("inf")
F32 = np.float32

# ---------------------------------------------------------------------------------------------
# Independent references
# ---------------------------------------------------------------------------------------------

# E2M1 magnitudes in code order: subnormal 0.5 (e=0, m=1), then (1 + m/2) * 2**(e-1) for e = 1..3.
E2M1_GRID = np.array([0.0, 0.5] + [(1 + m / 2) * 2.0 ** (e - 1) for e in (1, 2, 3) for m in (0, 1)])
# E4M3 ('fn') magnitudes in code order: subnormals k * 2**-9, normals (1 + m/8) * 2**(e-7),
# e = 1..15, except e = 15, m = 7 (NaN).
E4M3_GRID = np.array(
    [k * 2.0**-9 for k in range(8)]
    + [(1 + m / 8) * 2.0 ** (e - 7) for e in range(1, 16) for m in range(8) if (e, m) != (15, 7)]
)


@np.errstate(invalid="ignore")  # NaN bit patterns among the inputs
def table_round(x: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Nearest grid magnitude (saturating at the top), ties to the even code; sign kept; NaN kept."""
    x = np.asarray(x, dtype=np.float32)
    out = np.empty(x.shape, dtype=np.float32)
    flat_x, flat_out = x.reshape(-1), out.reshape(-1)
    parity = np.arange(len(grid)) % 2
    for start in range(0, flat_x.size, 1 << 16):
        chunk = flat_x[start : start + (1 << 16)]
        magnitude = np.minimum(np.abs(chunk.astype(np.float64)), grid[-1])
        distance = np.abs(magnitude[:, None] - grid[None, :])  # exact: float32 minus a short grid value
        nearest = distance == distance.min(axis=1, keepdims=True)
        index = np.argmin(np.where(nearest, parity, 2), axis=1)  # among the nearest, the even code
        value = np.copysign(grid[index], chunk.astype(np.float64)).astype(np.float32)
        flat_out[start : start + chunk.size] = np.where(np.isnan(chunk), np.float32(np.nan), value)
    return out


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def assert_same_floats(actual: torch.Tensor, expected: np.ndarray) -> None:
    """Same NaN positions and, elsewhere, the same float32 bits (so -0 differs from +0)."""
    actual = actual.numpy()
    expected = np.asarray(expected, dtype=np.float32)
    assert actual.dtype == np.float32 and actual.shape == expected.shape
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(actual), nan)
    mismatch = np.flatnonzero(bits(actual[~nan]) != bits(expected[~nan]))
    assert mismatch.size == 0, (
        f"{mismatch.size} mismatches, e.g. {actual[~nan][mismatch[:5]]} vs {expected[~nan][mismatch[:5]]}"
    )


def random_float32(rng: np.random.Generator, n: int) -> np.ndarray:
    """A mix that reaches every corner: raw bit patterns (NaN, inf, subnormals, huge), normal
    values at E2M1 scale, uniform over the saturating range, log-uniform magnitudes."""
    raw = rng.integers(0, 2**32, size=n // 4, dtype=np.uint64).astype(np.uint32).view(np.float32)
    normal = (rng.standard_normal(n // 4) * 3).astype(np.float32)
    uniform = rng.uniform(-8, 8, n // 4).astype(np.float32)
    rest = n - 3 * (n // 4)
    log_uniform = (np.exp2(rng.uniform(-30, 10, rest)) * rng.choice([-1, 1], rest)).astype(np.float32)
    return np.concatenate([raw, normal, uniform, log_uniform])


def test_reference_tables_are_the_formats():
    """The hand-built tables agree with ml_dtypes' own decoding of every code."""
    e2m1 = np.arange(8, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    np.testing.assert_array_equal(E2M1_GRID, e2m1)
    e4m3 = np.arange(127, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    np.testing.assert_array_equal(E4M3_GRID, e4m3)


# ---------------------------------------------------------------------------------------------
# round_to_e2m1
# ---------------------------------------------------------------------------------------------

E2M1_EDGES = [
    # (id, input, expected)
    ("zero", 0.0, 0.0),
    ("neg_zero", -0.0, -0.0),
    ("half", 0.5, 0.5),
    ("six", 6.0, 6.0),
    ("neg_six", -6.0, -6.0),
    ("tie_0.25_to_0", 0.25, 0.0),
    ("tie_-0.25_to_-0", -0.25, -0.0),
    ("tie_0.75_to_1", 0.75, 1.0),
    ("tie_1.25_to_1", 1.25, 1.0),
    ("tie_1.75_to_2", 1.75, 2.0),
    ("tie_2.5_to_2", 2.5, 2.0),
    ("tie_-2.5_to_-2", -2.5, -2.0),
    ("tie_3.5_to_4", 3.5, 4.0),
    ("tie_5_to_4", 5.0, 4.0),
    ("tie_-5_to_-4", -5.0, -4.0),
    ("above_tie_0.25", float(np.nextafter(F32(0.25), F32(1))), 0.5),
    ("below_tie_0.75", float(np.nextafter(F32(0.75), F32(0))), 0.5),
    ("above_tie_2.5", float(np.nextafter(F32(2.5), F32(9))), 3.0),
    ("below_tie_5", float(np.nextafter(F32(5.0), F32(0))), 4.0),
    ("above_tie_5", float(np.nextafter(F32(5.0), F32(9))), 6.0),
    ("saturate_6.5", 6.5, 6.0),
    ("saturate_-7", -7.0, -6.0),
    ("saturate_huge", 3.0e38, 6.0),
    ("saturate_inf", INF, 6.0),
    ("saturate_-inf", -INF, -6.0),
    ("subnormal_to_0", 1e-40, 0.0),
    ("neg_subnormal_to_-0", -1e-45, -0.0),
    ("small_negative_to_-0", -0.1, -0.0),
    ("nan_stays_nan", NAN, NAN),
]


@pytest.mark.parametrize("value,expected", [case[1:] for case in E2M1_EDGES], ids=[case[0] for case in E2M1_EDGES])
def test_round_to_e2m1_edge(value, expected):
    assert_same_floats(round_to_e2m1(torch.tensor([value])), np.array([expected]))


def e2m1_boundary_inputs() -> np.ndarray:
    """Every value, every midpoint, each one's float32 neighbours, both signs, and beyond ±6."""
    midpoints = (E2M1_GRID[:-1] + E2M1_GRID[1:]) / 2
    points = np.concatenate([E2M1_GRID, midpoints, [6.5, 7.0, 8.0, 1e6, 2.0**-149, 2.0**-126]]).astype(np.float32)
    neighbours = np.concatenate([np.nextafter(points, F32(np.inf)), np.nextafter(points, F32(0))])
    everything = np.concatenate([points, neighbours])
    return np.concatenate([everything, -everything, [np.inf, -np.inf]]).astype(np.float32)


def test_round_to_e2m1_boundaries_match_table_and_ml_dtypes():
    x = e2m1_boundary_inputs()
    ours = round_to_e2m1(torch.from_numpy(x))
    assert_same_floats(ours, table_round(x, E2M1_GRID))
    assert_same_floats(ours, x.astype(ml_dtypes.float4_e2m1fn).astype(np.float32))


def test_round_to_e2m1_million_random_values_bit_for_bit():
    x = random_float32(np.random.default_rng(16), 1_000_000)
    ours = round_to_e2m1(torch.from_numpy(x))
    assert_same_floats(ours, table_round(x, E2M1_GRID))
    finite_or_inf = ~np.isnan(x)  # ml_dtypes maps NaN to -0 (E2M1 has no NaN); we keep NaN
    assert_same_floats(ours[finite_or_inf], x[finite_or_inf].astype(ml_dtypes.float4_e2m1fn).astype(np.float32))
    assert torch.isnan(ours[torch.from_numpy(~finite_or_inf)]).all()


def test_round_to_e2m1_leaves_input_alone_and_takes_other_float_dtypes():
    y = torch.tensor([[0.3, -2.6], [7.0, 1.25]])
    before = y.clone()
    out = round_to_e2m1(y)
    assert torch.equal(y, before)
    assert out.dtype == torch.float32 and out.shape == y.shape
    assert torch.equal(round_to_e2m1(y.to(torch.bfloat16)), round_to_e2m1(y.to(torch.bfloat16).float()))
    assert round_to_e2m1(torch.tensor(2.6)).item() == 3.0  # 0-dim


# ---------------------------------------------------------------------------------------------
# Codes and packing
# ---------------------------------------------------------------------------------------------


def test_codes_are_the_ocp_bit_layout():
    values = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)  # includes -0
    codes = e2m1_to_code(torch.from_numpy(values))
    assert codes.dtype == torch.uint8
    np.testing.assert_array_equal(codes.numpy(), np.arange(16))
    assert_same_floats(code_to_e2m1(codes), values)


def test_codes_round_trip_random_rounded_values():
    x = random_float32(np.random.default_rng(4), 20_000)
    x = x[~np.isnan(x)]
    rounded = round_to_e2m1(torch.from_numpy(x))
    codes = e2m1_to_code(rounded)
    np.testing.assert_array_equal(codes.numpy(), x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8))
    assert_same_floats(code_to_e2m1(codes), rounded.numpy())


def test_pack_puts_the_first_element_in_the_low_nibble():
    codes = torch.tensor([[1, 2, 0xF, 0x8]], dtype=torch.uint8)
    np.testing.assert_array_equal(pack_fp4(codes).numpy(), [[0x21, 0x8F]])


def test_pack_unpack_round_trip():
    every_byte = torch.arange(256, dtype=torch.int64).to(torch.uint8).reshape(4, 64)
    assert torch.equal(pack_fp4(unpack_fp4(every_byte)), every_byte)
    codes = torch.randint(0, 16, (3, 5, 128), generator=torch.Generator().manual_seed(0)).to(torch.uint8)
    packed = pack_fp4(codes)
    assert packed.shape == (3, 5, 64) and packed.dtype == torch.uint8
    assert torch.equal(unpack_fp4(packed), codes)


BAD_CODE_INPUTS = [
    ("odd_last_dim", lambda: pack_fp4(torch.zeros(2, 3, dtype=torch.uint8)), SchemeError),
    ("code_above_15", lambda: pack_fp4(torch.tensor([16, 0], dtype=torch.uint8)), ValueError),
    ("negative_code", lambda: code_to_e2m1(torch.tensor([-1])), ValueError),
    ("float_codes", lambda: pack_fp4(torch.zeros(2)), TypeError),
    ("unpack_non_bytes", lambda: unpack_fp4(torch.zeros(2, dtype=torch.int32)), TypeError),
    ("value_off_grid", lambda: e2m1_to_code(torch.tensor([2.5])), ValueError),
    ("value_above_6", lambda: e2m1_to_code(torch.tensor([8.0])), ValueError),
    ("nan_has_no_code", lambda: e2m1_to_code(torch.tensor([NAN])), ValueError),
]


@pytest.mark.parametrize(
    "call,error", [case[1:] for case in BAD_CODE_INPUTS], ids=[case[0] for case in BAD_CODE_INPUTS]
)
def test_bad_code_inputs_raise(call, error):
    with pytest.raises(error):
        call()


# ---------------------------------------------------------------------------------------------
# e8m0_scale
# ---------------------------------------------------------------------------------------------


@np.errstate(invalid="ignore")
def e8m0_reference_frexp(amax: np.ndarray, elem_emax: int) -> np.ndarray:
    _, exponent = np.frexp(amax)
    shared = np.clip(exponent.astype(np.int64) - 1 - elem_emax, -127, 127)
    shared[amax == 0] = -127
    out = np.ldexp(1.0, shared).astype(np.float32)
    out[~np.isfinite(amax)] = np.nan
    return out


@np.errstate(invalid="ignore")
def e8m0_reference_search(amax: np.ndarray, elem_emax: int) -> np.ndarray:
    """floor(log2(amax)) as the largest k with 2**k <= amax, searched in float64."""
    a = amax.astype(np.float64)
    finite_positive = np.isfinite(a) & (a > 0)
    guess = np.floor(np.log2(np.where(finite_positive, a, 1.0)))
    k = guess - (np.exp2(guess) > a) + (np.exp2(guess + 1) <= a)
    shared = np.clip(np.where(finite_positive, k, -np.inf) - elem_emax, -127, 127)
    out = np.exp2(shared).astype(np.float32)
    out[~np.isfinite(a)] = np.nan
    return out


def e8m0_inputs(rng: np.random.Generator) -> np.ndarray:
    powers = np.exp2(np.arange(-149, 128, dtype=np.float64)).astype(np.float32)
    neighbours = np.concatenate([np.nextafter(powers, F32(np.inf)), np.nextafter(powers, F32(0))])
    raw = rng.integers(0, 2**31, size=200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)  # |bits|
    log_uniform = np.exp2(rng.uniform(-140, 127, 50_000)).astype(np.float32)
    specials = np.array([0.0, -0.0, np.inf, np.nan, np.finfo(np.float32).max, 6.0, 448.0, 7.99, 8.0], dtype=np.float32)
    return np.concatenate([powers, neighbours, raw, log_uniform, specials])


@pytest.mark.parametrize("elem_emax", [E2M1_EMAX, E4M3_EMAX], ids=["e2m1", "e4m3"])
def test_e8m0_scale_random_bit_for_bit(elem_emax):
    amax = e8m0_inputs(np.random.default_rng(elem_emax))
    ours = e8m0_scale(torch.from_numpy(amax), elem_emax)
    assert_same_floats(ours, e8m0_reference_frexp(amax, elem_emax))
    assert_same_floats(ours, e8m0_reference_search(amax, elem_emax))
    # every scale is an E8M0 value: exact through ml_dtypes and torch's float8_e8m0fnu
    assert_same_floats(ours, ours.numpy().astype(ml_dtypes.float8_e8m0fnu).astype(np.float32))
    finite = torch.isfinite(ours)
    assert torch.equal(ours[finite].to(torch.float8_e8m0fnu).to(torch.float32), ours[finite])
    # where nothing is clamped, amax / X lies in [2**emax, 2**(emax + 1)) as the MX rule intends
    unclamped = (amax > 2.0 ** (-127 + elem_emax + 1)) & np.isfinite(amax)
    ratio = amax[unclamped].astype(np.float64) / ours.numpy()[unclamped]
    assert (ratio >= 2.0**elem_emax).all() and (ratio < 2.0 ** (elem_emax + 1)).all()


E8M0_EDGES = [
    # (id, amax, elem_emax, expected)
    ("one_e2m1", 1.0, E2M1_EMAX, 0.25),
    ("six_e2m1", 6.0, E2M1_EMAX, 1.0),
    ("just_below_8_e2m1_then_elements_saturate", 7.99, E2M1_EMAX, 1.0),
    ("eight_e2m1", 8.0, E2M1_EMAX, 2.0),
    ("below_power_of_two", float(np.nextafter(F32(8.0), F32(0))), E2M1_EMAX, 1.0),
    ("448_e4m3", 448.0, E4M3_EMAX, 1.0),
    ("512_e4m3", 512.0, E4M3_EMAX, 2.0),
    ("zero_is_smallest_e8m0", 0.0, E2M1_EMAX, 2.0**-127),
    ("neg_zero_is_smallest_e8m0", -0.0, E4M3_EMAX, 2.0**-127),
    ("subnormal_clamps_low", 1e-42, E2M1_EMAX, 2.0**-127),
    ("float32_max", float(np.finfo(np.float32).max), E2M1_EMAX, 2.0**125),
    ("nan", NAN, E2M1_EMAX, NAN),
    ("inf", INF, E4M3_EMAX, NAN),
]


@pytest.mark.parametrize(
    "amax,elem_emax,expected", [case[1:] for case in E8M0_EDGES], ids=[case[0] for case in E8M0_EDGES]
)
def test_e8m0_scale_edge(amax, elem_emax, expected):
    assert_same_floats(e8m0_scale(torch.tensor([amax]), elem_emax), np.array([expected]))


def test_mxfp4_worked_block():
    """OCP MX: amax 7 -> X = 2**(2 - 2) = 1, and 7 saturates to 6 (the spec accepts that)."""
    block = torch.tensor([7.0, -3.3, 0.2, 1.25])
    scale = e8m0_scale(block.abs().amax(), E2M1_EMAX)
    assert scale.item() == 1.0
    assert round_to_e2m1(block / scale).tolist() == [6.0, -3.0, 0.0, 1.0]


# ---------------------------------------------------------------------------------------------
# round_scale_to_e4m3
# ---------------------------------------------------------------------------------------------

E4M3_EDGES = [
    # (id, scale, expected)
    ("zero_to_smallest", 0.0, 2.0**-9),
    ("negative_to_smallest", -3.0, 2.0**-9),
    ("would_round_to_zero", 2.0**-10, 2.0**-9),
    ("smallest_subnormal", 2.0**-9, 2.0**-9),
    ("tie_272_to_256", 272.0, 256.0),
    ("tie_304_to_320", 304.0, 320.0),
    ("thirds", 37.333332, 36.0),
    ("max", 448.0, 448.0),
    ("saturate_464", 464.0, 448.0),
    ("saturate_1e9", 1e9, 448.0),
    ("saturate_inf", INF, 448.0),
    ("nan", NAN, NAN),
]


@pytest.mark.parametrize("scale,expected", [case[1:] for case in E4M3_EDGES], ids=[case[0] for case in E4M3_EDGES])
def test_round_scale_to_e4m3_edge(scale, expected):
    assert_same_floats(round_scale_to_e4m3(torch.tensor([scale])), np.array([expected]))


def test_round_scale_to_e4m3_random_bit_for_bit():
    rng = np.random.default_rng(3)
    grid = E4M3_GRID.astype(np.float32)
    midpoints = ((E4M3_GRID[:-1] + E4M3_GRID[1:]) / 2).astype(np.float32)
    s = np.concatenate(
        [
            grid,
            midpoints,
            np.nextafter(midpoints, F32(np.inf)),
            np.nextafter(midpoints, F32(0)),
            np.exp2(rng.uniform(-14, 10, 100_000)).astype(np.float32),
        ]
    )
    ours = round_scale_to_e4m3(torch.from_numpy(s))
    kept_in_range = np.clip(s, F32(2.0**-9), F32(448.0))
    assert_same_floats(ours, table_round(kept_in_range, E4M3_GRID))
    assert_same_floats(ours, kept_in_range.astype(ml_dtypes.float8_e4m3fn).astype(np.float32))


# ---------------------------------------------------------------------------------------------
# nvfp4_scales
# ---------------------------------------------------------------------------------------------


def test_nvfp4_worked_example_with_an_exact_global_scale():
    """tensor amax 2688 = 448 * 6 makes the global scale exactly 1, so every step is by hand:
    group amax 600 -> 600 / 6 = 100, an E4M3 tie between 96 (mantissa 1.100) and 104 (1.101)
    -> 96; the group's elements divided by 96 * 1 are 6.25 (saturates to 6), -3.125 (-> -3),
    0.5, 1.5 and 2.5 (tie -> 2)."""
    group_amax = torch.tensor([2688.0, 600.0, 6.0, 0.75, 0.0])
    group_scale, global_scale = nvfp4_scales(group_amax, torch.tensor(2688.0))
    assert global_scale.item() == 1.0
    # 2688/6 = 448; 600/6 = 100 -> 96; 6/6 = 1; 0.75/6 = 0.125 = 2**-3; amax 0 -> 1.0
    assert group_scale.tolist() == [448.0, 96.0, 1.0, 0.125, 1.0]
    group = torch.tensor([600.0, -300.0, 48.0, 144.0, 240.0])
    effective = group_scale[1] * global_scale
    assert round_to_e2m1(group / effective).tolist() == [6.0, -3.0, 0.5, 1.5, 2.0]


def test_nvfp4_worked_example_with_a_rounded_global_scale():
    """tensor amax 12: global = 12 / 2688 = 1/224 in float32. Group amax 12 -> 448; 3 -> 112;
    1 -> 37.33 -> 36 (spacing 4 in [32, 64)); 0.01 -> 0.3733 -> 0.375 (spacing 1/32 in
    [0.25, 0.5)); 1e-6 -> 3.7e-5 -> 2**-9 (kept above zero); 24 (above the tensor amax, a stale
    static amax) -> 896 -> saturates at 448; NaN and inf amax -> NaN."""
    group_amax = torch.tensor([12.0, 3.0, 1.0, 0.01, 1e-6, 24.0, NAN, INF])
    group_scale, global_scale = nvfp4_scales(group_amax, torch.tensor(12.0))
    assert global_scale.dtype == torch.float32
    assert global_scale.item() == float(F32(12.0) / F32(2688.0))
    assert abs(global_scale.item() - 1 / 224) <= float(np.spacing(F32(1 / 224)))
    assert_same_floats(group_scale, np.array([448.0, 112.0, 36.0, 0.375, 2.0**-9, 448.0, NAN, NAN]))


NVFP4_TENSOR_EDGES = [
    # (id, tensor_amax, expected global, expected group scale for group amax 0)
    ("all_zero_tensor", 0.0, 1.0, 1.0),
    ("nan_tensor_amax", NAN, NAN, NAN),
    ("inf_tensor_amax", INF, NAN, NAN),
]


@pytest.mark.parametrize(
    "tensor_amax,expected_global,expected_group",
    [case[1:] for case in NVFP4_TENSOR_EDGES],
    ids=[case[0] for case in NVFP4_TENSOR_EDGES],
)
def test_nvfp4_tensor_amax_edges(tensor_amax, expected_global, expected_group):
    group_scale, global_scale = nvfp4_scales(torch.tensor([0.0]), torch.tensor(tensor_amax))
    assert_same_floats(global_scale.reshape(1), np.array([expected_global]))
    assert_same_floats(group_scale, np.array([expected_group]))


def test_nvfp4_scales_follow_the_recipe_on_random_groups():
    """Random [heads, groups] amax with one tensor amax per head: the recipe recomputed in numpy
    float32, step by step, then cast by ml_dtypes."""
    rng = np.random.default_rng(5)
    group_amax = np.exp2(rng.uniform(-20, 8, (4, 512))).astype(np.float32)
    group_amax[:, :3] = 0.0
    tensor_amax = group_amax.max(axis=1, keepdims=True)
    group_scale, global_scale = nvfp4_scales(torch.from_numpy(group_amax), torch.from_numpy(tensor_amax))
    expected_global = tensor_amax / F32(2688.0)
    wanted = group_amax / (F32(6.0) * expected_global)
    wanted[wanted == 0] = 1.0
    expected = np.clip(wanted, F32(2.0**-9), F32(448.0)).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert_same_floats(global_scale, expected_global)
    assert_same_floats(group_scale, expected)
    assert (group_scale.max(dim=1).values == 448.0).all()  # the largest group maps to the top of E4M3
