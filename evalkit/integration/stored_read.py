"""Stored bytes -> the values attention reads: ``(code - zero) * scale``, per granularity, or an engine
codec's own slot bytes read by the codec.

The one place both storage caches read from (:class:`~evalkit.integration.stored.StoredTensor` and the
static-shape cache, :mod:`~evalkit.integration.static_cache`): :func:`dequantize_stored` is the plain
arithmetic, :func:`read_stored` the same cast to the K/V's dtype, through
:mod:`~evalkit.integration.fast_dequant`'s fused loop for 1-byte codes on the CPU (the same bits, tested).
"""

from __future__ import annotations

import torch

from evalkit.integration import fast_dequant
from evalkit.kv.codec import codec_for
from evalkit.kv.formats import KVFormat
from evalkit.kv.quantize import decode
from evalkit.kv.scheme import Granularity, GranularityKind


def dequantize_stored(
    codes: torch.Tensor,
    fmt: KVFormat,
    granularity: Granularity,
    scale: torch.Tensor,
    zero: torch.Tensor | None,
    role: str = "k",
    dim: int | None = None,
) -> torch.Tensor:
    """Stored bytes (B, H, S, ...) -> the float32 values attention reads: ``(code - zero) * scale``.

    ``scale`` as the store keeps it, broadcast per granularity: a fixed, tensor or head scale
    (B|1, H|1, 1, 1), a token's (B, H, S, 1), a group's (B, H, S, D/N), or for blocks one per
    position (B, H, S), already taken from each position's block. An engine codec's slot bytes are
    read by the codec itself (``dim``: its head_dim). The one place both storage caches read from."""
    codec = codec_for(fmt.recipe)
    if codec is not None:  # the engine's packed slot bytes, read by the codec
        return codec.decode(codes, role, dim, **codec.rope(fmt.rope_dim))
    values = decode(codes, fmt)
    if granularity.kind is GranularityKind.GROUP and scale.shape[-1] != 1:
        b, h, s, d = values.shape
        g = values.reshape(b, h, s, scale.shape[-1], -1)
        if zero is not None:
            g = g - zero.unsqueeze(-1)
        return (g * scale.unsqueeze(-1)).reshape(b, h, s, d)
    if granularity.kind is GranularityKind.BLOCK and scale.dim() == 3:
        return values * scale[..., None]
    return (values if zero is None else values - zero) * scale


def read_stored(
    codes: torch.Tensor,
    fmt: KVFormat,
    granularity: Granularity,
    scale: torch.Tensor,
    zero: torch.Tensor | None,
    dtype: torch.dtype,
    role: str = "k",
    dim: int | None = None,
) -> torch.Tensor:
    """:func:`dequantize_stored` cast to ``dtype``: what attention reads. 1-byte codes on the CPU go
    through :mod:`~evalkit.integration.fast_dequant`'s fused loop (the same bits, tested), the rest
    through :func:`dequantize_stored` itself."""
    if codec_for(fmt.recipe) is None and not fmt.packed and not fmt.own_codes and fast_dequant.applies(codes):
        grouped = granularity.kind is GranularityKind.GROUP and scale.shape[-1] != 1
        if granularity.kind is GranularityKind.BLOCK and scale.dim() == 3:
            scale, zero = scale[..., None], None  # one scale per position; blocks are symmetric
        return fast_dequant.dequantize(codes, scale, zero, dtype, grouped)
    return dequantize_stored(codes, fmt, granularity, scale, zero, role, dim).to(dtype)
