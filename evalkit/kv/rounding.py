"""Rounding to a float format, and to integer codes, in one of three modes: the one place that rounds.

Modes (:class:`evalkit.kv.formats.Rounding`, the scheme option ``+rounding=``; every quantized format takes each):

* ``rne`` (the default, never written in a scheme string): to nearest, ties to even, what torch's
  float8 casts, ml_dtypes, the OCP MX conversion and CUDA's ``__nv_cvt_float_to_fp8(...,
  __NV_SATFINITE, ...)`` (vLLM's CUDA KV store) do, and ``torch.round`` for integer codes.
* ``rtz``: toward zero (truncation), e.g. vLLM's CPU KV store ``cpu_attn_reshape_and_cache``
  (``csrc/cpu/cpu_attn_fp8.hpp``, ``float_to_fp8e4m3_scalar`` and ``float_to_fp8e5m2_scalar``
  clamp ``x / scale`` to ±max and keep the leading mantissa bits).
  Its two other departures from a plain truncation of ``x / scale`` (a reciprocal multiply, an
  exact zero stored +0, E4M3 subnormals through float32) are ``+recipe=vllm_cpu``:
  :func:`round_vllm_cpu`.
* ``rna``: to nearest, ties away from zero, e.g. SGLang's ``fp4_e2m1`` KV (thresholds
  ``|v| >= 0.25, 0.75, ..., 5``; see :mod:`evalkit.kv.microscaling`).

Every mode saturates: the value is clamped to ±max before it is rounded (callers clamp, as before a
real cast), which for all three equals rounding first and saturating after (max is representable,
so a value above it never rounds below it, and RTZ of anything between max and the next would-be
value is max anyway). E5M2's inf never appears, ±inf inputs become ±max, NaN stays NaN. Results
keep the input's sign (-tiny gives -0) except in formats without negative zero (E4M3-fnuz), whose
zero is +0 as their cast gives. Integer codes: ``rne`` is ``torch.round``, ``rtz`` ``torch.trunc``,
``rna`` the truncation plus one step away from zero where the dropped fraction is at least 0.5;
the mode applies to ``x / scale`` (an asymmetric format's zero point, an integer, is added after,
and is itself rounded to nearest even).

Float formats, round to nearest even (:func:`round_to_fp8_emulated`, the fast path):
torch's float8 casts are correct but, on CPU, a round trip of every layer's K and V over a long
prefill costs more than a few passes of integer arithmetic on the float32 bits (on older torch
about a quarter of a forward of the embedded model; on torch 2.13 still about 1.6 % of a
2048-token forward against 1.2 % for this emulation). For one decode token the two kernels of the
cast are cheaper than seven passes, so :func:`round_to_fp8` picks by size; both give the same bits.
The rounding they perform is simple enough to emulate exactly in a few vectorised float32/int32
operations:

* For ``|y|`` in the binade ``[2**e, 2**(e+1))`` the format's spacing is ``q = 2**(e' - m)`` with
  ``e' = max(e, min_normal_exp)`` (below the smallest normal the spacing stays that of the
  subnormals). ``(|y| + c) - c`` with ``c = q * 2**23`` rounds ``|y|`` to a multiple of ``q`` with
  the FPU's own round-to-nearest-even: the sum lies in c's binade, whose float32 spacing is
  exactly ``q`` (``|y| < 2**(e+1) <= c``), and the subtraction is exact. A round-up to
  ``2**(e+1)`` is the correct carry into the next binade.
* ``c`` is built from the bits of ``y`` in three integer passes: keep the exponent field, clamp it
  below at the smallest normal's, add ``23 - m`` to it. The sign is put back with ``copysign`` so
  that -tiny rounds to -0 as the real cast does.

The same emulation serves FP4 E2M1 (1 mantissa bit, smallest normal 2**0, max 6), whose
``KVFormat`` carries the same two fields.

Toward zero and ties away (:func:`round_to_grid`, which also rounds to nearest even for E2M1 and
clamps ``|y|`` to max itself), in exact float32 arithmetic on ``a = min(|y|, max)``:

* RTZ: the nearest-even result ``t`` is one of the two multiples of ``q`` around ``a``, so the
  truncation is ``t - q`` where ``t > a`` and ``t`` otherwise (``q = c * 2**-23``, a power of two;
  a carry into the next binade steps back to the largest value below it).
* RNA: that truncation ``f`` plus ``q`` where ``2 * (a - f) >= q``. ``a - f`` is exact (both
  are multiples of a's float32 spacing and the difference is below ``a``), doubling is exact, and
  ``f + q`` is the next value up (at most max: ``a <= max`` and max is a multiple of ``q``). (Adding
  ``q/2`` to ``a`` and truncating is not exact: below the smallest normal ``q/2`` can exceed ``a``,
  the sum lands in a wider binade and its own rounding can reach the next multiple of ``q``.)

Subnormals of the format need nothing special (``q`` is then the subnormal spacing), float32
subnormal inputs lie far below any format's smallest subnormal and give ±0, NaN fails every
comparison and stays NaN. These cost about three times the nearest-even passes and always emulate
(torch has no directed float8 cast).

``round_to_fp8_emulated`` needs its input clamped to the format's finite range (callers clamp, as
before a real cast). ``tests/kv/test_fp8_emulation.py`` proves the nearest-even emulation
bit-identical to both torch's cast and ml_dtypes, and ``tests/kv/test_rounding_modes.py`` every mode
and format against a float64 nearest-neighbour search over each format's full table of values
(from ml_dtypes), on every rounding boundary and midpoint, subnormals, ±0, values above max, NaN
and large random tensors.
"""

from __future__ import annotations

import torch

from evalkit.kv.formats import KVFormat, Rounding

SMALL = 16384  # below this many elements (a decode step's K or V) the cast's two kernels beat seven passes


def round_to_fp8(y: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """Round float32 ``y`` (already clamped to ±fmt.max) to ``fmt`` by ``fmt.rounding``; float32 out.

    Nearest even has two exact ways with the same bits (the cast, the emulation), chosen by size."""
    return round_to_fp8_stored(y, fmt)[0]


def round_to_fp8_stored(y: torch.Tensor, fmt: KVFormat) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`round_to_fp8`, plus the float8 tensor where the cast made it (small tensors rounded to
    nearest even; None when the emulation rounded), so that a cache storing it needs no second cast."""
    if fmt.rounding is not Rounding.RNE:
        return round_to_grid(y, fmt, fmt.rounding), None
    if y.numel() <= SMALL:
        stored = y.to(fmt.torch_dtype)
        return stored.to(torch.float32), stored
    return round_to_fp8_emulated(y, fmt), None


def _spacing_constant(y: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """c = 2**(max(e, min_normal_exp) + 23 - m) for |y| in [2**e, 2**(e+1)), built on the exponent
    bits (adding 23 - m to the exponent field multiplies by 2**(23 - m)). NaN's c is garbage."""
    min_normal_bits = (127 + fmt.min_normal_exp) << 23
    drop = 23 - fmt.mantissa_bits
    return y.view(torch.int32).bitwise_and(0x7F800000).clamp_(min=min_normal_bits).add_(drop << 23).view(torch.float32)


def round_to_fp8_emulated(y: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """Round to nearest even by the integer emulation described above (float32 in and out; any
    float format of evalkit's, FP8 or E2M1)."""
    assert y.dtype == torch.float32, "round_to_fp8 works on float32"
    c = _spacing_constant(y, fmt)
    out = y.abs().add_(c).sub_(c).copysign_(y)  # |y| + c rounds |y| to a multiple of c * 2**-23 (RNE)
    if not fmt.negative_zero:
        out = out.add_(0.0)  # -0.0 + 0.0 == +0.0; every other value (and NaN) is unchanged
    return out


def round_to_grid(y: torch.Tensor, fmt: KVFormat, rounding: Rounding | None = None) -> torch.Tensor:
    """Round float32 ``y`` to a value of the float format ``fmt`` by ``rounding`` (default
    ``fmt.rounding``), saturating at ±fmt.max (``y`` need not be clamped: its magnitude is, first);
    float32 out. See the module docstring for why each step is exact."""
    rounding = fmt.rounding if rounding is None else Rounding(rounding)
    assert y.dtype == torch.float32, "round_to_grid works on float32"
    a = y.abs().clamp_(max=fmt.max)  # clamp keeps NaN
    c = _spacing_constant(a, fmt)
    if rounding is Rounding.RNE:
        out = a.add_(c).sub_(c)  # (|y| + c) - c: the FPU's round-to-nearest-even
    else:
        out = (a + c).sub_(c)  # nearest even, one of the two multiples of q around a
        q = c.mul_(2.0**-23)  # the spacing at a (a power of two)
        out = out.sub_(torch.gt(out, a).to(torch.float32).mul_(q))  # toward zero: one step back where it rounded up
        if rounding is Rounding.RNA:  # one step away where the truncated remainder is at least q/2
            out = out.add_(q.mul_(a.sub_(out).mul_(2.0).ge_(q)))
    out = out.copysign_(y)
    if not fmt.negative_zero:
        out = out.add_(0.0)
    return out


def vllm_cpu_quotient(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """vLLM's CPU FP8 store's ``v *= inv_scale``: ``x`` times the float32 reciprocal of the scale (float32)."""
    return x * (1.0 / scale.to(torch.float32))


def round_vllm_cpu(y: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """Float32 ``y`` (the quotient, :func:`vllm_cpu_quotient`) to a code of ``fmt`` (FP8 E4M3 or E5M2)
    as vLLM's CPU KV store writes it (``csrc/cpu/cpu_attn_fp8.hpp``, ``float_to_fp8e4m3_scalar`` and
    ``float_to_fp8e5m2_scalar``; the scheme option ``+recipe=vllm_cpu`` with ``+rounding=rtz``):

    * clamp to ±max, then ``if (v == 0.0f) return 0``: a quotient of ±0 is stored +0 (a nonzero one
      that truncates to zero keeps its sign, -0);
    * E4M3 maps ``v`` onto float32's exponent range by ``v * 2**-120`` and keeps the top bits of the
      product. Below E4M3's smallest normal (2**-6) that product is a float32 *subnormal*, which the
      FPU rounds to nearest even at 2**-149, i.e. ``v`` to a multiple of 2**-29, before the bits are
      truncated: a value at most 2**-30 under a code is stored as that code. Emulated exactly as
      ``(|v| + 2**-6) - 2**-6`` (the sum's float32 spacing is 2**-29) where ``|v| < 2**-6``; a
      processor that flushes subnormals to zero (FTZ) would store 0 there instead (vLLM does not
      set it; measured). E5M2 shifts the mantissa bits instead and truncates exactly;
    * then toward zero (:func:`round_to_grid`).

    NaN stays NaN here (the store writes +max; evalkit flags non-finite K/V instead)."""
    assert y.dtype == torch.float32, "round_vllm_cpu works on float32"
    y = y.clamp(-fmt.max, fmt.max)
    zero = y == 0  # -0.0 == 0: an exact-zero quotient is stored +0 (decided before the subnormal step below)
    if (fmt.mantissa_bits, fmt.min_normal_exp) == (3, -6):  # E4M3: the float32-subnormal step of the bias shift
        c = 2.0**fmt.min_normal_exp
        tiny = y.abs() < c
        y = torch.where(tiny, (y.abs() + c).sub_(c).copysign_(y), y)
    out = round_to_grid(y, fmt, Rounding.RTZ)
    return out.masked_fill_(zero, 0.0)


def round_to_fp8_by_cast(y: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """The reference: torch's own cast there and back (slow on CPU; nearest even only)."""
    return y.to(fmt.torch_dtype).to(torch.float32)


def round_integer(y: torch.Tensor, rounding: Rounding = Rounding.RNE) -> torch.Tensor:
    """Round float32 ``y`` to integers by ``rounding`` (NaN stays NaN); the caller clamps to the codes."""
    if rounding is Rounding.RNE:
        return torch.round(y)
    t = torch.trunc(y)
    if rounding is Rounding.RTZ:
        return t
    return torch.where((y - t).abs() >= 0.5, t + torch.sign(y), t)  # y - t is exact: the dropped fraction
