"""The inputs of the kernel table (:mod:`evalkit.engines.vllm.kernel_conformance`): an edge table and
seeded random values, both in code units ``y = x / scale``, turned into float32 ``x`` for a scale.

The edge table (:func:`edge_values`; each ``x`` chosen by :func:`values_for` so that the float32 division
gives back exactly ``y`` where such an ``x`` exists): ±0, every finite value of the format (subnormals
included) and the float32 neighbours of each, every rounding midpoint between neighbouring values (and
between 0 and the smallest subnormal) with its float32 neighbours, and values above the format's max up to
float32's max. The random values (:func:`random_values`) are normal, each token at one of
:data:`RANDOM_STDS`: subnormals, normals, E4M3 and E5M2 saturation.
"""

from __future__ import annotations

import torch

# per-tensor scales: 1.0 (what vLLM uses when a checkpoint has none), a power of two, and a calibrated-looking
# one that is not (x / scale is then inexact in float32, so the division itself is exercised)
DEFAULT_SCALES = (1.0, 0.0625, 0.0371)
RANDOM_SHAPE = (128, 3, 96)  # tokens (4 blocks of 32), kv_heads, head_dim: 36,864 values each for K and V
# standard deviations of the random values in code units (x / scale): subnormals, normals, E4M3 and E5M2 saturation
RANDOM_STDS = (0.01, 1.0, 24.0, 300.0, 40000.0)


def f32(v: float) -> float:
    """``v`` rounded to float32 (a scale as the store sees it)."""
    return float(torch.tensor(v, dtype=torch.float32))


def format_values(format_name: str) -> torch.Tensor:
    """Every finite non-negative value of the format, ascending (float32; subnormals included)."""
    dtype = torch.float8_e4m3fn if format_name == "fp8_e4m3" else torch.float8_e5m2
    vals = torch.arange(256, dtype=torch.int16).to(torch.uint8).view(dtype).float()
    return torch.unique(vals[torch.isfinite(vals) & (vals >= 0)])  # -0 and +0 are one value here


def _neighbours(t: torch.Tensor) -> torch.Tensor:
    return torch.cat(
        [torch.nextafter(t, torch.full_like(t, -torch.inf)), t, torch.nextafter(t, torch.full_like(t, torch.inf))]
    )


def edge_values(format_name: str) -> torch.Tensor:
    """The edge table in code units (``x / scale``), both signs, float32 (see the module docstring)."""
    vals = format_values(format_name)  # 0, subnormals, normals, max
    top = vals[-1]
    step = vals[-1] - vals[-2]
    mids = (vals[:-1] + vals[1:]) / 2  # exact in float32: neighbours differ by a few bits
    above = torch.tensor([top + step / 2, top + step, 2 * top, 1e4 * top, 1e30, torch.finfo(torch.float32).max])
    tiny = torch.tensor([torch.finfo(torch.float32).smallest_normal, 1e-45, vals[1] / 4])
    pos = torch.cat([_neighbours(vals), _neighbours(mids), _neighbours(above), tiny])
    pos = torch.unique(pos[torch.isfinite(pos) & (pos >= 0)])
    return torch.cat([pos, -pos])


def values_for(codes_space: torch.Tensor, scale: float) -> torch.Tensor:
    """float32 ``x`` with ``x / scale == y`` exactly in float32 where some x within a few ulps of
    ``y * scale`` does, else the nearest float32 to ``y * scale``."""
    s = torch.tensor(scale, dtype=torch.float32)
    y = codes_space.float()
    x = (y.double() * scale).clamp(-torch.finfo(torch.float32).max, torch.finfo(torch.float32).max).float()
    if scale == 1.0:
        return x
    best = x.clone()
    hit = (x / s) == y
    for direction in (torch.inf, -torch.inf):
        cand = x
        for _ in range(4):
            cand = torch.nextafter(cand, torch.full_like(cand, direction))
            ok = ~hit & ((cand / s) == y) & torch.isfinite(cand)
            best = torch.where(ok, cand, best)
            hit = hit | ok
    return best


def random_values(shape: tuple[int, int, int], seed: int, stds=RANDOM_STDS) -> torch.Tensor:
    """Seeded normal values in code units, each token drawn at one of ``stds`` (cycling)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float32)
    per_token = torch.tensor(stds, dtype=torch.float32).repeat(-(-shape[0] // len(stds)))[: shape[0]]
    return x * per_token[:, None, None]


def as_table(flat: torch.Tensor, heads: int, head_dim: int) -> tuple[torch.Tensor, int]:
    """Flat values padded with zeros into (tokens, heads, head_dim); returns it and the count of real values."""
    n = flat.numel()
    per_token = heads * head_dim
    tokens = -(-n // per_token)
    out = torch.zeros(tokens * per_token, dtype=torch.float32)
    out[:n] = flat
    return out.reshape(tokens, heads, head_dim), n
