"""SGLang's ``--kv-cache-dtype mxfp8`` (FA4 backend): K, V and Q as its Triton kernels quantize them.

Read in SGLang's source (sgl-project/sglang, ``python/sglang/kernels/ops/quantization/mxfp8_quant.py`` at
commit 1634ee4e; issue 52 names the 0.5.23 wheel's copy ``kernels/ops/kvcache/mxfp8_quant_store_kv.py``, whose
formula it quotes identically). Nothing is copied. ``_mxfp8_quant_store_qkv_kernel`` (``:98-163``, the store
``quant_store_kv_mxfp8`` runs, ``:166-``) and ``_mxfp8_quant_kernel`` (``:20-60``, behind ``to_mxfp8``, which
quantizes Q) compute, for each token and head, each block of 32 consecutive values along head_dim
(``off2 = blk * 32 + arange(32)``; ``head_dim % 32 == 0`` is asserted), in float32 (``:133-139``):

- ``amax = max(max|x|, 1e-30)``;
- ``byte = clamp(ceil(log2(amax / 448)) + 127, 0, 254)`` (UE8M0; 255, the E8M0 NaN, is never written);
- ``codes = e4m3(clamp(x / 2**(byte - 127), -448, 448))``: the scale used is the clamped one, and the cast is
  Triton's default float32 -> fp8e4nv conversion, to nearest, ties to even (torch's ``.to(float8_e4m3fn)``);
- a value reads back as ``code * 2**(byte - 127)`` (SGLang's ``from_mxfp8``, the file's last function; exact in
  float32); FA4 applies the same scales inside its block-scaled QK and its V dequantization.

Edge values, from that arithmetic: an all-zero block has amax 1e-30 (float32), so byte 19 and all-zero codes;
a block whose amax is below 1e-30 keeps byte 19 (its values are multiplied by 2**108, nothing saturates); the
byte clamp [0, 254] is reached only by an infinite amax (254: 2**127), since 1e-30 / 448 > 2**-127 and a finite
float32 amax / 448 < 2**127; values never saturate except by that clamp (``amax / 2**exponent <= 448``).
NaN: the kernel's ``max`` and ``log2`` give no defined byte; evalkit flags a non-finite K/V/Q (the run's
non-finite check) rather than model it.

Exactness: evalkit takes ``ceil(log2(amax / 448))`` from the float32 quotient's bits (``torch.frexp``), never
from a float ``log2``. SGLang's Triton runs the GPU's approximate ``log2`` and division; for a BF16 or FP16
amax the quotient is at least 1/2048 (relative) away from a power of two unless it is one, far beyond either
approximation's error, so the byte is the same; for float32 K/V an amax within a few ulps of ``448 * 2**k`` may
get the neighbouring byte on the GPU (not modelled).

Where it is stored: the codes in the K/V buffers (one byte per value, ``[slot, head, head_dim]``), the scale
bytes in separate ``k``/``v`` scale buffers in FA4's interleaved ``BlockScaledBasicChunk`` layout (a page of
``PAGE`` tokens holds ``(heads, 32, PAGE // 32, head_dim // 32)`` bytes, ``:155-163``): ``head_dim / 32`` bytes
per token and head, no padding. evalkit's slot keeps each (token, head)'s codes then its scale bytes
(``head_dim + head_dim / 32`` bytes per side), the same count; the page order of the scales is not modelled.

Q: the model's attention quantizes Q with ``to_mxfp8`` (the same rule, per token and head along head_dim) and
hands its bytes and scales to FA4 as ``q`` and ``q_descale`` ("Block-scaled QK + in-kernel V dequant ...
Q/K/V all quantize to fp8", read where a model's attention checks ``kv_cache_dtype == "mxfp8"``). The block-scaled
QK product is, in exact arithmetic, the product of the dequantized Q and K, so evalkit hands attention the
dequantized Q (:func:`round_query`); FA4's accumulation order and its in-kernel V dequantization are not
modelled (compare logits statistically).
"""

from __future__ import annotations

import torch

BLOCK = 32
E4M3_MAX = 448.0
AMAX_FLOOR = 1e-30
BIAS = 127
BYTE_MAX = 254


def scale_bytes(x: torch.Tensor) -> torch.Tensor:
    """(..., n) -> (..., n / 32) uint8: ``clamp(ceil(log2(max(amax, 1e-30) / 448)) + 127, 0, 254)`` per block."""
    t = x.float().reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    amax = torch.clamp_min(t.abs().amax(dim=-1), AMAX_FLOOR)
    s = amax / torch.tensor(E4M3_MAX, dtype=torch.float32, device=amax.device)
    m, e = torch.frexp(s)  # s = m * 2**e, 0.5 <= m < 1: ceil(log2 s) = e, or e - 1 when s is a power of two
    exponent = e - (m == 0.5).to(e.dtype)
    exponent = torch.where(torch.isinf(s), torch.full_like(exponent, BYTE_MAX - BIAS), exponent)
    return torch.clamp(exponent + BIAS, 0, BYTE_MAX).to(torch.uint8)


def encode(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., n) -> (E4M3 codes (..., n), UE8M0 scale bytes (..., n / 32)), as SGLang's store writes them."""
    if x.shape[-1] % BLOCK:
        raise ValueError(f"SGLang's mxfp8 needs head_dim % {BLOCK} == 0, got {x.shape[-1]}")
    sb = scale_bytes(x)
    t = x.float().reshape(*x.shape[:-1], -1, BLOCK)
    y = torch.ldexp(t, -(sb.to(torch.int32) - BIAS)[..., None].float())  # x / 2**(byte - 127): exact
    codes = y.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).reshape(x.shape)
    return codes, sb


def decode(codes: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """E4M3 codes (..., n) and UE8M0 bytes (..., n / 32) -> float32 ``code * 2**(byte - 127)``."""
    t = codes.float().reshape(*codes.shape[:-1], -1, BLOCK)
    return torch.ldexp(t, sb.to(torch.int32)[..., None].float() - BIAS).reshape(codes.shape)


def round_query(query: torch.Tensor) -> torch.Tensor:
    """Q as FA4 reads it under ``mxfp8``: ``to_mxfp8`` then the block scales, in Q's dtype (exact in BF16 and
    float32: an E4M3 code has 4 significant bits and float32's exponent range; an FP16 Q rounds the values below
    FP16's smallest subnormal)."""
    codes, sb = encode(query)
    return decode(codes, sb).to(query.dtype)
