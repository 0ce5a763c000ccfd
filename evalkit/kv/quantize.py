"""Quantize and dequantize K/V: the one place that knows scales, zero points, grouping and rounding.

K and V arrive as (batch, kv_heads, seq, head_dim). A scale multiplies the stored code to give back
the value (the vLLM / compressed-tensors convention): ``x_hat = code * scale`` with
``code = round(clamp(x / scale))``. Asymmetric integer formats also keep a zero point:
``x_hat = (code - zero) * scale`` with ``code = clamp(round(x / scale) + zero)``. ``round`` is the
format's rounding (``fmt.rounding``, bound by ``Scheme.kv_format`` from ``+rounding=``): nearest even
unless the scheme says ``rtz`` (toward zero) or ``rna`` (ties away from zero), for every float and
integer format (``+recipe=vllm_cpu``: ``x * float32(1 / scale)`` and vLLM's CPU store's rounding,
:func:`evalkit.kv.rounding.round_vllm_cpu`); all of it is done by :mod:`evalkit.kv.rounding`, and it applies to the elements
only (scales are rounded to their dtype by their own rules, below; zero points to nearest even).

The granularity says which elements share one scale, and fixes the shape of the scale tensor
(what a cache stores; :func:`dequantize` broadcasts it back):

=============  ===================  ================================================
granularity    scale shape          elements sharing one scale
=============  ===================  ================================================
``tensor``     (B, 1, 1, 1)         all of one sequence's K (or V) in the layer
``head``       (B, H, 1, 1)         one KV head of one sequence
``block<N>``   (B, H, ceil(S/N))    N consecutive tokens of one head, counted from x's first token
``token``      (B, H, S, 1)         one token of one head
``group<N>``   (B, H, S, D/N)       N channels of head_dim of one token and head
=============  ===================  ================================================

Dynamic scales (no ``scale`` given) are ``amax / format max`` in float32 over each group, and a
group whose amax is 0 gets scale 1 so that it stays exactly 0. Asymmetric formats take
``scale = (max - min) / (2**bits - 1)`` and ``zero = round(-min / scale)`` over a range that always
includes 0. A float32 scale is never below :data:`SCALE_FLOOR`, float32's smallest normal (about
1.2e-38): below an amax of about 6e-43 (E4M3) ``amax / 448`` underflows to 0 and every zero of the
group would become ``0 / 0 = NaN`` (an amax up to about 5e-36 would give a subnormal, inexact
scale); with the floor such a group stores its values to within the floor's precision (in practice
as 0) and never NaN. NVFP4's per-tensor scale has the same floor. A given ``scale`` (static, unit, or a dynamic one frozen earlier) is used as it is and
must broadcast against x; values beyond the range it covers saturate.

Scales stored in a narrower dtype (``fmt.scale_dtype``, bound by ``Scheme.kv_format``) are rounded
to it before use, so the codes are the ones an engine computes (the functions are
:mod:`evalkit.kv.microscaling`'s, each tested bit for bit there):

============================  ==========================================================================
``e8m0`` (OCP MX: mxfp4,      ``2**(floor(log2 amax) - emax)``, emax = 2 (E2M1) or 8 (E4M3); the elements
mxfp8_e4m3)                   ``x / scale`` are rounded (nearest even) and saturate at the format max
``e8m0`` + ``recipe=sglang``  ``2**ceil(log2(max(amax / 6, 1e-10)))`` in the K/V's dtype (float32 here
(sglang_fp4 = this +          unless BF16); a ±0 element is stored +0 (SGLang's sign bit is v < 0); the
``rounding=rna``)             named scheme rounds its elements half away from zero (SGLang's thresholds)
``e4m3``                      ``e4m3(amax / 6)`` kept in [2**-9, 448] (one-level; 0 -> 1)
``e4m3`` + ``tensor_scale``   NVFP4: ``global = tensor_amax / (448 * 6)`` over the sequence's K (or V)
(nvfp4)                       in the layer, padding left out; ``group = e4m3(amax / (6 * global))``;
                              the scale used and returned is ``group * global`` (float32)
============================  ==========================================================================

NVFP4's per-tensor scale comes back as ``Quantized.tensor_scale`` (B, 1, 1, 1); passing it in as
``tensor_scale=`` reuses it (a cache freezes the one from a sequence's first write, as engines keep
one ``k_scale``/``v_scale`` per layer). The returned ``scale`` is always the float32 factor that
multiplies a code, whatever dtype the scale is stored in; :attr:`KVFormat.scale_nbytes` says what
each costs in the cache.

Padding: ``valid`` (B, S) marks real tokens. Padded positions are left out of every amax, min and
max (an engine never stores padding); their codes use the same scales, so they stay finite, and
attention masks them.

Non-finite input is reported, not raised, as ``Quantized.nonfinite``: a 0-dim bool tensor on x's
device, True when a real value was NaN or inf. Callers read it once per forward pass rather than
synchronising with the device in every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from evalkit.errors import SchemeError
from evalkit.kv import microscaling as mx
from evalkit.kv.codec import family_of
from evalkit.kv.device_exact import divide
from evalkit.kv.formats import FormatKind, KVFormat, Recipe, ScaleDType, storable
from evalkit.kv.packing import pack_nibbles, unpack_nibbles
from evalkit.kv.rounding import round_integer, round_to_fp8_stored, round_to_grid, round_vllm_cpu, vllm_cpu_quotient
from evalkit.kv.scheme import Granularity, GranularityKind

# dims of the grouped view (see _grouped) reduced to one scale
_REDUCE_DIMS = {
    GranularityKind.TENSOR: (1, 2, 3),
    GranularityKind.HEAD: (2, 3),
    GranularityKind.TOKEN: (3,),
    GranularityKind.GROUP: (4,),
    GranularityKind.BLOCK: (3, 4),
}
PER_TOKEN = (GranularityKind.TOKEN, GranularityKind.GROUP)
SCALE_FLOOR = torch.finfo(torch.float32).tiny  # smallest normal float32: no dynamic scale underflows to 0


@dataclass
class Quantized:
    """Codes (float32 values on the format's grid, shaped like x), scale and zero point (or None)."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    granularity: Granularity | None  # None: a given scale that broadcasts against x as it is
    nonfinite: torch.Tensor
    tensor_scale: torch.Tensor | None = None  # NVFP4's per-sequence FP32 scale (B, 1, 1, 1), already in ``scale``
    stored: torch.Tensor | None = (
        None  # the stored tensor of ``codes`` where rounding made it anyway (see encode_quantized)
    )
    values: torch.Tensor | None = None  # an engine codec's dequantized values (evalkit.kv.codecs.slot)


def check_granularity(granularity: Granularity, head_dim: int) -> None:
    if granularity.kind is GranularityKind.GROUP and head_dim % granularity.size:
        raise SchemeError(
            f"group{granularity.size} does not divide head_dim {head_dim}: use a group width that divides {head_dim}"
        )


def round_codes(y: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """Clamp float32 ``y`` to the format's range and round it to a representable code by
    ``fmt.rounding`` (float32 out)."""
    return _round_and_store(y, fmt)[0]


def _round_and_store(y: torch.Tensor, fmt: KVFormat) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`round_codes`, plus the stored float8 tensor where rounding made it anyway (a small FP8
    tensor rounded to nearest even, e.g. a decode token, is rounded by torch's cast), so storing it
    costs no second cast (:func:`encode_quantized`; the same bytes as ``encode``, tested)."""
    if fmt.recipe is Recipe.VLLM_CPU:
        return round_vllm_cpu(y, fmt), None
    if fmt.kind is FormatKind.FLOAT:
        if fmt.own_codes:  # a minifloat without a torch dtype (E2M1): rounded on its grid by its fields
            codes = round_to_grid(y.to(torch.float32), fmt)
            return (mx.sglang_zero_sign(y, codes) if fmt.recipe is Recipe.SGLANG else codes), None
        return round_to_fp8_stored(y.clamp(-fmt.max, fmt.max), fmt)
    return round_integer(y, fmt.rounding).clamp_(fmt.qmin, fmt.qmax), None


def _quotient(x: torch.Tensor, scale: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """``x / scale`` in float32; vLLM's CPU store (``recipe=vllm_cpu``) multiplies by ``float32(1 / scale)``."""
    return vllm_cpu_quotient(x, scale) if fmt.recipe is Recipe.VLLM_CPU else x / scale


def scale_from_amax(
    amax: torch.Tensor, fmt: KVFormat, global_scale: torch.Tensor | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Dynamic symmetric scale from each group's amax, rounded to ``fmt.scale_dtype`` (float32 out).

    fp32: ``amax / max``, at least :data:`SCALE_FLOOR` (groups with amax 0 get scale 1); e8m0 and
    e4m3: see the table above.
    ``global_scale`` is NVFP4's per-tensor scale (broadcast against amax); ``dtype`` is the K/V's
    own dtype, which SGLang's exponent rule computes in."""
    if fmt.scale_dtype is ScaleDType.E8M0:
        if fmt.recipe is Recipe.SGLANG:
            return mx.sglang_e8m0_scale(amax, torch.bfloat16 if dtype == torch.bfloat16 else torch.float32)
        return mx.e8m0_scale(amax, fmt.emax)
    if fmt.scale_dtype is ScaleDType.E4M3:
        if global_scale is None:
            return mx.round_scale_to_e4m3(torch.where(amax > 0, divide(amax, fmt.max), torch.ones_like(amax)))
        return mx.nvfp4_group_scales(amax, global_scale) * global_scale
    return torch.where(amax > 0, divide(amax, fmt.qmax).clamp_(min=SCALE_FLOOR), 1.0)


def _grouped(x: torch.Tensor, granularity: Granularity) -> torch.Tensor:
    """A view of x in which each scale group is reduced over :data:`_REDUCE_DIMS` (blocks padded with 0)."""
    b, h, s, d = x.shape
    if granularity.kind is GranularityKind.GROUP:
        return x.reshape(b, h, s, d // granularity.size, granularity.size)
    if granularity.kind is GranularityKind.BLOCK:
        n = granularity.size
        if s <= n:  # one block (a decode step's partly filled block): padding zeros would change no amax
            return x.reshape(b, h, 1, s, d)
        pad = (-s) % n
        if pad:
            x = torch.nn.functional.pad(x, (0, 0, 0, pad))
        return x.reshape(b, h, (s + pad) // n, n, d)
    return x


def _ungrouped(g: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    b, h, s, d = shape
    return g.reshape(b, h, -1, d)[:, :, :s, :]


def _stored(t: torch.Tensor, granularity: Granularity) -> torch.Tensor:
    """Grouped-view scale (keepdim) -> the stored scale shape of the table above."""
    if granularity.kind is GranularityKind.GROUP:
        return t.squeeze(-1)
    if granularity.kind is GranularityKind.BLOCK:
        return t.squeeze(-1).squeeze(-1)
    return t


def _broadcast(t: torch.Tensor, granularity: Granularity) -> torch.Tensor:
    """Stored scale shape -> the grouped-view shape that broadcasts against :func:`_grouped`."""
    if granularity.kind is GranularityKind.GROUP:
        return t.unsqueeze(-1)
    if granularity.kind is GranularityKind.BLOCK:
        return t[..., None, None]
    return t


def quantize(
    x: torch.Tensor,
    fmt: KVFormat,
    granularity: Granularity,
    *,
    scale: torch.Tensor | None = None,
    zero: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
    tensor_scale: torch.Tensor | None = None,
    role: str = "k",
) -> Quantized:
    """Quantize ``x`` (B, H, S, D) under ``fmt``: dynamic scales per ``granularity``, or the given ``scale``.

    ``tensor_scale``: NVFP4's per-sequence scale (B, 1, 1, 1) to reuse instead of computing it from x.
    ``role``: ``"k"`` or ``"v"``, for the engine codecs that store K and V differently (:mod:`evalkit.kv.codec`)."""
    if fmt.is_unscaled:
        raise AssertionError("an unscaled 16-bit cache stores values, not codes")
    family = family_of(fmt.recipe)
    if family is not None:  # an engine's own cache type: its store kernel (a rotation, a codebook, a packed slot)
        return family.quantize(x, fmt, role)
    xf = x.float()
    if scale is not None:
        if fmt.scale_dtype is not ScaleDType.FP32 or fmt.group_scaled:
            raise AssertionError(f"{fmt.name} with {fmt.scale_dtype.value} scales computes its own per-group scales")
        if fmt.asymmetric and zero is None:
            raise AssertionError("an asymmetric format needs the zero point with its scale")
        real = xf if valid is None else xf.masked_fill(~valid[:, None, :, None], 0.0)
        nonfinite = ~torch.isfinite(real.abs().amax())
        if fmt.asymmetric:
            codes = (round_integer(xf / scale, fmt.rounding) + zero).clamp_(0, fmt.qmax)
            return Quantized(codes, scale, zero, None, nonfinite)
        codes, stored = _round_and_store(_quotient(xf, scale, fmt), fmt)
        return Quantized(codes, scale, zero, None, nonfinite, stored=stored)
    g = _grouped(xf, granularity)
    stats = g
    if valid is not None and granularity.kind not in PER_TOKEN:
        stats = _grouped(xf.masked_fill(~valid[:, None, :, None], 0.0), granularity)
    dims = _REDUCE_DIMS[granularity.kind]
    if fmt.asymmetric:
        lo = stats.amin(dim=dims, keepdim=True).clamp_(max=0)
        hi = stats.amax(dim=dims, keepdim=True).clamp_(min=0)
        span = hi - lo
        s = torch.where(span > 0, divide(span, fmt.qmax).clamp_(min=SCALE_FLOOR), torch.ones_like(span))
        z = torch.round(-lo / s)
        codes = (round_integer(g / s, fmt.rounding) + z).clamp_(0, fmt.qmax)
        nonfinite = ~torch.isfinite(hi - lo).all()
        return Quantized(
            _ungrouped(codes, x.shape), _stored(s, granularity), _stored(z, granularity), granularity, nonfinite
        )
    amax = stats.abs().amax(dim=dims, keepdim=True)
    global_scale = None
    if fmt.tensor_scale:
        global_scale = tensor_scale if tensor_scale is not None else _nvfp4_global(xf, valid)
        global_scale = global_scale.reshape(-1, *([1] * (g.dim() - 1)))
    s = scale_from_amax(amax, fmt, global_scale, x.dtype)
    codes, stored = _round_and_store(_quotient(g, s, fmt), fmt)
    return Quantized(
        _ungrouped(codes, x.shape),
        _stored(s, granularity),
        None,
        granularity,
        ~torch.isfinite(amax).all(),
        None if global_scale is None else global_scale.reshape(-1, 1, 1, 1),
        None if stored is None else _ungrouped(stored, x.shape),
    )


def _nvfp4_global(xf: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """NVFP4's per-tensor scale of each sequence in x (B, 1, 1, 1), from its real tokens."""
    real = xf if valid is None else xf.masked_fill(~valid[:, None, :, None], 0.0)
    return mx.nvfp4_global_scale(real.abs().amax(dim=(1, 2, 3), keepdim=True))


def dequantize(q: Quantized, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(codes - zero) * scale`` broadcast back over x's shape, cast to ``dtype``."""
    if q.values is not None:  # an engine codec computed what its attention reads (evalkit.kv.codecs.slot)
        return q.values.to(dtype)
    codes = q.codes
    if q.granularity is None:
        if q.zero is not None:
            codes = codes - q.zero
        return (codes * q.scale).to(dtype)
    g = _grouped(codes, q.granularity)
    if q.zero is not None:
        g = g - _broadcast(q.zero, q.granularity)
    return _ungrouped(g * _broadcast(q.scale, q.granularity), codes.shape).to(dtype)


def quantize_dequantize(
    x: torch.Tensor,
    fmt: KVFormat,
    granularity: Granularity,
    *,
    scale: torch.Tensor | None = None,
    zero: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """What a cache returns for ``x`` written in one piece: ``dequantize(quantize(x))`` in x's dtype
    (for the unscaled 16-bit caches: x itself, or x rounded to bf16/fp16)."""
    if fmt.is_unscaled:
        return cast_16bit(x, fmt)
    return dequantize(quantize(x, fmt, granularity, scale=scale, zero=zero, valid=valid), x.dtype)


# -- stored bytes --------------------------------------------------------------------------------
def cast_16bit(x: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """What an unscaled 16-bit cache returns for ``x``: x itself (``auto``), or x rounded to the
    cache's dtype (``bf16``, ``fp16``: torch's cast, nearest even) and read back in x's dtype."""
    if fmt.torch_dtype is None or x.dtype == fmt.torch_dtype:
        return x
    return x.to(fmt.torch_dtype).to(x.dtype)


def _check_storable(fmt: KVFormat) -> None:
    why = storable(fmt)
    if why is not None:
        raise SchemeError(
            f"KV format {fmt.name}: evalkit's store holds 8-bit codes and 4-bit codes two per byte, not {why}: "
            "store such a format in a codec family's own slot (evalkit.kv.codecs.slot) and register it there "
            "(evalkit.kv.formats.register_format)"
        )


def encode(codes: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """Float32 codes (already on the format's grid) -> the stored tensor: float8, int8, uint8 or
    4-bit codes packed two per byte along head_dim (low nibble first; FP4 in the OCP bit layout
    S E E M). Exact. A width or signedness this store cannot hold (``storable``) is refused in one line."""
    _check_storable(fmt)
    if fmt.own_codes:
        stored = mx.float_to_code(codes, fmt, check=False)  # no host read-back: runs in every layer
        return pack_nibbles(stored) if fmt.packed else stored
    if fmt.kind is FormatKind.FLOAT:
        return codes.to(fmt.storage_dtype)
    if fmt.packed:
        return pack_nibbles(codes if fmt.asymmetric else codes + 8)
    return codes.to(fmt.storage_dtype)


def encode_quantized(q: Quantized, fmt: KVFormat) -> torch.Tensor:
    """The stored tensor of ``q``'s codes: ``encode(q.codes, fmt)``, or the float8 tensor that
    rounding already made (:attr:`Quantized.stored`), which holds the same bytes."""
    return q.stored if q.stored is not None else encode(q.codes, fmt)


def decode(stored: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """The stored tensor -> float32 codes (inverse of :func:`encode`; the same refusal)."""
    _check_storable(fmt)
    if fmt.own_codes:
        return mx.code_to_float(mx.unpack_fp4(stored) if fmt.packed else stored, fmt, check=False)
    if fmt.kind is FormatKind.FLOAT:
        return stored.to(torch.float32)
    if fmt.packed:
        c = unpack_nibbles(stored).to(torch.float32)
        return c if fmt.asymmetric else c - 8
    return stored.to(torch.float32)
