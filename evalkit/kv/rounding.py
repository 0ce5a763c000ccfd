"""Exact float32 -> FP8 -> float32 rounding by integer arithmetic on the float32 bits.

torch's float8 casts are correct but, on CPU, a round trip of every layer's K and V over a long
prefill costs more than a few passes of integer arithmetic on the float32 bits (on older torch
about a quarter of a forward of the embedded model; on torch 2.13 still about 1.6 % of a
2048-token forward against 1.2 % for this emulation). For one decode token the two kernels of the
cast are cheaper than seven passes, so :func:`round_to_fp8` picks by size; both give the same bits.
The rounding they perform is simple enough to emulate exactly in a
few vectorised float32/int32 operations:

* For ``|y|`` in the binade ``[2**e, 2**(e+1))`` the format's spacing is ``q = 2**(e' - m)`` with
  ``e' = max(e, min_normal_exp)`` (below the smallest normal the spacing stays that of the
  subnormals). ``(|y| + c) - c`` with ``c = q * 2**23`` rounds ``|y|`` to a multiple of ``q`` with
  the FPU's own round-to-nearest-even: the sum lies in c's binade, whose float32 spacing is
  exactly ``q`` (``|y| < 2**(e+1) <= c``), and the subtraction is exact. A round-up to
  ``2**(e+1)`` is the correct carry into the next binade.
* ``c`` is built from the bits of ``y`` in three integer passes: keep the exponent field, clamp it
  below at the smallest normal's, add ``23 - m`` to it. The sign is put back with ``copysign`` so
  that -tiny rounds to -0 as the real cast does.

Inputs must already be clamped to the format's finite range (callers clamp before rounding, as
before a real cast). NaN stays NaN. For formats without negative zero (E4M3-fnuz) a result of
zero is +0, as the real cast gives. ``tests/test_fp8_emulation.py`` proves the emulation
bit-identical to both torch's cast and ml_dtypes on edge-case tables, on every rounding boundary
of each format and on large random tensors.
"""

from __future__ import annotations

import torch

from evalkit.kv.formats import KVFormat


SMALL = 16384  # below this many elements (a decode step's K or V) the cast's two kernels beat seven passes


def round_to_fp8(y: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """Round float32 ``y`` (already clamped to ±fmt.max) to the nearest value of ``fmt``; float32 out.

    Both ways are exact and give the same bits; the faster one is chosen by size."""
    return round_to_fp8_stored(y, fmt)[0]


def round_to_fp8_stored(y: torch.Tensor, fmt: KVFormat) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`round_to_fp8`, plus the float8 tensor where the cast made it (small tensors; None
    when the emulation rounded), so that a cache storing it needs no second cast."""
    if y.numel() <= SMALL:
        stored = y.to(fmt.torch_dtype)
        return stored.to(torch.float32), stored
    return round_to_fp8_emulated(y, fmt), None


def round_to_fp8_emulated(y: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """The integer emulation described above (float32 in and out)."""
    assert y.dtype == torch.float32, "round_to_fp8 works on float32"
    drop = 23 - fmt.mantissa_bits
    # c = 2**(max(e, min_normal_exp) + drop) for |y| in [2**e, 2**(e+1)), built on the exponent bits;
    # adding drop to the exponent field multiplies by 2**drop. NaN's c is garbage, and NaN stays NaN.
    min_normal_bits = (127 + fmt.min_normal_exp) << 23
    c = y.view(torch.int32).bitwise_and(0x7F800000).clamp_(min=min_normal_bits).add_(drop << 23).view(torch.float32)
    out = y.abs().add_(c).sub_(c).copysign_(y)  # |y| + c rounds |y| to a multiple of c * 2**-23 (RNE)
    if not fmt.negative_zero:
        out = out.add_(0.0)  # -0.0 + 0.0 == +0.0; every other value (and NaN) is unchanged
    return out


def round_to_fp8_by_cast(y: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """The reference: torch's own cast there and back (slow on CPU)."""
    return y.to(fmt.torch_dtype).to(torch.float32)
