"""Bytes of KV cache: per cached element, per token, and for a concrete cache state.

Conventions (shared with the real storage cache in :mod:`evalkit.cache`, which is tested to hold
exactly these bytes): data takes ``bits / 8`` bytes per element (INT4 packs two per byte); every
scale is one float32 (4 bytes); asymmetric formats store a float32 zero point beside each scale.
Dynamic per-tensor and per-head scales are kept per sequence, static and unit ones once per layer.
Layers kept unquantized (skipped) take 2 bytes per element (BF16) and no scales.
"""

from __future__ import annotations

import math

from evalkit.scheme import GranularityKind, ScaleSource, Scheme

SCALE_BYTES = 4
BASELINE_BYTES = 2  # BF16


def scale_bytes(scheme: Scheme) -> int:
    return SCALE_BYTES * (2 if scheme.kv_format.asymmetric else 1)


def data_bytes(scheme: Scheme, elements: int) -> int:
    if scheme.is_identity:
        return BASELINE_BYTES * elements
    return math.ceil(elements * scheme.kv_format.bits / 8)


def scale_bytes_per_element(scheme: Scheme, head_dim: int) -> float:
    """Scale overhead amortized per element for long sequences (tensor and head scales -> 0)."""
    if scheme.is_identity:
        return 0.0
    kind, size = scheme.granularity.kind, scheme.granularity.size
    per_scale = scale_bytes(scheme)
    if kind is GranularityKind.TOKEN:
        return per_scale / head_dim
    if kind is GranularityKind.GROUP:
        return per_scale / size
    if kind is GranularityKind.BLOCK:
        return per_scale / (size * head_dim)
    return 0.0


def bytes_per_element(scheme: Scheme, head_dim: int) -> float:
    data = BASELINE_BYTES if scheme.is_identity else scheme.kv_format.bits / 8
    return data + scale_bytes_per_element(scheme, head_dim)


def layer_cache_bytes(scheme: Scheme, batch: int, heads: int, seq: int, head_dim: int, quantized: bool = True) -> int:
    """Exact bytes one layer's K (or V) takes for ``batch`` sequences of ``seq`` stored tokens."""
    if not quantized or scheme.is_identity:
        return BASELINE_BYTES * batch * heads * seq * head_dim
    data = batch * heads * seq * math.ceil(head_dim * scheme.kv_format.bits / 8)
    kind, size = scheme.granularity.kind, scheme.granularity.size
    per_seq = scheme.scales is ScaleSource.DYNAMIC
    if kind is GranularityKind.TENSOR:
        n_scales = batch if per_seq else 1
    elif kind is GranularityKind.HEAD:
        n_scales = (batch if per_seq else 1) * heads
    elif kind is GranularityKind.BLOCK:
        n_scales = batch * heads * math.ceil(seq / size)
    elif kind is GranularityKind.TOKEN:
        n_scales = batch * heads * seq
    else:
        n_scales = batch * heads * seq * (head_dim // size)
    return data + n_scales * scale_bytes(scheme)
