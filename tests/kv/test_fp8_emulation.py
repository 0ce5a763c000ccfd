"""The exact FP8 rounding emulation against torch's cast and an independent reference (ml_dtypes)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from evalkit.kv.formats import FORMATS
from evalkit.kv.quantize import round_codes
from evalkit.kv.rounding import SMALL, round_to_fp8, round_to_fp8_by_cast, round_to_fp8_emulated

FP8 = ["fp8_e4m3", "fp8_e4m3fnuz", "fp8_e5m2"]
ML_DTYPES = {
    "fp8_e4m3": ml_dtypes.float8_e4m3fn,
    "fp8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "fp8_e5m2": ml_dtypes.float8_e5m2,
}


def reference(values: np.ndarray, name: str) -> np.ndarray:
    """ml_dtypes' float8 rounding of already-clamped float32 values, back to float32."""
    return values.astype(np.float32).astype(ML_DTYPES[name]).astype(np.float32)


def edge_table(name: str) -> dict[str, float]:
    fmt = FORMATS[name]
    sub = 2.0 ** (fmt.min_normal_exp - fmt.mantissa_bits)  # smallest subnormal
    return {
        "zero": 0.0,
        "negative zero": -0.0,
        "smallest subnormal": sub,
        "-smallest subnormal": -sub,
        "half smallest subnormal (tie to 0)": sub / 2,
        "just above half subnormal": sub / 2 * (1 + 2**-20),
        "between subnormals (1.5 q, tie to even 2q)": 1.5 * sub,
        "between subnormals (2.5 q, tie to 2q)": 2.5 * sub,
        "largest subnormal": 2.0**fmt.min_normal_exp - sub,
        "smallest normal": 2.0**fmt.min_normal_exp,
        "one": 1.0,
        "one + half ulp (tie to even 1)": 1 + 2.0 ** -(fmt.mantissa_bits + 1),
        "one + 1.5 ulp (tie to even 1 + 2ulp)": 1 + 3 * 2.0 ** -(fmt.mantissa_bits + 1),
        "max": fmt.max,
        "-max": -fmt.max,
        "just beyond max": fmt.max * (1 + 2**-10),
        "huge": 1e30,
        "-huge": -1e30,
        "inf": math.inf,
        "-inf": -math.inf,
    }


@pytest.mark.parametrize("name", FP8)
def test_edge_cases_match_cast_and_ml_dtypes(name):
    fmt = FORMATS[name]
    table = edge_table(name)
    x = torch.tensor(list(table.values()), dtype=torch.float32)
    ours = round_codes(x, fmt)  # clamps, then rounds (a small table: by the cast)
    clamped = x.clamp(-fmt.max, fmt.max)
    by_cast = round_to_fp8_by_cast(clamped, fmt)
    emulated = round_to_fp8_emulated(clamped, fmt)
    ref = torch.from_numpy(reference(clamped.numpy(), name))
    for i, label in enumerate(table):
        assert emulated[i].view(torch.int32) == ref[i].view(torch.int32), (
            f"{name} {label}: emulated {emulated[i]} vs ml_dtypes {ref[i]}"
        )
        assert ours[i].view(torch.int32) == by_cast[i].view(torch.int32), (
            f"{name} {label}: {ours[i]} vs cast {by_cast[i]}"
        )
        assert ours[i].view(torch.int32) == ref[i].view(torch.int32), f"{name} {label}: {ours[i]} vs ml_dtypes {ref[i]}"
    assert torch.isfinite(ours).all(), "overflow must saturate, never inf"
    assert ours[list(table).index("huge")] == fmt.max and ours[list(table).index("-inf")] == -fmt.max


@pytest.mark.parametrize("name", FP8)
def test_nan_stays_nan(name):
    fmt = FORMATS[name]
    x = torch.tensor([float("nan"), 1.0, -float("nan")])
    out = round_codes(x, fmt)
    assert torch.isnan(out[0]) and torch.isnan(out[2]) and out[1] == 1.0


@pytest.mark.parametrize("name", FP8)
def test_every_rounding_boundary(name):
    """Each representable value, each midpoint between neighbours and one float32 ulp either side."""
    fmt = FORMATS[name]
    codes = np.arange(256, dtype=np.uint8).view(ML_DTYPES[name]).astype(np.float32)
    values = np.unique(codes[np.isfinite(codes) & (np.abs(codes) <= fmt.max)])
    mids = (values[:-1].astype(np.float64) + values[1:]) / 2
    mids = mids.astype(np.float32)
    probes = np.concatenate(
        [values, mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))]
    )
    x = torch.from_numpy(probes)
    ours = round_to_fp8_emulated(x, fmt)
    assert torch.equal(ours.view(torch.int32), round_to_fp8_by_cast(x, fmt).view(torch.int32))
    assert torch.equal(ours.view(torch.int32), torch.from_numpy(reference(probes, name)).view(torch.int32))
    assert probes.size > 700


@pytest.mark.parametrize("name", FP8)
def test_large_random_tensors(name):
    fmt = FORMATS[name]
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(2_000_000, generator=g) * torch.exp(torch.randn(2_000_000, generator=g) * 6)
    x = x.clamp(-fmt.max, fmt.max)
    ours = round_to_fp8_emulated(x, fmt)
    assert torch.equal(ours.view(torch.int32), round_to_fp8_by_cast(x, fmt).view(torch.int32))
    assert torch.equal(ours.view(torch.int32), torch.from_numpy(reference(x.numpy(), name)).view(torch.int32))


def test_fnuz_has_no_negative_zero():
    fmt = FORMATS["fp8_e4m3fnuz"]
    out = round_to_fp8_emulated(torch.tensor([-0.0, -1e-9]), fmt)
    assert not torch.signbit(out).any()
    e4m3 = round_to_fp8_emulated(torch.tensor([-0.0, -1e-9]), FORMATS["fp8_e4m3"])
    assert torch.signbit(e4m3).all()


def test_format_table_is_derived_from_finfo():
    assert FORMATS["fp8_e4m3"].max == 448 and FORMATS["fp8_e4m3fnuz"].max == 240 and FORMATS["fp8_e5m2"].max == 57344
    assert FORMATS["fp8_e4m3"].mantissa_bits == 3 and FORMATS["fp8_e5m2"].mantissa_bits == 2
    assert FORMATS["fp8_e4m3"].min_normal_exp == -6 and FORMATS["fp8_e4m3fnuz"].min_normal_exp == -7
    assert FORMATS["int4"].qmax == 7 and FORMATS["int8"].qmax == 127 and FORMATS["int4_asym"].qmax == 15


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e4m3fnuz", "fp8_e5m2"])
def test_dispatch_by_size_gives_the_same_bits_either_way(name):
    fmt = FORMATS[name]
    g = torch.Generator().manual_seed(9)
    for n in (1, SMALL, SMALL + 1, 3 * SMALL):
        x = (torch.randn(n, generator=g) * 30).clamp(-fmt.max, fmt.max)
        assert torch.equal(round_to_fp8(x, fmt).view(torch.int32), round_to_fp8_emulated(x, fmt).view(torch.int32))
