"""vLLM's ``--kv-cache-dtype int4_per_token_head``, modelled on its store kernel.

Read in vLLM 0.32, ``vllm/v1/attention/ops/int4_per_token_head.py``: ``reshape_and_cache_int4``
(the launcher) and ``_reshape_cache_int4_kernel`` (one Triton program per token and KV head; K and
V alike, all float32):

1. Rotation: ``single_rht(x.float()).to(x.dtype)``: ``H (D x)``, the unnormalised Walsh-Hadamard
   transform of the signed values (:func:`evalkit.kv.hadamard.single_rht`, vLLM's sign vector of
   round 0; block-diagonal over the largest power-of-two divisor ``b`` of ``head_size``), rounded
   back to the model's dtype before the kernel loads it.
2. ``scale = max((max - min) / 15, 1e-6)`` over the head's rotated values (no range forced to
   include 0); ``zp = clamp(int(-min / scale +- 0.5), 0, 15)`` (half away from zero, then the
   truncating float -> int32 conversion). Modelled as the correctly rounded quotient on every device
   (:func:`evalkit.kv.device_exact.divide`), as the Triton interpreter computes it; compiled, Triton's
   float32 ``/`` is a reciprocal and a multiply (``div.full.f32``), which for the per-token-head
   INT8/FP8 kernel stores ``fl(amax * fl(1/QMAX))`` (measured on an H200). Whether the INT4 kernel's
   ``/ 15.0`` compiles to ``fl(range * fl(1/15))`` is not measured: vLLM rotates with Hadacore on CUDA,
   so the store could not be compared there (issue 39).
3. ``q = clamp(int(y * (1 / scale) + zp +- 0.5), 0, 15)``: a reciprocal, a multiply, the zero point
   added, half away from zero, truncation, clamp. Values above ``min + 15 * scale`` (none) or a
   minimum above 0 (then ``zp`` clamps to 0 and the top codes saturate) are the kernel's own.
4. Packing: codes ``2i`` and ``2i + 1`` share byte ``i`` (low nibble first); ``head_size / 2`` bytes.
   The scale is stored as a float32 whose 4 lowest mantissa bits are replaced by ``zp``
   ("zero-point steganography"): 4 bytes, no separate zero point.

The read side (``_attn_packed``) takes ``scale' = bits(scale) & ~0xF`` as the scale and ``bits & 0xF``
as the zero point, and works in the rotated space: queries rotated the same way, the softmax scale
divided by ``b`` and the output rotated back. Here the dequantized values are taken back to the
original space instead, ``D H ((q - zp) * scale') / b`` (:func:`evalkit.kv.hadamard.single_rht_inverse`),
the same product in exact arithmetic. What is approximate: on CUDA sm80+ the rotation runs in
Hadacore (a bf16 tensor-core kernel, then ``* sqrt(d)``), not this float32 butterfly (vLLM's CPU/
fallback tier); for a BF16 model the two agree once rounded to BF16 except where the float32 sum
lands within a BF16 rounding tie. The query's rotation (rounded to the model's dtype) is attention
precision, not storage, and is not modelled. Triton on NVIDIA may fuse ``y * inv + zp`` into one FMA
(one rounding instead of two); the interpreter, and this model, round twice.

Bytes per token and head: ``(hs_k + hs_v) / 2 + 2 * 4`` (``TritonAttentionBackend.customize_spec``).
Head sizes: the Triton backend's ``>= 32``, and even (two codes per byte). Prefill attends from the
cache (``unified_attention`` on the packed cache), so the prefill reads quantized K/V too.
"""

from __future__ import annotations

import torch

from evalkit.errors import SchemeError
from evalkit.kv import packing
from evalkit.kv.codecs.slot import TOKEN, Codec, packed
from evalkit.kv.device_exact import divide
from evalkit.kv.formats import CodecRecipe
from evalkit.kv.hadamard import single_rht, single_rht_inverse
from evalkit.kv.quantize import Quantized

NAME = "int4_per_token_head"
SCALE_MIN = 1e-6
QMAX = 15.0
MIN_HEAD_SIZE = 32  # TritonAttentionBackend.supports_head_size
ZP_MASK = 0xF


def check_head_size(head_size: int) -> None:
    if head_size < MIN_HEAD_SIZE or head_size % 2:
        raise SchemeError(
            f"vllm:{NAME} runs on vLLM's Triton attention backend with two codes per byte, which needs an even "
            f"head_size >= {MIN_HEAD_SIZE}, not {head_size}: use vllm:fp8 for this model"
        )


def width(role: str, head_size: int) -> int:
    """Bytes of K (or V) per token and head: packed codes, then the float32 scale carrying the zero point."""
    return head_size // 2 + 4


def _round_half_away(t: torch.Tensor) -> torch.Tensor:
    """``int(t + 0.5)`` for t >= 0 else ``int(t - 0.5)``: float32 additions, then truncation."""
    return torch.trunc(torch.where(t >= 0, t + 0.5, t - 0.5))


def rotate(x: torch.Tensor) -> torch.Tensor:
    """Step 1: the rotated values the kernel loads (float32, after the round trip to x's dtype)."""
    return single_rht(x.float()).to(x.dtype).float()


def quantize_rotated(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Steps 2-3 on rotated float32 ``y`` (..., D): (codes 0..15 float32, scale (..., 1), zp (..., 1))."""
    lo = y.amin(dim=-1, keepdim=True)
    hi = y.amax(dim=-1, keepdim=True)
    scale = torch.clamp_min(divide(hi - lo, QMAX), SCALE_MIN)
    zp = _round_half_away(-lo / scale).clamp(0.0, QMAX)
    inv = torch.ones_like(scale) / scale
    codes = _round_half_away(y * inv + zp).clamp(0.0, QMAX)
    return codes, scale, zp


def stego_scale(scale: torch.Tensor, zp: torch.Tensor) -> torch.Tensor:
    """The stored float32: the scale's bits with the low 4 replaced by the zero point."""
    bits = scale.contiguous().view(torch.int32)
    return ((bits & ~ZP_MASK) | zp.to(torch.int32)).view(torch.float32)


def read_scale(stored_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What the read kernel takes from the stored float32: (scale with the low 4 bits cleared, zero point)."""
    bits = stored_scale.contiguous().view(torch.int32)
    return (bits & ~ZP_MASK).view(torch.float32), (bits & ZP_MASK).float()


def encode(x: torch.Tensor, role: str = "k") -> Quantized:
    check_head_size(x.shape[-1])
    y = rotate(x)
    codes, scale, zp = quantize_rotated(y)
    stored_scale = stego_scale(scale, zp)
    stored = torch.cat([packing.pack_nibbles(codes), packing.float32_bytes(stored_scale)], dim=-1)
    s, z = read_scale(stored_scale)
    values = single_rht_inverse((codes - z) * s)
    nonfinite = ~torch.isfinite(y).all()
    return packed(codes, stored, values, nonfinite)


def decode(stored: torch.Tensor, role: str, head_size: int) -> torch.Tensor:
    """The stored bytes (..., D/2 + 4) -> the values attention reads, float32 (original space)."""
    codes = packing.unpack_nibbles(stored[..., : head_size // 2]).float()
    s, z = read_scale(packing.bytes_float32(stored[..., head_size // 2 :]))
    return single_rht_inverse((codes - z) * s)


CODEC = Codec(
    name=NAME,
    recipe=CodecRecipe("vllm_int4_per_token_head"),
    format="int4_asym",
    granularity=TOKEN,
    encode=encode,
    decode=decode,
    width=width,
    check_head_size=check_head_size,
    roles_alike=True,
)
