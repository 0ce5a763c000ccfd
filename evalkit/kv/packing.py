"""Codes and numbers as the bytes a KV cache stores them in: the one place that packs.

* :func:`pack_nibbles` / :func:`unpack_nibbles`: two 4-bit codes per byte along the last dimension,
  element ``2i`` in the low nibble (evalkit's INT4 and FP4 caches, OCP MX, vLLM's packed slots);
* :func:`pack_3bit` / :func:`unpack_3bit`: eight 3-bit codes per 24-bit little-endian word
  (TurboQuant's 3-bit indices);
* :func:`float32_bytes`, :func:`float16_bytes` and back: scales and norms stored inside a slot.

ggml's blocks pair element ``j`` with ``j + 16`` instead: :mod:`evalkit.kv.codecs.llamacpp.ggml_blocks`
packs its own.
"""

from __future__ import annotations

import torch


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Integer codes 0..15 (..., D), D even -> (..., D/2) uint8, element 2i in the low nibble."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_nibbles(b: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_nibbles`: uint8 (..., n) -> codes uint8 (..., 2n)."""
    return torch.stack((b & 0xF, b >> 4), dim=-1).reshape(*b.shape[:-1], b.shape[-1] * 2)


def pack_3bit(codes: torch.Tensor) -> torch.Tensor:
    """Codes 0..7 (..., D), D a multiple of 8 -> (..., 3D/8) uint8: each 8 codes as one 24-bit word,
    code j at bits 3j, stored little-endian (TurboQuant's 3-bit packing)."""
    c = codes.to(torch.int32).reshape(*codes.shape[:-1], -1, 8)
    word = (c << (torch.arange(8, device=c.device, dtype=torch.int32) * 3)).sum(-1)
    out = torch.stack(((word & 0xFF), (word >> 8) & 0xFF, (word >> 16) & 0xFF), dim=-1)
    return out.to(torch.uint8).reshape(*codes.shape[:-1], -1)


def unpack_3bit(b: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_3bit`: uint8 (..., 3n) -> codes int32 (..., 8n)."""
    w = b.to(torch.int32).reshape(*b.shape[:-1], -1, 3)
    word = w[..., 0] | (w[..., 1] << 8) | (w[..., 2] << 16)
    shifts = torch.arange(8, device=b.device, dtype=torch.int32) * 3
    return ((word[..., None] >> shifts) & 7).reshape(*b.shape[:-1], -1)


def float32_bytes(t: torch.Tensor) -> torch.Tensor:
    """float32 (..., 1) -> its 4 little-endian bytes (..., 4) uint8."""
    return t.contiguous().view(torch.uint8)


def float16_bytes(t: torch.Tensor) -> torch.Tensor:
    """(..., 1) -> float16's 2 little-endian bytes (..., 2) uint8."""
    return t.to(torch.float16).contiguous().view(torch.uint8)


def bytes_float16(b: torch.Tensor) -> torch.Tensor:
    """(..., 2) uint8 -> (..., 1) float32 read as float16."""
    return b.contiguous().view(torch.float16).float()


def bytes_float32(b: torch.Tensor) -> torch.Tensor:
    """(..., 4) uint8 -> (..., 1) float32."""
    return b.contiguous().view(torch.float32)
