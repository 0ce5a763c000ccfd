"""Exact float32 -> FP8 -> float32 rounding by integer arithmetic on the float32 bits.

torch's float8 casts are correct but slow on CPU (a quantize-dequantize round trip of every
layer's K and V costs ~25-30 % of a forward pass of the embedded model). The rounding they perform
is simple enough to emulate exactly in a few vectorised float32/int32 operations:

* normal range (|y| >= 2**min_normal_exp): keep ``m`` mantissa bits of the float32 value with
  round-to-nearest-even. On the float32 bit pattern ``b`` that is
  ``(b + (2**(23-m-1) - 1) + ((b >> (23-m)) & 1)) & ~(2**(23-m) - 1)``: add just under half an
  ulp of the target, plus one when the kept lsb is odd (ties to even), then truncate. A carry out
  of the mantissa correctly bumps the exponent.
* subnormal range: the target spacing is the constant ``q = 2**(min_normal_exp - m)``, and
  ``(|y| + c) - c`` with ``c = q * 2**23`` rounds ``|y|`` to a multiple of ``q`` with the FPU's
  own round-to-nearest-even (the sum stays in c's binade, whose spacing is exactly ``q``); the
  sign is put back with ``copysign`` so that -tiny rounds to -0 as the real cast does.

Inputs must already be clamped to the format's finite range (callers clamp before rounding, as
before a real cast). NaN stays NaN. For formats without negative zero (E4M3-fnuz) a result of
zero is +0, as the real cast gives. ``tests/test_fp8_emulation.py`` proves the emulation
bit-identical to both torch's cast and ml_dtypes on edge-case tables, on every rounding boundary
of each format and on large random tensors.
"""

from __future__ import annotations

import torch

from evalkit.formats import KVFormat


def round_to_fp8(y: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """Round float32 ``y`` (already clamped to ±fmt.max) to the nearest value of ``fmt``; float32 out."""
    assert y.dtype == torch.float32, "round_to_fp8 works on float32"
    drop = 23 - fmt.mantissa_bits
    bits = y.view(torch.int32)
    lsb = (bits >> drop).bitwise_and_(1)
    normal = lsb.add_(bits).add_((1 << (drop - 1)) - 1).bitwise_and_(~((1 << drop) - 1)).view(torch.float32)
    c = 2.0 ** (fmt.min_normal_exp - fmt.mantissa_bits + 23)
    magnitude = y.abs()
    subnormal = (magnitude + c).sub_(c).copysign_(y)
    out = torch.where(magnitude < 2.0**fmt.min_normal_exp, subnormal, normal)
    if not fmt.negative_zero:
        out = out.add_(0.0)  # -0.0 + 0.0 == +0.0; every other value (and NaN) is unchanged
    return out


def round_to_fp8_by_cast(y: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """The reference: torch's own cast there and back (slow on CPU)."""
    return y.to(fmt.torch_dtype).to(torch.float32)
