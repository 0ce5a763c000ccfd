"""Quantize-dequantize of K/V tensors under a scheme's format and granularity.

Shapes: K and V arrive as (batch, kv_heads, seq, head_dim). A *scale* multiplies the stored code
to give back the value (the vLLM / compressed-tensors convention): ``x_hat = code * scale`` with
``code = round(clamp(x / scale))``. Dynamic scales are ``amax / format_max`` computed in float32
over the elements that share the scale (zero amax gives scale 1, so an all-zero group stays zero).

Where the scales come from is the caller's business (:func:`dynamic_scale` here, a static table,
or 1.0); this module only knows how to reduce amax over a granularity and how to round.

Padding: ``valid`` (batch, seq) marks real tokens; padded positions are left out of amax
(engines never store padding) and are passed through unchanged (attention masks them anyway).
Blocks are aligned to each sequence's first real token, as a paged cache would place them.
"""

from __future__ import annotations

import torch

from evalkit.errors import NonFiniteKVError, SchemeError
from evalkit.kv.formats import KVFormat
from evalkit.kv.rounding import round_to_fp8
from evalkit.kv.scheme import Granularity, GranularityKind


GROUP_DIMS = {GranularityKind.TENSOR: (1, 2, 3), GranularityKind.HEAD: (2, 3), GranularityKind.TOKEN: (3,),
              GranularityKind.GROUP: (-1,), GranularityKind.BLOCK: (3, 4)}


def check_granularity(granularity: Granularity, head_dim: int) -> None:
    if granularity.kind is GranularityKind.GROUP and head_dim % granularity.size:
        raise SchemeError(
            f"group{granularity.size} does not divide head_dim {head_dim}: use a group width that divides {head_dim}"
        )


def group_amax(x: torch.Tensor, granularity: Granularity) -> torch.Tensor:
    """amax of |x| (float32) over each scale group of grouped ``x`` (see :func:`grouped`), keepdim.

    Group and block inputs are grouped: (B, H, S, D/N, N) and (B, H, S/N, N, D)."""
    return x.abs().amax(dim=GROUP_DIMS[granularity.kind], keepdim=True)


def grouped(x: torch.Tensor, granularity: Granularity) -> torch.Tensor:
    """Reshape so that each scale group is reducible by :func:`group_amax` (may pad blocks with zeros)."""
    b, h, s, d = x.shape
    if granularity.kind is GranularityKind.GROUP:
        return x.reshape(b, h, s, d // granularity.size, granularity.size)
    if granularity.kind is GranularityKind.BLOCK:
        n = granularity.size
        pad = (-s) % n
        if pad:
            x = torch.nn.functional.pad(x, (0, 0, 0, pad))
        return x.reshape(b, h, (s + pad) // n, n, d)
    return x


def ungrouped(x: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    b, h, s, d = shape
    return x.reshape(b, h, -1, d)[:, :, :s, :]


def scale_from_amax(amax: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """Dynamic scale: amax / max (float32); groups with amax 0 get scale 1."""
    if fmt.asymmetric:
        raise AssertionError("asymmetric formats use min/max ranges, see quantize_dequantize")
    scale = amax / fmt.qmax
    return torch.where(amax > 0, scale, torch.ones_like(scale))


def round_codes(y: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """Clamp to the format's range and round to a representable code (float32 in, float32 out)."""
    if fmt.kind == "float":
        return round_to_fp8(y.clamp(-fmt.max, fmt.max), fmt)
    return torch.round(y).clamp(fmt.qmin, fmt.qmax)


def fake_quantize(x: torch.Tensor, fmt: KVFormat, granularity: Granularity, scale: torch.Tensor | None = None,
                  valid: torch.Tensor | None = None, check_finite: bool = False) -> torch.Tensor:
    """Quantize and dequantize ``x`` (B, H, S, D); returns a tensor of x's dtype.

    ``scale`` given (static or unit): a tensor broadcastable to (B, H, S, D) — only tensor/head
    granularity take one. ``scale`` None: dynamic, from the values (and ``valid`` positions).
    ``check_finite``: raise :class:`NonFiniteKVError` if a real (non-padding) value is NaN or inf;
    with dynamic symmetric scales this reads the amax (which propagates NaN and inf) at no cost.
    """
    if fmt.is_identity:
        return x
    if valid is not None and not bool(valid.all()):
        return _fake_quantize_padded(x, fmt, granularity, scale, valid, check_finite)
    xf = x.float()
    if scale is not None or fmt.asymmetric:
        if check_finite and not bool(torch.isfinite(xf).all()):
            raise NonFiniteKVError("non-finite K/V")
        if scale is not None:
            return (round_codes(xf / scale, fmt) * scale).to(x.dtype)
        return ungrouped(_asymmetric(grouped(xf, granularity), fmt, granularity), x.shape).to(x.dtype)
    g = grouped(xf, granularity)
    amax = group_amax(g, granularity)
    if check_finite and not bool(torch.isfinite(amax).all()):
        raise NonFiniteKVError("non-finite K/V")
    s = scale_from_amax(amax, fmt)
    return ungrouped(round_codes(g / s, fmt).mul_(s), x.shape).to(x.dtype)


def asymmetric_params(g: torch.Tensor, fmt: KVFormat, granularity: Granularity) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric integer scale and zero point over grouped ``g``: scale = (max - min) / (2**bits - 1),
    zero = round(-min / scale); the range always includes 0 so that zero is exact."""
    dims = GROUP_DIMS[granularity.kind]
    lo = g.amin(dim=dims, keepdim=True).clamp(max=0)
    hi = g.amax(dim=dims, keepdim=True).clamp(min=0)
    scale = (hi - lo) / fmt.qmax
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return scale, torch.round(-lo / scale)


def asymmetric_codes(g: torch.Tensor, fmt: KVFormat, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    return (torch.round(g / scale) + zero).clamp(0, fmt.qmax)


def _asymmetric(g: torch.Tensor, fmt: KVFormat, granularity: Granularity) -> torch.Tensor:
    scale, zero = asymmetric_params(g, fmt, granularity)
    return (asymmetric_codes(g, fmt, scale, zero) - zero) * scale


def _fake_quantize_padded(x, fmt, granularity, scale, valid, check_finite=False):
    """Per sequence: quantize only the real tokens (blocks start at the first real token)."""
    out = x.clone()
    for b in range(x.shape[0]):
        idx = valid[b].nonzero().flatten()
        if idx.numel() == 0:
            continue
        lo, hi = int(idx[0]), int(idx[-1]) + 1
        if hi - lo != idx.numel():
            raise SchemeError("padding inside a sequence is not supported: pad on one side only")
        s_b = None
        if scale is not None:
            s_b = scale[b : b + 1] if scale.dim() == 4 and scale.shape[0] == x.shape[0] else scale
        out[b : b + 1, :, lo:hi] = fake_quantize(x[b : b + 1, :, lo:hi], fmt, granularity, s_b, check_finite=check_finite)
    return out


def dynamic_amax(x: torch.Tensor, granularity: Granularity, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Per-sequence amax at tensor or head granularity (what calibration and frozen scales need)."""
    a = x.detach().float().abs()
    if valid is not None:
        a = a.masked_fill(~valid[:, None, :, None], 0.0)
    if granularity.kind is GranularityKind.TENSOR:
        return a.amax(dim=(1, 2, 3), keepdim=True)
    if granularity.kind is GranularityKind.HEAD:
        return a.amax(dim=(2, 3), keepdim=True)
    raise AssertionError("frozen scales exist for tensor and head granularity only")
