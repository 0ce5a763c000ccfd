"""FP4 (E2M1) elements and the scale encodings of the microscaling KV formats, bit for bit.

Sources read (public): the OCP Microscaling Formats (MX) Specification v1.0 (E2M1, E8M0, the
shared-scale rule of section 6.3); Microsoft's ``microxcaling`` reference library, which
implements that section (``_quantize_mx``); NVIDIA's NVFP4 recipe as published in
TensorRT-Model-Optimizer (``modelopt/torch/quantization/qtensor/nvfp4_tensor.py``,
``NVFP4QTensor``) and in the NVFP4 quantization kernel vLLM carries
(``csrc/quantization/fp4/nvfp4_utils.cuh``, ``cvt_warp_fp16_to_fp4``); SGLang's FP4 KV cache
(``python/sglang/srt/layers/quantization/kvfp4_tensor.py``, ``memory_pool.py``, and
``docs/advanced_features/quantized_kv_cache.md``). Nothing is copied from them.

E2M1 (``round_to_e2m1``)
    One sign bit, two exponent bits (bias 1), one mantissa bit: magnitudes
    {0, 0.5, 1, 1.5, 2, 3, 4, 6}, no inf, no NaN, a negative zero. The spacing is 0.5 below 2,
    1 in [2, 4) and 2 in [4, 6]. Rounding is saturating (anything beyond ±6 becomes ±6, as the MX
    spec's conversion and NVIDIA's ``cvt.rn.satfinite.e2m1x2.f32`` do) and by default to nearest,
    ties to the even code (the one whose mantissa bit is 0); ``rounding=rtz`` / ``rna`` round
    toward zero or ties away. It runs in every attention layer, so it is the float trick of
    ``evalkit.kv.rounding`` (which does all rounding) with E2M1's fields: for ``a = |y|`` in a
    binade whose E2M1 spacing is ``q``, ``(a + c) - c`` with ``c = q * 2**23`` rounds ``a`` to a
    multiple of ``q`` by the FPU's own round-to-nearest-even (the sum lies in c's binade, whose
    float32 spacing is ``q``; the subtraction is exact). ``c`` is ``2**22``, ``2**23`` or
    ``2**24``, built in integer passes from the exponent bits of ``a`` (at least the smallest
    normal's, 2**0). A round-up such as 1.75 -> 2 is the correct carry. In float32 ties-to-even
    on the multiples of ``q`` is exactly ties-to-even-code in E2M1, so 0.25 -> 0, 0.75 -> 1,
    1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4 (ties away: 0.5, 1, 1.5, 2, 3, 4, 6). The
    sign is put back with ``copysign``, so -0.1 -> -0 and -0 -> -0 as ``ml_dtypes.float4_e2m1fn``
    gives. NaN: E2M1 has none (``ml_dtypes`` turns NaN into -0); here a NaN input stays NaN in the
    float32 output, so the caller's non-finite check sees it.

Codes and packing (``e2m1_to_code``, ``code_to_e2m1``, ``pack_fp4``, ``unpack_fp4``)
    The OCP bit layout S E E M: bit 3 is the sign, bits 2..0 index the magnitude table above
    (so 0x8 is -0). Two codes per byte along the last dimension, the element with the lower
    index in the low nibble (the layout of SGLang's, ModelOpt's and vLLM's FP4 buffers).

E8M0 shared scale of the MX formats (``e8m0_scale``)
    One scale per block of 32 elements: ``X = 2**(floor(log2(amax)) - emax_elem)`` with the
    element format's largest exponent (E2M1: 2, since 6 = 1.5 * 2**2; E4M3: 8, since
    448 = 1.75 * 2**8), clamped to the E8M0 range [2**-127, 2**127] (codes 0..254; 255 is NaN).
    The elements ``V / X`` are then cast with saturation: ``amax / X`` lies in [2**emax,
    2**(emax+1)), so for MXFP4 values in (6, 8) * X clamp to 6 (the spec accepts that loss).
    ``floor(log2(amax))`` is read exactly from the float32 exponent (``torch.frexp``: amax =
    m * 2**e with m in [0.5, 1), so floor(log2) = e - 1, subnormals included), never from a float
    ``log2``, which can round 2**k - ulp up to k. amax == 0 gives 2**-127, the smallest E8M0
    value (the reference library gets there too, by clamping); the block's elements are all zero
    whatever the scale. NaN or inf amax gives NaN (the E8M0 NaN code). The sign of amax is
    ignored.

E4M3 scales (``round_scale_to_e4m3``)
    FP8 E4M3 ('fn': max 448, subnormals down to 2**-9), round to nearest even, saturating at 448
    (+inf saturates too, as ``__NV_SATFINITE`` does), NaN stays NaN. A scale below 2**-9 (zero,
    a tiny value, a negative) is raised to 2**-9 before the cast so that it never rounds to 0 and
    no one divides by zero; ModelOpt clamps the same way before its cast.

NVFP4 two-level scales (``nvfp4_scales``)
    E2M1 elements, one E4M3 scale per 16 elements, one FP32 scale per tensor. ModelOpt's recipe,
    step by step in float32: ``global = tensor_amax / (448 * 6)``; ``s = group_amax / (6 *
    global)``; a group scale of exactly 0 becomes 1.0; then ``s`` is clamped to [2**-9, 448] and
    cast to E4M3. The elements are ``x / (s_e4m3 * global)`` rounded to E2M1. The kernels that
    engines run (``cvt_warp_fp16_to_fp4``) compute the same quantities with multiplications by
    approximate reciprocals (``rcp.approx.ftz``), so they can differ from this reference by one
    float32 ulp before a rounding and, rarely, by one code; they write scale 0 and all-zero codes
    for an all-zero group. Where the recipe has no answer this module defines one:
    tensor_amax == 0 (0/0 in ModelOpt) gives a global scale of 1.0; a NaN or inf tensor_amax or
    group_amax gives NaN scales; a group amax above the tensor amax (a stale static tensor amax)
    saturates the group scale at 448 and then the elements at ±6. ``nvfp4_global_scale`` and
    ``nvfp4_group_scales`` are the two steps, so that a cache can keep the global scale of a
    sequence's first write and reuse it for later tokens.

NVFP4 in a KV cache: where the per-tensor scale comes from
    Engines keep one FP32 scale per layer for K and one for V and never recompute it per token:
    vLLM's NVFP4 store kernel (``csrc/.../nvfp4_kv_cache_kernels.cu``,
    ``reshape_and_cache_nvfp4_kernel``, vLLM PRs #37332 and #40177) quantizes every token with
    ``global = 1 / k_scale`` (``v_scale``), the layer's scale from the checkpoint (ModelOpt
    calibration) or from vLLM's one-time ``calculate_kv_scales`` estimate on the first batch;
    SGLang's ``NVFP4KVQuantizeUtil`` refuses to run without a per-layer global scale; flashinfer's
    ``nvfp4_quantize_paged_kv_cache`` derives it from the amax when none is given. evalkit models
    the dynamic case as it models ``tensor/dynamic`` FP8 scales: from each sequence's first write
    (its prefill, padding left out), then frozen for the tokens that follow, so later tokens beyond
    that range saturate (group scale 448, elements ±6). The scale a code is multiplied by is
    ``float32(group * global)``, the product vLLM's reference dequantizer
    (``tests/kernels/quantization/nvfp4_utils.py``, ``dequant_nvfp4_kv_cache``) and ModelOpt form;
    the attention kernels fold ``global`` into their softmax and output scales instead, which can
    differ in the last float32 bit.

SGLang's fp4_e2m1 KV (``sglang_e8m0_scale``, ``sglang_zero_sign``; elements ``rounding=rna``)
    What ``FP4MXBlock16KVQuantizeUtil.batched_quantize`` in SGLang's ``kvfp4_tensor.py`` computes
    (see ``SGLANG_FP4_BLOCK`` below), re-derived: the exponent is
    ``ceil(log2(max(amax / 6, 1e-10)))`` evaluated with torch's float ``log2`` in the dtype of the
    K/V (SGLang runs it on the BF16 cache input; evalkit does the same for BF16 K/V and uses
    float32 otherwise), so it lies in [-33, 126] and is stored as the byte ``exponent + 127``;
    evalkit takes that ``ceil(log2)`` as a correctly rounded float32 ``log2`` (then rounded to BF16
    for BF16 K/V, as torch computes a BF16 ``log2``) gives it, exactly, from the exponent bits
    (:func:`evalkit.kv.device_exact.log2_ceil`), so it does not depend on the device's ``log2``;
    ``amax / 2**exponent <= 6`` (up to that ``log2``'s own rounding), so nothing saturates except
    through that rounding. The elements are ``v = x / 2**exponent`` (exact: a power of two) mapped
    to the E2M1 magnitude with index ``#{b in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) : |v| >= b}``,
    so ties round away from zero (0.25 -> 0.5, 2.5 -> 3, 5 -> 6) and anything above 5 becomes 6:
    exactly ``round_to_e2m1(v, Rounding.RNA)`` (saturating ties-away rounding; tested against the
    thresholds), which is what the named scheme ``sglang_fp4`` sets (``rounding=rna``). The sign
    is ``v < 0``, so -0.0 gives +0 and -0.1 gives -0: the one difference from a sign-keeping
    rounding, applied by ``recipe=sglang`` (``sglang_zero_sign``). NaN gives +0 there
    (comparisons are false); here it stays NaN so the caller's non-finite check sees it.
    amax == 0 gives 2**-33 (the 1e-10 floor) and all-zero codes. NaN or inf amax gives NaN.
"""

from __future__ import annotations

import functools

import torch

from evalkit.errors import SchemeError
from evalkit.kv.device_exact import divide, log2_ceil, power_of_two
from evalkit.kv.formats import FORMATS, Rounding
from evalkit.kv.packing import pack_nibbles, unpack_nibbles
from evalkit.kv.rounding import round_to_grid

E2M1_MAX = 6.0
E2M1_EMAX = 2  # 6 = 1.5 * 2**2
E4M3_MAX = 448.0
E4M3_EMAX = 8  # 448 = 1.75 * 2**8
E4M3_SMALLEST_SUBNORMAL = 2.0**-9
E8M0_MIN_EXP = -127
E8M0_MAX_EXP = 127

MX_BLOCK = 32  # OCP MX v1.0: elements per shared E8M0 scale
NVFP4_BLOCK = 16  # NVFP4: elements per E4M3 scale
NVFP4_GLOBAL_DIVISOR = E4M3_MAX * E2M1_MAX  # 2688: the tensor amax maps to the largest e4m3 x e2m1 product

SGLANG_FP4_BLOCK = 16
SGLANG_FP4_SCALE_DTYPE = "e8m0"
"""SGLang's ``--kv-cache-dtype fp4_e2m1``: 16 elements per scale along head_dim, E8M0 scales.

Read in SGLang's source: ``python/sglang/srt/layers/quantization/kvfp4_tensor.py``
(``FP4MXBlock16KVQuantizeUtil``, aliased ``BlockFP4KVQuantizeUtil``, earlier named
``KVFP4QuantizeUtil``: "Similar to MXFP4 but uses block_size=16 (MXFP4 spec defines
block_size=32). Each block of 16 elements shares one uint8 exponent-only scale factor") and
``python/sglang/srt/mem_cache/memory_pool.py`` (``MHATokenToKVPoolFP4``: K/V buffers
``uint8 [slots, heads, head_dim // 2]``, scale buffers ``uint8 [slots, heads * head_dim // 16]``,
``scale_block_size = 16``); the docs page
``docs/advanced_features/quantized_kv_cache.md`` says the same ("SGLang's current implementation
uses blocks of 16 elements for KV cache quantization"; 4.5 bits a value, 3.56x BF16's tokens).
The blocks are contiguous runs of 16 in a [heads, head_dim] row, so with head_dim a multiple of
16 they lie along head_dim. The scale byte is a biased exponent, value ``2**(byte - 127)``:
E8M0's encoding. SGLang's rule differs from the OCP one above (``e8m0_scale``), which
evalkit's code must model separately if it wants SGLang's exact codes: its exponent is
``ceil(log2(max(amax / 6, 1e-10)))`` computed with float ``log2`` (so ``amax / X <= 6``, up to
that log2's rounding, and nothing saturates, at the cost of up to one binade of resolution); its element rounding counts
the thresholds ``|v| >= (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5)``, so ties round away from zero,
not to even; the sign bit is ``v < 0``; a per-tensor ``k_scale``/``v_scale``, when the checkpoint
has one, divides the values first. The same file also has an NVFP4 KV recipe
(``NVFP4KVQuantizeUtil``: flashinfer, E4M3 scales per 16 plus an FP32 global scale), which is
not what ``fp4_e2m1`` selects in ``MHATokenToKVPoolFP4``.
"""

_E2M1 = FORMATS["fp4_e2m1"]  # 1 mantissa bit, smallest normal 2**0, max 6: what the rounding reads


def round_to_e2m1(y: torch.Tensor, rounding: Rounding = Rounding.RNE) -> torch.Tensor:
    """Round to an E2M1 value by ``rounding`` (default nearest, ties to even), saturating at ±6;
    float32 in and out.

    -0 and small negatives give -0; ±inf gives ±6; NaN stays NaN (E2M1 has no NaN).
    """
    return round_to_grid(y.to(torch.float32), _E2M1, rounding)  # saturates at ±6 (fmt.max)


def float_to_code(values: torch.Tensor, fmt, check: bool = True) -> torch.Tensor:
    """Codes (uint8: sign bit ``fmt.bits - 1``, magnitude index below it) of exact values of a float
    format stored as its own codes (``fmt.own_codes``: E2M1), from its :attr:`code_magnitudes`.

    The values must already lie on the format's grid; anything else, NaN included, raises
    ValueError. -0 gives the sign bit alone. ``check=False`` skips that check (and its read back to
    the host): NaN then gives code 0, as SGLang's quantizer writes it."""
    values = values.to(torch.float32)
    magnitudes = fmt.code_magnitudes
    table = values.new_tensor(magnitudes)
    magnitude = values.abs().contiguous()
    index = torch.searchsorted(table, magnitude).clamp_(max=len(magnitudes) - 1)
    if check and not bool((table[index] == magnitude).all()):
        raise ValueError(f"{fmt.name} codes need values on its grid; round them with round_to_grid first")
    codes = index.to(torch.uint8).bitwise_or_(torch.signbit(values).to(torch.uint8) << (fmt.bits - 1))
    return codes if check else codes.masked_fill_(torch.isnan(values), 0)


def code_to_float(codes: torch.Tensor, fmt, check: bool = True) -> torch.Tensor:
    """The float32 value of each code of a float format stored as its own codes (inverse of :func:`float_to_code`).

    ``check=False`` skips the range check (a read of the device), for codes a store wrote itself."""
    if check:
        _check_codes(codes)
    return _code_table(fmt.name, tuple(fmt.code_magnitudes), fmt.bits, codes.device)[codes.long()]


@functools.lru_cache(maxsize=64)
def _code_table(name: str, magnitudes: tuple, bits: int, device: torch.device) -> torch.Tensor:
    """Each code's float32 value, made once per format and device (no host-to-device copy per read)."""
    by_code = [0.0] * 2**bits
    for i, m in enumerate(magnitudes):
        by_code[i], by_code[i + 2 ** (bits - 1)] = m, -m
    return torch.tensor(by_code, dtype=torch.float32, device=device)


def e2m1_to_code(values: torch.Tensor, check: bool = True) -> torch.Tensor:
    """4-bit codes (uint8, 0..15: sign bit 3, magnitude index bits 2..0) of exact E2M1 values
    (:func:`float_to_code` for E2M1; values from ``round_to_e2m1``). -0 gives code 8."""
    return float_to_code(values, _E2M1, check)


def code_to_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """The float32 value of each 4-bit E2M1 code (0..15); code 8 is -0.0."""
    return code_to_float(codes, _E2M1)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte along the last dimension, element 2i in the low nibble; uint8 out."""
    _check_codes(codes)
    if codes.shape[-1] % 2:
        raise SchemeError(
            f"FP4 stores two values per byte along head_dim, so head_dim must be even; it is {codes.shape[-1]}"
        )
    return pack_nibbles(codes)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of ``pack_fp4``: uint8 [..., n] -> codes uint8 [..., 2n]."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"unpack_fp4 takes uint8 bytes, not {packed.dtype}")
    return unpack_nibbles(packed)


def e8m0_scale(amax: torch.Tensor, elem_emax: int) -> torch.Tensor:
    """The OCP MX shared scale ``2**(floor(log2(amax)) - elem_emax)`` in [2**-127, 2**127]; float32.

    elem_emax: 2 for E2M1 (MXFP4), 8 for E4M3 (MXFP8). amax == 0 gives 2**-127; NaN or inf amax
    gives NaN. Every result is exactly representable as float8_e8m0fnu.
    """
    amax = amax.to(torch.float32)
    _, exponent = torch.frexp(amax)  # amax = m * 2**exponent, 0.5 <= |m| < 1, so floor(log2) = exponent - 1
    shared = (exponent.to(torch.int64) - 1 - elem_emax).clamp_(E8M0_MIN_EXP, E8M0_MAX_EXP)
    shared = shared.masked_fill_(amax == 0, E8M0_MIN_EXP)
    scale = power_of_two(shared)
    return scale.masked_fill_(~torch.isfinite(amax), float("nan"))


def round_scale_to_e4m3(s: torch.Tensor) -> torch.Tensor:
    """Round scales to FP8 E4M3 (nearest even), kept in [2**-9, 448]; float32 out.

    Below 2**-9 (zero, tiny, negative) gives 2**-9, so no scale is ever 0; above 448, +inf
    included, gives 448; NaN stays NaN.
    """
    s = s.to(torch.float32).clamp(min=E4M3_SMALLEST_SUBNORMAL, max=E4M3_MAX)  # clamp keeps NaN
    return s.to(torch.float8_e4m3fn).to(torch.float32)


def nvfp4_scales(group_amax: torch.Tensor, tensor_amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4's scales: (E4M3 group scales as float32, FP32 per-tensor scale), ModelOpt's recipe.

    ``global = tensor_amax / 2688``; ``group = e4m3(group_amax / (6 * global))`` with 0 -> 1.0
    and the E4M3 range [2**-9, 448]; a group's elements are ``x / (group * global)`` in E2M1.
    ``tensor_amax`` must broadcast against ``group_amax`` (a scalar, or one value per head).
    tensor_amax == 0 gives a global scale of 1.0; NaN or inf in either amax gives NaN scales.
    """
    global_scale = nvfp4_global_scale(tensor_amax)
    return nvfp4_group_scales(group_amax, global_scale), global_scale


def nvfp4_global_scale(tensor_amax: torch.Tensor) -> torch.Tensor:
    """NVFP4's FP32 per-tensor scale ``tensor_amax / 2688``, at least float32's smallest normal (so
    that a tiny amax never underflows it to 0); 0 gives 1.0, NaN or inf gives NaN."""
    tensor_amax = tensor_amax.to(torch.float32)
    # floored at float32's smallest normal: below a tensor amax of about 4e-42 the quotient underflows to 0
    global_scale = divide(tensor_amax, NVFP4_GLOBAL_DIVISOR).clamp_(min=torch.finfo(torch.float32).tiny)
    global_scale = global_scale.masked_fill(tensor_amax == 0, 1.0)
    return global_scale.masked_fill_(~torch.isfinite(tensor_amax), float("nan"))


def nvfp4_group_scales(group_amax: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """NVFP4's E4M3 group scales (as float32) under a given global scale: ``e4m3(group_amax / (6 *
    global))``, 0 -> 1.0, kept in [2**-9, 448]; NaN or inf group_amax gives NaN."""
    group_amax = group_amax.to(torch.float32)
    wanted = group_amax / (E2M1_MAX * global_scale)
    wanted = wanted.masked_fill(wanted == 0, 1.0)
    group_scale = round_scale_to_e4m3(wanted)
    return group_scale.masked_fill_(~torch.isfinite(group_amax), float("nan"))


SGLANG_FP4_MIN_RATIO = 1e-10  # the floor SGLang puts under amax / 6 before log2


def sglang_e8m0_scale(amax: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """SGLang's fp4_e2m1 KV scale ``2**ceil(log2(max(amax / 6, 1e-10)))`` (float32 out).

    The division, floor and ``log2`` run in ``compute_dtype`` as SGLang runs them in the K/V's
    dtype (pass torch.bfloat16 for a BF16 cache). NaN or inf amax gives NaN.
    """
    ratio = divide(amax.to(compute_dtype), E2M1_MAX).clamp(min=SGLANG_FP4_MIN_RATIO)
    exponent = log2_ceil(ratio)
    scale = power_of_two(exponent.nan_to_num(0.0, 0.0, 0.0).clamp_(-149, 127))
    return scale.masked_fill_(~torch.isfinite(amax.to(torch.float32)), float("nan"))


def sglang_zero_sign(y: torch.Tensor, rounded: torch.Tensor) -> torch.Tensor:
    """SGLang's E2M1 sign bit is ``v < 0``: where the input ``y`` is ±0 the element is +0 (in place
    on ``rounded``); a negative input that rounds to zero stays -0, every other element keeps its value."""
    return rounded.masked_fill_(y == 0, 0.0)


def _check_codes(codes: torch.Tensor) -> None:
    if codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
        raise TypeError(f"FP4 codes are integers (uint8), not {codes.dtype}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > 15):
        raise ValueError("FP4 codes are 4-bit: 0..15")
