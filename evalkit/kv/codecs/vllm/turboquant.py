"""vLLM's TurboQuant KV cache dtypes (``turboquant_k8v4``, ``turboquant_4bit_nc``,
``turboquant_k3v4_nc``, ``turboquant_3bit_nc``), modelled on their store and read kernels.

Read in vLLM 0.32:

- presets, ``vllm/model_executor/layers/quantization/turboquant/config.py`` (``TQ_PRESETS``,
  ``TurboQuantConfig``): key bits 8 (FP8 keys) or 3/4 (Lloyd-Max keys), value bits 3/4, norm
  correction; ``key_packed_size`` = ``head_dim`` (FP8) or ``ceil(head_dim * bits / 8) + 2``;
  ``value_packed_size`` = ``ceil(head_dim * bits / 8) + 4``; one slot per head holds K then V,
  rounded up to an even size;
- codebook, ``.../turboquant/centroids.py`` ``solve_lloyd_max``/``get_centroids`` (:func:`centroids`);
- rotation and midpoints, ``vllm/v1/attention/backends/turboquant_attn.py`` ``_ensure_on_device``:
  the orthonormal Sylvester Hadamard matrix ``H / sqrt(d)`` (no sign vector), midpoints
  ``(c[i] + c[i+1]) / 2`` of the sorted float32 centroids;
- store, ``vllm/v1/attention/ops/triton_turboquant_store.py``: ``triton_turboquant_store`` (launcher:
  ``norm = ||k||``, ``y = (k / (norm + 1e-8)) @ H``, float32), ``_tq_fused_store_mse`` (index =
  number of midpoints <= y, by binary search; 4-bit indices two per byte, low nibble first; 3-bit
  ones eight per 24-bit little-endian word; the norm as float16), ``_tq_fused_store_fp8`` (keys cast
  to FP8 E4M3 as they are, no scale) and ``_store_quantized_value`` (values: ``scale = max((max -
  min) / (2**bits - 1), 1e-8)`` where ``(max - min) / L > 1e-8``, ``code = clamp(int((v - min) /
  scale + 0.5), 0, L)``: a division, round half up; then float16 scale and float16 min);
- read, ``vllm/v1/attention/ops/triton_turboquant_decode.py`` (decode kernel and
  ``_tq_full_dequant_kv``): key ``= float16(norm) * c[idx]``, with norm correction ``c / sqrt(sum
  c**2 + 1e-16)`` first (the ``_nc`` presets), in the rotated space; value ``= code * float16(scale)
  + float16(min)``. The dequantized key is rotated back here (``H`` is symmetric and orthonormal).

Approximate, and why: the engine's rotation is a float32 GEMM (cuBLAS), this one the butterfly
(:func:`evalkit.kv.hadamard.fwht_orthonormal`): equal up to float32 summation order, which moves an
index only where ``y`` lies within rounding of a midpoint (counted by the kernel conformance).
Likewise the key norm: the launcher takes it with ``torch.norm`` on the device, whose summation
order is torch's CUDA reduction (per-thread partial sums, then a shuffle tree; not a documented
order, and another on the CPU), and the ``_nc`` read kernels re-normalise with Triton's ``tl.sum``
(an order fixed by the kernel's compiled layout). No engine order is fixed, so evalkit fixes one:
both sums are :func:`evalkit.kv.device_exact.tree_sum` (pairwise halves), the same bits on every
device, and the roots are correctly rounded (:func:`evalkit.kv.device_exact.sqrt`; torch's float32
``sqrt`` on an AVX-512 CPU is not). The value scale ``(max - min) / L`` is the correctly rounded
quotient on every device (:func:`evalkit.kv.device_exact.divide`), as the Triton interpreter
computes it (the H200 comparison of the compiled store found every float16 scale equal to it).
Keys of ``k8v4`` are E4M3 (``tl.float8e4nv``, Hopper and later: RNE, saturating); on Ampere/Ada
(SM < 8.9) the kernel uses ``float8e4b15`` instead, not modelled. A large continuation chunk reads
float16-rounded dequantized K/V (``_continuation_prefill``); decode reads float32, modelled here.

Unquantized parts: the first and last two attention layers of a dense model
(``get_boundary_skip_layers``), and a first-chunk prefill's attention, which reads the raw K/V.
"""

from __future__ import annotations

import functools
import math

import torch

from evalkit.errors import SchemeError
from evalkit.kv import packing
from evalkit.kv.codecs.slot import TOKEN, Codec, packed
from evalkit.kv.device_exact import divide, sqrt, tree_norm, tree_sum
from evalkit.kv.formats import CodecRecipe
from evalkit.kv.hadamard import fwht_orthonormal, is_power_of_two
from evalkit.kv.quantize import Quantized

PRESETS = {  # name: (key bits, value bits, norm correction), config.py TQ_PRESETS
    "turboquant_k8v4": (8, 4, False),
    "turboquant_4bit_nc": (4, 4, True),
    "turboquant_k3v4_nc": (3, 4, True),
    "turboquant_3bit_nc": (3, 3, True),
}
NORM_EPS = 1e-8  # k / (norm + 1e-8)
VALUE_SCALE_MIN = 1e-8
NC_EPS = 1e-16
FP8_MAX = 448.0
BOUNDARY_LAYERS = 2


# -- Lloyd-Max codebook (centroids.py) -----------------------------------------------------------
def _pdf(x: float, var: float) -> float:
    return (1.0 / math.sqrt(2 * math.pi * var)) * math.exp(-x * x / (2 * var))


def _integral(f, a: float, b: float, n: int = 200) -> float:
    """Trapezoidal rule with n intervals, summed in the engine's order."""
    step = (b - a) / n
    total = 0.5 * (f(a) + f(b))
    for i in range(1, n):
        total += f(a + i * step)
    return total * step


@functools.lru_cache(maxsize=32)
def centroids(head_dim: int, bits: int, max_iter: int = 200, tol: float = 1e-10) -> tuple[float, ...]:
    """The Lloyd-Max centroids for N(0, 1/head_dim) with 2**bits levels, as float32 values, ascending.

    Start from ``2**bits`` equal cells over +-3.5 sigma; each iteration puts the boundaries at the
    centroid midpoints (the outer edges at +-10.5 sigma) and each centroid at its cell's mean by the
    trapezoidal rule (200 intervals; a cell of mass <= 1e-15 keeps its centroid); stop when no
    centroid moves by ``tol`` (keeping the previous ones) or after ``max_iter`` iterations."""
    levels, var = 2**bits, 1.0 / head_dim
    sigma = math.sqrt(var)
    lo, hi = -3.5 * sigma, 3.5 * sigma
    c = [lo + (hi - lo) * (i + 0.5) / levels for i in range(levels)]
    for _ in range(max_iter):
        edges = [lo * 3] + [(c[i] + c[i + 1]) / 2.0 for i in range(levels - 1)] + [hi * 3]
        new = []
        for i in range(levels):
            a, b = edges[i], edges[i + 1]
            num = _integral(lambda x: x * _pdf(x, var), a, b)
            den = _integral(lambda x: _pdf(x, var), a, b)
            new.append(num / den if den > 1e-15 else c[i])
        if max(abs(new[i] - c[i]) for i in range(levels)) < tol:
            break
        c = new
    return tuple(torch.tensor(c, dtype=torch.float32).tolist())


def codebook(head_dim: int, bits: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(centroids, midpoints) as float32 tensors: the midpoints in float32 arithmetic, as the backend."""
    return _codebook(head_dim, bits, str(torch.device(device or "cpu")))


@functools.lru_cache(maxsize=64)
def _codebook(head_dim: int, bits: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    c = torch.tensor(centroids(head_dim, bits), dtype=torch.float32, device=device).sort().values
    return c, (c[:-1] + c[1:]) * 0.5  # the backend's "/ 2": exact either way


# -- store ---------------------------------------------------------------------------------------
def key_width(name: str, head_dim: int) -> int:
    kb = PRESETS[name][0]
    return head_dim if kb == 8 else math.ceil(head_dim * kb / 8) + 2


def value_width(name: str, head_dim: int) -> int:
    return math.ceil(head_dim * PRESETS[name][1] / 8) + 4


def _check(name: str, head_dim: int) -> None:
    kb, vb, _ = PRESETS[name]
    rotated = kb != 8
    if (rotated and not is_power_of_two(head_dim)) or head_dim < 16 or head_dim % 8:
        need = (
            "a power-of-two head_size >= 16 (its Hadamard rotation)"
            if rotated
            else "a head_size >= 16, a multiple of 8"
        )
        raise SchemeError(f"vllm:{name} needs {need}, not {head_dim}: use vllm:fp8 for this model")


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    return packing.pack_nibbles(codes) if bits == 4 else packing.pack_3bit(codes)


def unpack_codes(b: torch.Tensor, bits: int) -> torch.Tensor:
    return (packing.unpack_nibbles(b) if bits == 4 else packing.unpack_3bit(b)).long()


def key_rotated(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, norm): the launcher's rotated unit key and its float32 norm (..., 1)."""
    k = x.float()
    norm = tree_norm(k, keepdim=True)
    return fwht_orthonormal(k / (norm + NORM_EPS)), norm


def key_indices(y: torch.Tensor, midpoints: torch.Tensor) -> torch.Tensor:
    """The kernel's binary search: how many midpoints are <= y (ties go up; NaN to 0)."""
    return torch.searchsorted(midpoints, y.contiguous(), right=True)


def key_values(idx: torch.Tensor, norm16: torch.Tensor, c: torch.Tensor, nc: bool) -> torch.Tensor:
    """What the read kernels make of an index row and its float16 norm, rotated back (float32)."""
    k = c[idx]
    if nc:
        k = k * (1.0 / sqrt(tree_sum(k * k, keepdim=True) + NC_EPS))
    return fwht_orthonormal(norm16 * k)


def value_codes(v: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes 0..L, float32 scale, float32 min), ``_store_quantized_value``'s arithmetic."""
    top = float(2**bits - 1)
    lo = v.amin(dim=-1, keepdim=True)
    scale = divide(v.amax(dim=-1, keepdim=True) - lo, top)
    scale = torch.where(scale > VALUE_SCALE_MIN, scale, torch.full_like(scale, VALUE_SCALE_MIN))
    codes = torch.trunc((v - lo) / scale + 0.5).clamp(0, top)
    return codes, scale, lo


def _encode(name: str, x: torch.Tensor, role: str) -> Quantized:
    kb, vb, nc = PRESETS[name]
    d = x.shape[-1]
    _check(name, d)
    xf = x.float()
    nonfinite = ~torch.isfinite(xf).all()
    if role == "v":
        codes, scale, lo = value_codes(xf, vb)
        s16, z16 = scale.to(torch.float16), lo.to(torch.float16)
        stored = torch.cat([pack_codes(codes, vb), packing.float16_bytes(s16), packing.float16_bytes(z16)], dim=-1)
        return packed(codes, stored, codes * s16.float() + z16.float(), nonfinite)
    if kb == 8:
        fp8 = xf.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return packed(fp8.float(), fp8.view(torch.uint8), fp8.float(), nonfinite)
    c, mid = codebook(d, kb, x.device)
    y, norm = key_rotated(xf)
    idx = key_indices(y, mid)
    n16 = norm.to(torch.float16)
    stored = torch.cat([pack_codes(idx, kb), packing.float16_bytes(n16)], dim=-1)
    return packed(idx.float(), stored, key_values(idx, n16.float(), c, nc), nonfinite)


def _decode(name: str, stored: torch.Tensor, role: str, d: int) -> torch.Tensor:
    kb, vb, nc = PRESETS[name]
    if role == "v":
        n = math.ceil(d * vb / 8)
        codes = unpack_codes(stored[..., :n], vb).float()
        s, z = packing.bytes_float16(stored[..., n : n + 2]), packing.bytes_float16(stored[..., n + 2 : n + 4])
        return codes * s + z
    if kb == 8:
        return stored.contiguous().view(torch.float8_e4m3fn).float()
    n = math.ceil(d * kb / 8)
    c, _ = codebook(d, kb, stored.device)
    return key_values(unpack_codes(stored[..., :n], kb), packing.bytes_float16(stored[..., n : n + 2]), c, nc)


def _codec(name: str) -> Codec:
    kb = PRESETS[name][0]
    return Codec(
        name=name,
        recipe=CodecRecipe("vllm_" + name),
        format="fp8_e4m3" if kb == 8 else "int4_asym",
        granularity=TOKEN,
        encode=functools.partial(_encode, name),
        decode=functools.partial(_decode, name),
        width=lambda role, d: key_width(name, d) if role == "k" else value_width(name, d),
        check_head_size=functools.partial(_check, name),
        boundary_layers=BOUNDARY_LAYERS,
        prefill_reads_raw=True,
    )


CODECS = tuple(_codec(n) for n in PRESETS)
