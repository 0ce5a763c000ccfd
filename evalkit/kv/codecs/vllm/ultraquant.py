"""vLLM's ``--kv-cache-dtype ultraquant_4bit``, modelled on its store kernel.

Read in vLLM 0.32, ``vllm/v1/attention/ops/ultraquant/triton_store.py`` ``_ultraquant_store_kernel``
(one program per token and KV head; the format and slot layout in ``ultraquant/format.py``, the read
side in ``ultraquant/triton_dequant.py``), all float32:

1. K only: a Walsh-Hadamard rotation by an in-register butterfly, each stage ``(a +- b) * c`` with
   ``c = float32(1 / sqrt(2))`` (:func:`evalkit.kv.hadamard.fwht_orthonormal_stagewise`; no sign
   vector). V is not rotated.
2. Per group of 32 values: ``s = 2**floor(log2(0.156 * amax) + 0.5)`` (the UE8M0 snap, rounding the
   exponent half up); a group with amax 0 keeps divisor 1 and stores scale byte 0.
3. ``x / s`` (a division) snapped to the FP4 E2M1 grid {0, +-0.5, ..., +-6} by counting the 14
   midpoints it exceeds (``>``: a tie goes to the lower level, so toward minus infinity); values
   beyond +-5 saturate at +-6 (with ``0.156``, amax / s lies in [4.53, 9.07]: the top of each group
   clips by design). A zero group's codes are +0.
4. Sorted index -> E2M1 bits (sign on top: ``15 - i`` below zero, ``i - 7`` from zero up; -0.25 < x
   <= 0.25 stores +0), two codes per byte, low nibble first; one scale byte ``e + 127`` per group
   (0 where out of [0, 255]: read back as zero).

Slot per (token, head): K codes ``D/2``, K scales ``D/32``, V codes ``D/2``, V scales ``D/32`` bytes
(``format.slot_size``). The read side (``triton_dequant.py``) is ``code * 2**(byte - 127)``, byte 0
meaning 0; K stays rotated and the query is rotated instead; here K is rotated back (the butterfly
is its own inverse in exact arithmetic).

Approximate, and why: ``tl.log2`` on a GPU is the hardware's approximate ``lg2``; the exponent is
``floor(log2 + 0.5)``, so a scale within about 1e-7 (relative) of ``2**(e + 0.5)`` may snap the
other way there. Here the exponent is what a correctly rounded float32 ``log2`` gives, computed
exactly from the scale's exponent bits and a mantissa threshold
(:func:`evalkit.kv.device_exact.log2_round_half_up`; torch's and numpy's float32 ``log2``, the
interpreter's, agree with it on the thresholds' neighbours), and ``2**e`` is built from bits, so
the bytes do not depend on the device's ``log2``/``exp2``. The decode
kernel also casts the rotated query to FP8 E4M3 (attention precision, not modelled). Head sizes:
a power of two (the butterfly) and a multiple of 32 (the groups). Like TurboQuant, the first and
last two attention layers stay in the model's dtype and a first-chunk prefill attends the raw K/V.
"""

from __future__ import annotations

import functools

import torch

from evalkit.errors import SchemeError
from evalkit.kv import packing
from evalkit.kv.codecs.slot import Codec, packed
from evalkit.kv.device_exact import log2_round_half_up, power_of_two
from evalkit.kv.formats import CodecRecipe, ScaleDType
from evalkit.kv.hadamard import fwht_orthonormal_stagewise, is_power_of_two
from evalkit.kv.scheme import Granularity, GranularityKind

NAME = "ultraquant_4bit"
GROUP = 32
C = 0.156
BIAS = 127
LEVELS = (-6.0, -4.0, -3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
BOUNDARY_LAYERS = 2


def check_head_size(head_size: int) -> None:
    if not is_power_of_two(head_size) or head_size % GROUP:
        raise SchemeError(
            f"vllm:{NAME} needs a power-of-two head_size that is a multiple of {GROUP} (its Hadamard butterfly "
            f"and groups of {GROUP}), not {head_size}: use vllm:fp8 for this model"
        )


def width(role: str, head_size: int) -> int:
    return head_size // 2 + head_size // GROUP


@functools.lru_cache(maxsize=8)
def _tables(device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the 14 level midpoints, the 15 levels by sorted index, the 8 E2M1 magnitudes, float32 C), float32."""
    lv = torch.tensor(LEVELS, dtype=torch.float32, device=device)
    mag = torch.tensor((0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0), dtype=torch.float32, device=device)
    return (lv[:-1] + lv[1:]) * 0.5, lv, mag, torch.tensor(C, dtype=torch.float32, device=device)


def snap(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Groups (..., n, 32) float32 -> (E2M1 bit codes, scale bytes (..., n), sorted level index)."""
    midpoints, _, _, c = _tables(str(g.device))
    amax = g.abs().amax(dim=-1)
    zero = amax == 0
    e = log2_round_half_up(torch.where(zero, 1.0, amax * c))
    div = torch.where(zero, 1.0, _exp2(e))
    idx = torch.bucketize(g / div[..., None], midpoints, right=False)  # how many midpoints y exceeds (ties down)
    idx = torch.where(zero[..., None], 7, idx)
    bits = torch.where(idx < 7, 15 - idx, idx - 7)
    byte = torch.where(zero, 0.0, e + BIAS)
    byte = torch.where((byte < 0) | (byte > 255), 0.0, byte)
    return bits, byte.to(torch.uint8), idx


def _bits_value(bits: torch.Tensor) -> torch.Tensor:
    """E2M1 bit codes -> values (sign bit 8)."""
    mag = _tables(str(bits.device))[2][(bits & 7).long()]
    return torch.where(bits >= 8, -mag, mag)


def _exp2(e: torch.Tensor) -> torch.Tensor:
    """``2**e`` for float32 integer exponents, exact (built from bits) where e is in [-149, 127]; an
    exponent beyond (the -inf of a scale that underflowed to 0, inf, 128) as torch's exp2 (0, inf, inf)."""
    inside = (e >= -149) & (e <= 127)
    return torch.where(inside, power_of_two(torch.where(inside, e, 0.0)), torch.exp2(e))


def _scale_value(byte: torch.Tensor) -> torch.Tensor:
    return torch.where(byte == 0, 0.0, _exp2(byte.float() - BIAS))


def _unrotated(v: torch.Tensor, role: str) -> torch.Tensor:
    v = v.reshape(*v.shape[:-2], -1)
    return fwht_orthonormal_stagewise(v) if role == "k" else v


def _values(bits: torch.Tensor, byte: torch.Tensor, role: str) -> torch.Tensor:
    """What attention reads from the stored bit codes and scale bytes (the read kernel's decoding)."""
    return _unrotated(_bits_value(bits) * _scale_value(byte)[..., None], role)


def encode(x: torch.Tensor, role: str = "k"):
    d = x.shape[-1]
    check_head_size(d)
    xf = x.float()
    y = fwht_orthonormal_stagewise(xf) if role == "k" else xf
    bits, byte, idx = snap(y.reshape(*y.shape[:-1], d // GROUP, GROUP))
    stored = torch.cat([packing.pack_nibbles(bits.reshape(*y.shape[:-1], d)), byte], dim=-1)
    levels = _tables(str(x.device))[1][idx]  # = _bits_value(bits): the sorted index names the same level
    values = _unrotated(levels * _scale_value(byte)[..., None], role)
    return packed(bits.reshape(y.shape).float(), stored, values, ~torch.isfinite(xf).all())


def decode(stored: torch.Tensor, role: str, head_size: int) -> torch.Tensor:
    bits = packing.unpack_nibbles(stored[..., : head_size // 2]).long()
    byte = stored[..., head_size // 2 :]
    return _values(bits.reshape(*bits.shape[:-1], -1, GROUP), byte, role)


CODEC = Codec(
    name=NAME,
    recipe=CodecRecipe("vllm_ultraquant_4bit"),
    format="fp4_e2m1",
    granularity=Granularity(GranularityKind.GROUP, GROUP),
    scale_dtype=ScaleDType.E8M0,
    encode=encode,
    decode=decode,
    width=width,
    check_head_size=check_head_size,
    boundary_layers=BOUNDARY_LAYERS,
    prefill_reads_raw=True,
)
