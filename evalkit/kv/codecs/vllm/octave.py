"""vLLM's Octave KV cache dtypes (``octave_k3v4``, ``octave_k3v3``, ``octave_k3v3_compact``, new in 0.33),
modelled on the format's PyTorch reference.

Read in vLLM 0.33.0 (0.34.0's file is the same), ``vllm/v1/attention/ops/rocm_octave.py``:

- format, ``OctaveFormat`` (:100-180): per (token, KV head) one slot ``[k_rope codes][k_nope codes][v
  codes][fp16 scales][pad]``; K's first ``rope_dim`` dims take 4-bit codes (``ROPE_BITS``), the rest 3-bit
  (``NOPE_BITS``), one scale per 64-dim K block (``HADAMARD_BLOCK``); compact K is 3-bit throughout with one
  scale; V ``v_bits`` (4 for k3v4, 3 otherwise) with one scale; the slot padded to 8 bytes (4 compact);
  head_size and rope_dim multiples of 64, a power-of-two head_size for compact (``__post_init__``);
- rotary dims, ``rope_dim_from_hf_config`` (:76-81): ``int(head_size * partial_rotary_factor)``, the
  factor from the config's ``partial_rotary_factor``, else its ``rope_parameters``, else 1.0 (read by
  :func:`evalkit.models.info.kv_layout` into ``KVLayout.rotary_dim``; None here means that default);
- signs (:183-192): ``torch.Generator().manual_seed(_SIGN_SEED)`` with ``_SIGN_SEED = 0x5E17`` (:50), then
  ``torch.randint(0, 2, (head_size,), generator=g, dtype=torch.int64) * -2 + 1``: one fixed +-1 pattern per
  head size, shared by K and V (the backend passes the same words for both, ``rocm_octave_attn.py``:313-318);
- rotation, ``fwht_blocks`` / ``rotate`` / ``unrotate`` (:202-225): signs, then the orthonormal butterfly
  over consecutive blocks (``(a + b, a - b)`` per stage in float32, then ``* (1 / sqrt(block))``); K in
  64-dim blocks (compact: one block of head_size), V in one block when head_size is a power of two
  (``v_block``, :228-232);
- codes, ``_quantize_lut`` (:240-254): ``ss = sum(x**2)``, ``rms = sqrt(ss / n)`` (at least 1e-12),
  ``y = x / rms * LUT_MULT``, the code is ``bucketize`` on the midpoints of the int8 Lloyd-Max table ``LUT``
  (a value on a midpoint takes the lower code), and the scale ``ss / dot * LUT_ONE`` with ``dot = sum(x *
  LUT[c])`` (0 where dot <= 0) makes ``x . x_hat = |x|^2``; stored as float16;
- packing, ``_pack`` (:257-270): 4-bit, per 8 dims one little-endian word whose byte j holds dim j (low
  nibble) and dim j + 4 (high); 3-bit, a plane of the codes' low 2 bits (byte j of each 16-dim word holds
  dims j, 4 + j, 8 + j, 12 + j at bits 0, 2, 4, 6) then a plane of their high bit (byte j of each 32-dim word
  holds dims j, 4 + j, ..., 28 + j at bits 0..7);
- read-back, ``reference_dequantize`` (:321-354): ``LUT[c] * (float16 scale / LUT_ONE)``, then unrotated
  (the kernels attend in the rotated space, the query rotated like K and the output rotated back: the
  same values up to float32 summation order).

The sums (``ss``, ``dot``) and the square root are torch's own, as in the reference, so on the CPU they are
its bits exactly: tests/kv/test_vllm_octave.py holds every slot byte and every read-back value equal to
the reference run from the 0.33 wheel's source. This is the one vLLM dtype evalkit does not compute in a
device-independent order (:mod:`evalkit.kv.device_exact`; tests/kv/test_same_bytes.py names it): a fixed
order (``tree_sum``, a correctly rounded ``sqrt``) would differ from the reference on this CPU in about 1.3e-4
of the fp16 scales (a last bit) and 1e-7 of the codes (measured on 100,000 rows per width; torch's float32
``sqrt`` here differs from the correctly rounded one in 17 % of values), and the engine's own order is the
HIP kernels', which are not in the wheel. So on a GPU evalkit's Octave bytes can differ from the CPU's as
vLLM's reference's do. Divisions are by a device tensor or exact powers of two.

Where vLLM runs it (``vllm/v1/attention/backends/rocm_octave_attn.py``): ROCm only, RDNA 3 or CDNA 3, fp16/bf16
models, and its kernels take head_size 256 with 64 rotary dims only (:63-65, :292-301); evalkit models the
format at any head size the format takes (so the 64-dim embedded model runs the reference's arithmetic,
which no vLLM kernel runs at that size). Attention: queries of at most 128 tokens per step (decode, short
chunks) read every token from the packed cache; a longer prefill reads the cached prefix from the cache and
its own chunk unquantized (in fp16, :456-496); so ``prefill_reads_raw`` with ``raw_prefill_over = 128``.
No layers are skipped.

evalkit's two sides of the slot: K is ``[k codes][k scales]``, V ``[v codes][v scale][pad]`` (:func:`slot`
lays them out as vLLM's one slot and :func:`split` takes one apart); the widths add up to ``slot_bytes``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from evalkit.errors import SchemeError
from evalkit.kv.codecs.slot import TOKEN, Codec, packed
from evalkit.kv.device_exact import divide
from evalkit.kv.formats import CodecRecipe
from evalkit.kv.hadamard import fwht, is_power_of_two
from evalkit.kv.quantize import Quantized

BLOCK = 64  # HADAMARD_BLOCK
SIGN_SEED = 0x5E17  # _SIGN_SEED
ROPE_BITS, NOPE_BITS = 4, 3
LUT = {  # Lloyd-Max codebooks for N(0, 1) as int8 (LUT), code c of scale s stands for LUT[c] * s / LUT_ONE
    3: (-127, -79, -45, -14, 14, 45, 79, 127),
    4: (-126, -95, -74, -58, -43, -30, -18, -6, 6, 18, 30, 43, 58, 74, 95, 126),
}
LUT_MULT = {3: 59.0, 4: 46.0}  # LUT[bits][c] / LUT_MULT[bits] approximates centroid c
LUT_ONE = 64.0
RMS_MIN, DOT_MIN = 1e-12, 1e-30
DECODE_MAX_QUERY_LEN = 128  # rocm_octave_attn.py _DECODE_MAX_QUERY_LEN: longer prefills read their chunk raw
PRESETS = {"octave_k3v4": (4, False), "octave_k3v3": (3, False), "octave_k3v3_compact": (3, True)}  # v_bits, compact


@dataclass(frozen=True)
class Layout:
    """One dtype's slot on one head size and rotary width (``OctaveFormat``'s offsets, derived again)."""

    head_size: int
    rope_dim: int
    v_bits: int
    compact: bool

    @property
    def rope_k(self) -> int:  # K dims with 4-bit codes
        return 0 if self.compact else self.rope_dim

    @property
    def k_code_bytes(self) -> int:
        return (self.rope_k * ROPE_BITS + (self.head_size - self.rope_k) * NOPE_BITS) // 8

    @property
    def v_code_bytes(self) -> int:
        return self.head_size * self.v_bits // 8

    @property
    def k_scales(self) -> int:
        return 1 if self.compact else self.head_size // BLOCK

    @property
    def slot_bytes(self) -> int:
        raw = self.k_code_bytes + self.v_code_bytes + 2 * (self.k_scales + 1)
        align = 4 if self.compact else 8
        return -(-raw // align) * align

    @property
    def pad(self) -> int:
        return self.slot_bytes - (self.k_code_bytes + self.v_code_bytes + 2 * (self.k_scales + 1))

    def width(self, role: str) -> int:
        if role == "k":
            return self.k_code_bytes + 2 * self.k_scales
        return self.v_code_bytes + 2 + self.pad

    @property
    def k_block(self) -> int:
        return self.head_size if self.compact else BLOCK

    @property
    def v_block(self) -> int:
        return self.head_size if is_power_of_two(self.head_size) else BLOCK


def layout(name: str, head_size: int, rope_dim: int | None = None) -> Layout:
    """``name``'s slot at ``head_size`` with ``rope_dim`` rotary dims (None: every dim, vLLM's factor 1.0);
    SchemeError, one line, where ``OctaveFormat`` refuses them."""
    v_bits, compact = PRESETS[name]
    rope = head_size if rope_dim is None else int(rope_dim)
    if compact and not is_power_of_two(head_size):
        raise SchemeError(f"vllm:{name} needs a power-of-two head_size, not {head_size}: use vllm:octave_k3v3")
    if head_size % BLOCK or rope % BLOCK or not 0 <= rope <= head_size:
        raise SchemeError(
            f"vllm:{name} needs head_size and rotary dims in multiples of {BLOCK} (vLLM's OctaveFormat), not "
            f"head_size {head_size} with {rope} rotary dims: use vllm:fp8 for this model"
        )
    return Layout(head_size, rope, v_bits, compact)


# -- signs and rotation ----------------------------------------------------------------------------
_SIGNS: dict[tuple[int, str], torch.Tensor] = {}  # a plain dict, not lru_cache: torch.compile finds the tensor


def signs(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """vLLM's fixed +-1 pattern (float32) for head size ``n``: drawn on a CPU generator seeded 0x5E17."""
    key = (n, str(torch.device(device)))
    found = _SIGNS.get(key)
    if found is None:
        g = torch.Generator().manual_seed(SIGN_SEED)
        drawn = torch.randint(0, 2, (n,), generator=g, dtype=torch.int64) * -2 + 1
        found = _SIGNS.setdefault(key, drawn.to(device=device, dtype=torch.float32))
    return found


def _butterfly(x: torch.Tensor, block: int) -> torch.Tensor:
    """The orthonormal transform over consecutive ``block``-wide blocks of float32 ``x``: butterfly, then
    ``* (1 / sqrt(block))`` (the reference's Python-float factor)."""
    d = x.shape[-1]
    y = fwht(x.reshape(*x.shape[:-1], d // block, block)).reshape(x.shape)
    return y * (1.0 / math.sqrt(block))


def rotate(x: torch.Tensor, block: int) -> torch.Tensor:
    return _butterfly(x.float() * signs(x.shape[-1], x.device), block)


def unrotate(y: torch.Tensor, block: int) -> torch.Tensor:
    return _butterfly(y.float(), block) * signs(y.shape[-1], y.device)


# -- codes -----------------------------------------------------------------------------------------
_TABLES: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}


def table(bits: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(LUT as float32, its midpoints in float32) on ``device``."""
    key = (bits, str(torch.device(device)))
    found = _TABLES.get(key)
    if found is None:
        lut = torch.tensor(LUT[bits], dtype=torch.float32, device=device)
        found = _TABLES.setdefault(key, (lut, (lut[1:] + lut[:-1]) * 0.5))  # the reference's "/ 2": exact
    return found


def lut_codes(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of float32 ``x`` (..., n) -> (codes int64, float32 scale (..., 1)) with ``x . x_hat = |x|^2``."""
    lut, mid = table(bits, x.device)
    ss = x.pow(2).sum(-1, keepdim=True)  # torch's sum and sqrt, as the reference (see the module docstring)
    rms = divide(ss, x.shape[-1]).sqrt().clamp_min(RMS_MIN)
    codes = torch.bucketize(x / rms * LUT_MULT[bits], mid)
    dot = (x * lut[codes]).sum(-1, keepdim=True)
    return codes, torch.where(dot > 0, ss / dot.clamp_min(DOT_MIN), 0.0) * LUT_ONE


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes (..., n) -> the slot's bytes (..., n * bits / 8) uint8."""
    c = codes.to(torch.int64)
    lead, n = c.shape[:-1], c.shape[-1]
    if bits == 4:  # per 8 dims: byte j = dim j | dim j + 4 << 4
        w = c.reshape(*lead, n // 8, 2, 4)
        return (w[..., 0, :] | (w[..., 1, :] << 4)).reshape(*lead, n // 2).to(torch.uint8)
    lo = (c & 3).reshape(*lead, n // 16, 4, 4)  # (word, i, byte j): dim 4i + j at bits 2i
    lo = (lo << (2 * torch.arange(4, device=c.device))[:, None]).sum(-2)
    hi = (c >> 2).reshape(*lead, n // 32, 8, 4)  # dim 4i + j at bit i
    hi = (hi << torch.arange(8, device=c.device)[:, None]).sum(-2)
    return torch.cat((lo.reshape(*lead, n // 4), hi.reshape(*lead, n // 8)), -1).to(torch.uint8)


def unpack(b: torch.Tensor, n: int, bits: int) -> torch.Tensor:
    """The slot's bytes -> ``n`` codes (int64)."""
    p = b.to(torch.int64)
    lead = p.shape[:-1]
    if bits == 4:
        w = p.reshape(*lead, n // 8, 1, 4)
        return torch.cat((w & 15, w >> 4), -2).reshape(*lead, n)
    lo = p[..., : n // 4].reshape(*lead, n // 16, 1, 4)
    lo = (lo >> (2 * torch.arange(4, device=p.device))[:, None]) & 3
    hi = p[..., n // 4 :].reshape(*lead, n // 32, 1, 4)
    hi = (hi >> torch.arange(8, device=p.device)[:, None]) & 1
    return lo.reshape(*lead, n) + 4 * hi.reshape(*lead, n)


def _half_bytes(scales: torch.Tensor) -> torch.Tensor:
    return scales.to(torch.float16).contiguous().view(torch.uint8)


def _half_scales(b: torch.Tensor) -> torch.Tensor:
    """fp16 scale bytes -> float32 scales / LUT_ONE (exact)."""
    return b.contiguous().view(torch.float16).float() * (1.0 / LUT_ONE)  # a power of two: the same bits


# -- one side of the slot --------------------------------------------------------------------------
def _k_codes(x: torch.Tensor, lay: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """K -> (code bytes, float32 scales (..., k_scales))."""
    d = lay.head_size
    k = rotate(x, lay.k_block).contiguous()
    if lay.compact:
        codes, scale = lut_codes(k, NOPE_BITS)
        return pack(codes, NOPE_BITS), scale
    blocks = k.reshape(*k.shape[:-1], d // BLOCK, BLOCK)
    nr = lay.rope_k // BLOCK
    rc, rs = lut_codes(blocks[..., :nr, :], ROPE_BITS)
    nc, ns = lut_codes(blocks[..., nr:, :], NOPE_BITS)
    lead = k.shape[:-1]
    b = torch.cat(
        (pack(rc.reshape(*lead, lay.rope_k), ROPE_BITS), pack(nc.reshape(*lead, d - lay.rope_k), NOPE_BITS)), -1
    )
    return b, torch.cat((rs[..., 0], ns[..., 0]), -1)


def _k_values(stored: torch.Tensor, lay: Layout) -> torch.Tensor:
    d, r = lay.head_size, lay.rope_k
    sc = _half_scales(stored[..., lay.k_code_bytes :])
    if lay.compact:
        lut, _ = table(NOPE_BITS, stored.device)
        return unrotate(lut[unpack(stored[..., : lay.k_code_bytes], d, NOPE_BITS)] * sc, lay.k_block)
    lut4, _ = table(ROPE_BITS, stored.device)
    lut3, _ = table(NOPE_BITS, stored.device)
    rope_bytes = r * ROPE_BITS // 8
    k = torch.cat(
        (
            lut4[unpack(stored[..., :rope_bytes], r, ROPE_BITS)],
            lut3[unpack(stored[..., rope_bytes : lay.k_code_bytes], d - r, NOPE_BITS)],
        ),
        -1,
    )
    k = (k.reshape(*k.shape[:-1], d // BLOCK, BLOCK) * sc[..., None]).reshape(k.shape)
    return unrotate(k, lay.k_block)


def _v_values(stored: torch.Tensor, lay: Layout) -> torch.Tensor:
    lut, _ = table(lay.v_bits, stored.device)
    sc = _half_scales(stored[..., lay.v_code_bytes : lay.v_code_bytes + 2])
    return unrotate(lut[unpack(stored[..., : lay.v_code_bytes], lay.head_size, lay.v_bits)] * sc, lay.v_block)


def encode(name: str, x: torch.Tensor, role: str = "k", rope_dim: int | None = None) -> Quantized:
    lay = layout(name, x.shape[-1], rope_dim)
    nonfinite = ~torch.isfinite(x.float()).all()
    if role == "k":
        codes, scales = _k_codes(x, lay)
        stored = torch.cat((codes, _half_bytes(scales)), -1)
        return packed(codes.float(), stored, _k_values(stored, lay), nonfinite)
    codes, scale = lut_codes(rotate(x, lay.v_block).contiguous(), lay.v_bits)
    b = pack(codes, lay.v_bits)
    stored = torch.cat((b, _half_bytes(scale), b.new_zeros(*b.shape[:-1], lay.pad)), -1)
    return packed(codes.float(), stored, _v_values(stored, lay), nonfinite)


def decode(name: str, stored: torch.Tensor, role: str, head_size: int, rope_dim: int | None = None) -> torch.Tensor:
    """One side's bytes -> what attention reads (float32, unrotated): ``reference_dequantize``'s values."""
    lay = layout(name, head_size, rope_dim)
    return _k_values(stored, lay) if role == "k" else _v_values(stored, lay)


def slot(k: torch.Tensor, v: torch.Tensor, lay: Layout) -> torch.Tensor:
    """evalkit's K and V sides -> vLLM's one slot ``[k codes][v codes][k scales][v scale][pad]`` (uint8)."""
    kc = lay.k_code_bytes
    return torch.cat((k[..., :kc], v[..., : lay.v_code_bytes], k[..., kc:], v[..., lay.v_code_bytes :]), -1)


def split(s: torch.Tensor, lay: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's slot -> evalkit's (K side, V side)."""
    kc, vc = lay.k_code_bytes, lay.v_code_bytes
    scales = kc + vc
    k = torch.cat((s[..., :kc], s[..., scales : scales + 2 * lay.k_scales]), -1)
    return k, torch.cat((s[..., kc:scales], s[..., scales + 2 * lay.k_scales :]), -1)


def _check(name: str, head_size: int) -> None:
    layout(name, head_size)


def _codec(name: str) -> Codec:
    return Codec(
        name=name,
        recipe=CodecRecipe("vllm_" + name),
        format="int4",
        granularity=TOKEN,
        encode=functools.partial(encode, name),
        decode=functools.partial(decode, name),
        width=lambda role, d, rope_dim=None: layout(name, d, rope_dim).width(role),
        check_head_size=functools.partial(_check, name),
        prefill_reads_raw=True,
        raw_prefill_over=DECODE_MAX_QUERY_LEN,
        rope_aware=True,
        numerics_group="octave",
    )


CODECS = tuple(_codec(n) for n in PRESETS)
