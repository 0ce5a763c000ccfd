"""ggml's KV-cache block types, encoded as llama.cpp's CPU cache write stores them, in torch.

llama.cpp writes each token's K (and, with flash attention, V) row of ``n_head_kv * head_dim``
float32 values into its cache with ``ggml_set_rows``, whose CPU kernel calls the cache type's
``from_float`` (``ggml_get_type_traits_cpu(type)->from_float``) once per row. This module is that
``from_float`` for every type llama.cpp's ``--cache-type-k/-v`` takes, written from ggml's block
definitions (``ggml-common.h``) and quantizer semantics, in float32 with the C code's operation order,
so that the bytes are ggml's (:mod:`evalkit.engines.llamacpp.ggml_lib` holds them to the installed
library), and the matching ``to_float`` (dequantization). Every quantized block is 32 values:

========  ====  =====  ===========================================================================
type      enum  bytes  block layout (little-endian) and arithmetic (fp32; ``d``, ``m`` stored fp16 RNE)
========  ====  =====  ===========================================================================
q8_0      8     34     ``d``, 32 int8. x86 SIMD variant: ``d = amax/127``, ``id = 127/amax``
                       (0 if amax is 0), ``q = x*id`` rounded half to even
q4_0      2     18     ``d``, 16 nibble bytes. ``max`` = the first element of largest ``|x|`` with its
                       sign, ``d = max/-8``, ``id = 1/d``, ``q = min(15, int8(x*id + 8.5))``
q4_1      3     20     ``d``, ``m``, 16 nibble bytes. ``d = (max-min)/15``, ``id = 1/d``,
                       ``q = min(15, int8((x-min)*id + 0.5))``, ``m = min``
q5_0      6     22     ``d``, ``qh`` (uint32), 16 nibble bytes. As q4_0 with ``-16``, ``16.5``, ``31``
q5_1      7     24     ``d``, ``m``, ``qh``, 16 nibble bytes. As q4_1 with 31, no clamp
iq4_nl    20    18     ``d``, 16 nibble bytes of indices into :data:`IQ4NL_VALUES`; the
                       ``quantize_row_iq4_nl`` variant (no scale search): ``d0 = max/-127``, each
                       index the nearest value of ``x/d0`` (ties up), then ``d`` the ``x**2``-weighted
                       least-squares scale of those indices, sums accumulated element by element
f16       1     2/elt  IEEE binary16, round to nearest even
bf16      30    2/elt  the high 16 bits after round to nearest even; NaN keeps its top bits ``| 64``
f32       0     4/elt  float32 as is
========  ====  =====  ===========================================================================

Nibbles: byte ``j`` of a block's quants holds element ``j`` in its low nibble and element ``j + 16``
in its high one. q5 high bits: bit ``i`` of the little-endian uint32 ``qh`` is bit 4 of element
``i``. The C conversion ``(int8_t)f`` truncates toward zero through a 32-bit integer, so a
non-finite argument (a scale whose reciprocal overflowed, on tiny blocks) gives x86's ``INT_MIN``,
whose low byte is 0; q8_0's SIMD path saturates the same ``INT_MIN`` to -128: both modelled. Non-finite *inputs* are not (ggml's SIMD and scalar paths disagree
among themselves there).

iq4_nl's all-zero blocks (``amax < 1e-15``): ggml stores ``d = 0`` and packs the indices its
previous block left behind in the same row (for a row's first block: whatever was on the stack).
Here a row's later zero blocks repeat the last indices of the row as ggml does, and a first block
gets index 0; the values read back are 0 either way.

Dequantization (``to_float``): ``(q-8)*d``, ``q*d + m`` (two roundings), ``(q-16)*d``, ``q*d``,
``d*IQ4NL_VALUES[q]``, with ``d``, ``m`` widened from fp16 first.

The Walsh-Hadamard rotation llama.cpp applies to K and V before a quantized cache write
(:func:`fwht_llamacpp`): ``x * float32(1/sqrtf(n))`` first, then the butterflies ``len = 1, 2, ...,
n/2``, ``(u, v) -> (u + v, u - v)``. The butterfly is :func:`evalkit.kv.hadamard.fwht`'s (same stage
order, the same two float32 sums per pair); :func:`evalkit.kv.hadamard.fwht_orthonormal` scales
*after* the butterflies, which rounds differently unless ``n`` is a power of four, so the scaling is
done here first.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from evalkit.errors import SchemeError
from evalkit.kv.device_exact import divide
from evalkit.kv.hadamard import fwht

QK = 32
GROUP_MAX_EPS = 1e-15  # iq4_nl: a block with amax below this is stored as d = 0
IQ4NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


@dataclass(frozen=True)
class BlockType:
    name: str
    ggml_type: int  # enum ggml_type
    block: int  # values per block
    nbytes: int  # bytes per block
    quantized: bool

    def row_bytes(self, n: int) -> int:
        """Bytes of a row of ``n`` values (``n`` a multiple of the block)."""
        return n // self.block * self.nbytes


TYPES: dict[str, BlockType] = {
    t.name: t
    for t in (
        BlockType("f32", 0, 1, 4, False),
        BlockType("f16", 1, 1, 2, False),
        BlockType("bf16", 30, 1, 2, False),
        BlockType("q8_0", 8, QK, 34, True),
        BlockType("q4_0", 2, QK, 18, True),
        BlockType("q4_1", 3, QK, 20, True),
        BlockType("iq4_nl", 20, QK, 18, True),
        BlockType("q5_0", 6, QK, 22, True),
        BlockType("q5_1", 7, QK, 24, True),
    )
}


def block_type(name: str) -> BlockType:
    try:
        return TYPES[name]
    except KeyError:
        raise SchemeError(f"llama.cpp has no KV cache type {name!r}: use one of {', '.join(TYPES)}") from None


# -- small pieces ----------------------------------------------------------------------------------
def _f16_bytes(t: torch.Tensor) -> torch.Tensor:
    """float32 (..., 1) -> fp16 RNE, 2 little-endian bytes (..., 2)."""
    return t.to(torch.float16).contiguous().view(torch.uint8)


def _f16_read(b: torch.Tensor) -> torch.Tensor:
    """(..., 2) uint8 -> (..., 1) float32."""
    return b.contiguous().view(torch.float16).float()


def _c_int8(t: torch.Tensor) -> torch.Tensor:
    """C's ``(int8_t)f`` on x86 (int64 out): truncation to int32 (``INT_MIN`` when non-finite or out of
    range), then the low byte read as signed."""
    bad = ~torch.isfinite(t) | (t.abs() >= 2.0**31)
    i = torch.where(bad, torch.zeros_like(t), torch.trunc(t)).to(torch.int64)
    i = torch.where(bad, torch.full_like(i, -(2**31)), i)
    low = i & 0xFF
    return torch.where(low >= 128, low - 256, low)


def _c_uint8(t: torch.Tensor) -> torch.Tensor:
    """C's ``(uint8_t)f`` as gcc compiles it on x86: through int32, the low byte."""
    return _c_int8(t) & 0xFF


def _signed_max(xb: torch.Tensor) -> torch.Tensor:
    """The first element of largest magnitude, with its sign (..., 1): ggml's ``fabsf(v) > amax`` scan."""
    idx = xb.abs().argmax(dim=-1, keepdim=True)
    return xb.gather(-1, idx)


def _recip(d: torch.Tensor) -> torch.Tensor:
    """``d ? 1.0f/d : 0.0f``."""
    return torch.where(d != 0, 1.0 / torch.where(d != 0, d, torch.ones_like(d)), torch.zeros_like(d))


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """Codes (..., 32) -> (..., 16) uint8: element j low nibble, element j + 16 high nibble."""
    q = q.to(torch.int64)
    return ((q[..., :16] & 0xF) | ((q[..., 16:] & 0xF) << 4)).to(torch.uint8)


def _unpack_nibbles(b: torch.Tensor) -> torch.Tensor:
    b = b.to(torch.int64)
    return torch.cat((b & 0xF, b >> 4), dim=-1)


@functools.lru_cache(maxsize=8)
def _bit_weights(device: str) -> torch.Tensor:
    return 2 ** torch.arange(32, dtype=torch.int64, device=device)


def _qh_bytes(q: torch.Tensor) -> torch.Tensor:
    """Codes (..., 32) -> the uint32 of their bit 4 (bit i = element i), 4 little-endian bytes."""
    bits = (q.to(torch.int64) >> 4) & 1
    word = (bits * _bit_weights(str(q.device))).sum(-1, keepdim=True)
    return torch.cat([(word >> (8 * k)) & 0xFF for k in range(4)], dim=-1).to(torch.uint8)


def _qh_read(b: torch.Tensor) -> torch.Tensor:
    """4 bytes (..., 4) -> bit 4 of each of the 32 elements (..., 32), as 0 or 16."""
    b = b.to(torch.int64)
    word = b[..., 0:1] | (b[..., 1:2] << 8) | (b[..., 2:3] << 16) | (b[..., 3:4] << 24)
    return ((word >> torch.arange(32, device=b.device)) & 1) << 4


def _blocks(x: torch.Tensor) -> torch.Tensor:
    if x.shape[-1] % QK:
        raise SchemeError(
            f"llama.cpp's quantized cache types store blocks of {QK} values, which do not divide a row of "
            f"{x.shape[-1]}: use f16 or bf16 for this model"
        )
    return x.float().reshape(*x.shape[:-1], x.shape[-1] // QK, QK)


def _rows(b: torch.Tensor, shape) -> torch.Tensor:
    return b.reshape(*shape[:-1], -1)


# -- the quantizers (per block of 32, float32) -------------------------------------------------------
def _enc_q8_0(xb: torch.Tensor) -> torch.Tensor:
    amax = xb.abs().amax(dim=-1, keepdim=True)
    d = divide(amax, 127.0)  # a float32 division on every device (CUDA would multiply by fl(1/127))
    safe = torch.where(amax != 0, amax, torch.ones_like(amax))
    # 127 / amax as one float32 division: torch's ``scalar / tensor`` multiplies by the reciprocal (two
    # roundings; it differs from ggml's _mm256_div_ps on a quarter of all values)
    iscale = torch.where(amax != 0, torch.full_like(safe, 127.0) / safe, torch.zeros_like(amax))
    v = xb * iscale
    # round half to even; a non-finite product (amax so small that 127/amax overflowed) converts to
    # x86's INT_MIN, which the saturating packs take to -128
    q = torch.where(torch.isfinite(v), torch.round(v), torch.full_like(v, -128.0)).clamp(-128, 127).to(torch.int8)
    return torch.cat([_f16_bytes(d), q.view(torch.uint8)], dim=-1)


def _enc_q4_0(xb: torch.Tensor, nmax: float = -8.0, bias: float = 8.5, top: int = 15) -> torch.Tensor:
    d = _signed_max(xb) / nmax
    q = torch.clamp_max(_c_int8(xb * _recip(d) + bias), top)
    if top == 15:
        return torch.cat([_f16_bytes(d), _pack_nibbles(q)], dim=-1)
    return torch.cat([_f16_bytes(d), _qh_bytes(q), _pack_nibbles(q)], dim=-1)


def _enc_q5_0(xb: torch.Tensor) -> torch.Tensor:
    return _enc_q4_0(xb, -16.0, 16.5, 31)


def _enc_q4_1(xb: torch.Tensor, levels: float = 15.0) -> torch.Tensor:
    lo = xb.amin(dim=-1, keepdim=True)
    hi = xb.amax(dim=-1, keepdim=True)
    d = divide(hi - lo, levels)
    y = (xb - lo) * _recip(d) + 0.5
    if levels == 15.0:
        q = torch.clamp_max(_c_int8(y), 15)
        return torch.cat([_f16_bytes(d), _f16_bytes(lo), _pack_nibbles(q)], dim=-1)
    q = _c_uint8(y)  # q5_1: no clamp
    return torch.cat([_f16_bytes(d), _f16_bytes(lo), _qh_bytes(q), _pack_nibbles(q)], dim=-1)


def _enc_q5_1(xb: torch.Tensor) -> torch.Tensor:
    return _enc_q4_1(xb, 31.0)


@functools.lru_cache(maxsize=8)
def _iq4nl_values(device: str) -> torch.Tensor:
    return torch.tensor(IQ4NL_VALUES, dtype=torch.float32, device=device)


def _best_index(values: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """ggml's ``best_index_int8``: the nearest of the 16 values, an exact tie to the upper one."""
    mu = torch.searchsorted(values, x.contiguous(), right=True).clamp(1, 15)
    lower, upper = values[mu - 1], values[mu]
    idx = torch.where((x - lower) < (upper - x), mu - 1, mu)
    idx = torch.where(x <= values[0], torch.zeros_like(idx), idx)
    return torch.where(x >= values[15], torch.full_like(idx, 15), idx)


def _enc_iq4_nl(xb: torch.Tensor) -> torch.Tensor:
    values = _iq4nl_values(str(xb.device))
    w = xb * xb
    mx = _signed_max(xb)
    zero = mx.abs() < GROUP_MAX_EPS  # (..., nb, 1)
    d0 = mx / values[0]
    idx = _best_index(values, xb * (1.0 / d0))
    q = values[idx]
    sumqx = torch.zeros_like(mx)
    sumq2 = torch.zeros_like(mx)
    for j in range(QK):  # the C loop's order: one element at a time
        wq = w[..., j : j + 1] * q[..., j : j + 1]
        sumqx = sumqx + wq * xb[..., j : j + 1]
        sumq2 = sumq2 + wq * q[..., j : j + 1]
    d = torch.where(zero, torch.zeros_like(mx), sumqx / torch.where(zero, torch.ones_like(sumq2), sumq2))
    idx = torch.where(zero, torch.zeros_like(idx), idx)
    if zero.any():  # a zero block packs the indices the row's previous block left (ggml's stale L[])
        idx = _carry_indices(idx, zero[..., 0])
    return torch.cat([_f16_bytes(d), _pack_nibbles(idx)], dim=-1)


def _carry_indices(idx: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """Forward-fill each row's indices over its zero blocks (a row's first zero blocks keep index 0)."""
    nb = idx.shape[-2]
    pos = torch.arange(nb, device=idx.device).expand_as(zero)
    src = torch.where(zero, torch.full_like(pos, -1), pos).cummax(dim=-1).values
    filled = idx.gather(-2, src.clamp_min(0)[..., None].expand_as(idx))
    return torch.where((src >= 0)[..., None], filled, idx)


def _enc_f16(x: torch.Tensor) -> torch.Tensor:
    return x.float().to(torch.float16).contiguous().view(torch.uint8)


def _enc_bf16(x: torch.Tensor) -> torch.Tensor:
    u = x.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rne = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    h = torch.where(nan, (u >> 16) | 64, rne) & 0xFFFF
    return torch.stack((h & 0xFF, h >> 8), dim=-1).to(torch.uint8).reshape(*x.shape[:-1], -1)


def _enc_f32(x: torch.Tensor) -> torch.Tensor:
    return x.float().contiguous().view(torch.uint8)


_BLOCK_ENCODERS = {
    "q8_0": _enc_q8_0,
    "q4_0": _enc_q4_0,
    "q4_1": _enc_q4_1,
    "q5_0": _enc_q5_0,
    "q5_1": _enc_q5_1,
    "iq4_nl": _enc_iq4_nl,
}
_PLAIN_ENCODERS = {"f16": _enc_f16, "bf16": _enc_bf16, "f32": _enc_f32}


def encode(name: str, x: torch.Tensor) -> torch.Tensor:
    """Rows (..., D) -> ggml's bytes (..., row_bytes(D)) uint8, as the CPU ``from_float`` of ``name``
    writes them, one row per call (iq4_nl's zero blocks read the row's earlier blocks)."""
    t = block_type(name)
    if not t.quantized:
        return _PLAIN_ENCODERS[name](x)
    return _rows(_BLOCK_ENCODERS[name](_blocks(x)), x.shape)


# -- dequantization (to_float) ---------------------------------------------------------------------
def decode(name: str, b: torch.Tensor) -> torch.Tensor:
    """ggml bytes (..., row_bytes(D)) -> float32 (..., D), as ggml's ``to_float`` reads them."""
    t = block_type(name)
    if name == "f32":
        return b.contiguous().view(torch.float32)
    if name == "f16":
        return b.contiguous().view(torch.float16).float()
    if name == "bf16":
        h = b.to(torch.int64).reshape(*b.shape[:-1], -1, 2)
        u = (h[..., 0] | (h[..., 1] << 8)) << 16
        return torch.where(u >= 2**31, u - 2**32, u).to(torch.int32).contiguous().view(torch.float32)
    blk = b.reshape(*b.shape[:-1], b.shape[-1] // t.nbytes, t.nbytes)
    d = _f16_read(blk[..., 0:2])
    if name == "q8_0":
        y = blk[..., 2:].contiguous().view(torch.int8).float() * d
    elif name == "q4_0":
        y = (_unpack_nibbles(blk[..., 2:]) - 8).float() * d
    elif name == "iq4_nl":
        y = d * _iq4nl_values(str(b.device))[_unpack_nibbles(blk[..., 2:])]
    elif name == "q4_1":
        y = _unpack_nibbles(blk[..., 4:]).float() * d + _f16_read(blk[..., 2:4])
    elif name == "q5_0":
        y = ((_unpack_nibbles(blk[..., 6:]) | _qh_read(blk[..., 2:6])) - 16).float() * d
    else:  # q5_1
        q = _unpack_nibbles(blk[..., 8:]) | _qh_read(blk[..., 4:8])
        y = q.float() * d + _f16_read(blk[..., 2:4])
    return y.reshape(*b.shape[:-1], -1)


# -- the rotation ----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=16)
def _inv_sqrtf(n: int) -> float:
    """float32(1.0f / sqrtf(n)) as a Python float."""
    root = torch.tensor(float(n), dtype=torch.float32).sqrt()
    return float(torch.tensor(1.0, dtype=torch.float32) / root)


def fwht_llamacpp(x: torch.Tensor, n: int) -> torch.Tensor:
    """llama.cpp's CPU Walsh-Hadamard rotation of each ``n`` consecutive values of the last dim
    (float32): scale by ``1/sqrtf(n)`` first, then the butterflies. Its own inverse (``H H = I``)."""
    d = x.shape[-1]
    if d % n:
        raise SchemeError(f"a {n}-point rotation does not divide a row of {d}")
    y = x.float().reshape(*x.shape[:-1], d // n, n) * _inv_sqrtf(n)
    return fwht(y).reshape(x.shape)


def k_rotation(head_dim: int) -> int:
    """llama.cpp's K rotation size: the largest power of two dividing head_dim (0: none, head_dim % 64)."""
    return head_dim & -head_dim if head_dim % 64 == 0 else 0


def v_rotation(head_dim: int) -> int:
    """llama.cpp's V rotation size: 64 (0: none, head_dim % 64)."""
    return 64 if head_dim % 64 == 0 else 0


def rotation(type_name: str, role: str, head_dim: int) -> int:
    """The rotation size llama.cpp applies before storing ``role`` (``"k"``/``"v"``) of ``type_name`` (0: none)."""
    if not block_type(type_name).quantized:
        return 0
    return k_rotation(head_dim) if role == "k" else v_rotation(head_dim)


def hadamard_matrix(n: int) -> torch.Tensor:
    """The normalised Sylvester matrix ``(-1)**popcount(i & j) / sqrt(n)`` (float64; for tests and notes)."""
    i = torch.arange(n)
    bits = (i[:, None] & i[None, :]).to(torch.int64)
    pop = torch.zeros_like(bits)
    for k in range(int(math.log2(n)) + 1):
        pop += (bits >> k) & 1
    return (1 - 2 * (pop % 2)).double() / math.sqrt(n)
