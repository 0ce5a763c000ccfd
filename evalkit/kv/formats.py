"""Storage formats for cached K/V, as data.

A format is described once, here, from `torch.finfo` / `torch.iinfo` where torch has the dtype,
so adding a format touches this table and its test row only. Fields:

- ``kind``: a :class:`FormatKind`: ``FLOAT`` (FP8 via a torch float8 dtype), ``INT`` (integer codes
  with a scale and, for asymmetric formats, a zero point) or ``NONE`` (the unquantized baseline).
- ``bits``: bits per stored element (4 for INT4, packed two per byte in the real cache).
- ``max``: the largest finite magnitude (FP8) or the largest code magnitude (symmetric int).
- ``mantissa_bits`` / ``min_normal_exp``: what the exact FP8 rounding emulation needs.

``bf16`` is the baseline: K/V are stored unquantized in the model's own dtype (BF16 when serving).
Its byte count is 2 per element whatever dtype the model computes in here.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import torch

from evalkit.errors import SchemeError


class FormatKind(str, enum.Enum):
    NONE = "none"
    FLOAT = "float"
    INT = "int"


@dataclass(frozen=True)
class KVFormat:
    name: str
    kind: FormatKind
    bits: int
    description: str
    torch_dtype: torch.dtype | None = None
    max: float = math.inf
    mantissa_bits: int = 0
    min_normal_exp: int = 0
    asymmetric: bool = False
    negative_zero: bool = True

    @property
    def is_identity(self) -> bool:
        return self.kind is FormatKind.NONE

    @property
    def bytes_per_element(self) -> float:
        return self.bits / 8

    @property
    def storage_dtype(self) -> torch.dtype | None:
        """The dtype of stored codes: the float8 dtype, int8, or uint8 (asymmetric, or two 4-bit codes per byte)."""
        return self.torch_dtype

    @property
    def qmin(self) -> float:
        """Smallest integer code (int formats)."""
        if self.asymmetric:
            return 0.0
        return -self.max

    @property
    def qmax(self) -> float:
        """Largest integer code (int formats), or the finite max (float formats)."""
        if self.asymmetric:
            return float(2**self.bits - 1)
        return self.max


def _float8(name: str, dtype: torch.dtype, description: str) -> KVFormat:
    info = torch.finfo(dtype)
    return KVFormat(
        name=name,
        kind=FormatKind.FLOAT,
        bits=info.bits,
        description=description,
        torch_dtype=dtype,
        max=float(info.max),
        mantissa_bits=int(round(-math.log2(info.eps))),
        min_normal_exp=int(round(math.log2(info.smallest_normal))),
        negative_zero=dtype != torch.float8_e4m3fnuz,
    )


def _int(name: str, bits: int, asymmetric: bool, description: str) -> KVFormat:
    return KVFormat(
        name=name,
        kind=FormatKind.INT,
        bits=bits,
        description=description,
        torch_dtype=torch.uint8 if (asymmetric or bits < 8) else torch.int8,
        max=float(2 ** (bits - 1) - 1),
        asymmetric=asymmetric,
    )


FORMATS: dict[str, KVFormat] = {
    f.name: f
    for f in (
        KVFormat("bf16", FormatKind.NONE, 16, "unquantized baseline: K/V kept in the model's dtype (BF16 when serving)"),
        _float8("fp8_e4m3", torch.float8_e4m3fn, "FP8 E4M3 (OCP 'fn': max 448, no inf), the engines' usual KV format"),
        _float8("fp8_e4m3fnuz", torch.float8_e4m3fnuz, "FP8 E4M3 'fnuz' as on AMD MI300 (max 240, no -0, no inf)"),
        _float8("fp8_e5m2", torch.float8_e5m2, "FP8 E5M2 (max 57344, 2 mantissa bits): more range, less precision"),
        _int("int8", 8, False, "INT8 symmetric, codes -127..127 (reference point)"),
        _int("int8_asym", 8, True, "INT8 asymmetric, codes 0..255 with a zero point (reference point)"),
        _int("int4", 4, False, "INT4 symmetric, codes -7..7, two per byte (KIVI-style reference point)"),
        _int("int4_asym", 4, True, "INT4 asymmetric, codes 0..15 with a zero point, two per byte (KIVI-style)"),
    )
}


def get_format(name: str) -> KVFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise SchemeError(
            f"unknown KV format {name!r}: use one of {', '.join(FORMATS)}"
        ) from None
