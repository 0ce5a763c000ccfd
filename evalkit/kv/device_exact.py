"""Float arithmetic that gives the same bits on every device, for the values a KV store keeps.

torch promises IEEE results for elementwise float32 ``+ - * /`` and ``sqrt`` on CPU and CUDA alike,
and exact results for ``amax``/``amin``, comparisons and integer arithmetic. Three things it does not
promise, each met in evalkit's emulation of vLLM's stores (issue 39: 7 of 12 ``vllm:`` dtypes gave
other bytes on an H200 than on the CPU), and what this module does instead:

Division by a Python number
    On CUDA, ``x / c`` with ``c`` a Python number (or any CPU scalar) is computed as ``x * fl(1/c)``:
    the float32 reciprocal, taken once on the host, then a multiply (``div_true_kernel_cuda``,
    ``BinaryDivTrueKernel.cu``: "if the second argument is a CPU scalar, compute a * reciprocal(b)");
    on CPU it divides. The two differ in the last bit for about half of all ``x`` when ``1/c`` is
    not a power of two. :func:`times_reciprocal` computes ``fl(x * fl(1/fl(c)))`` on every device
    (what vLLM's compiled per-token-head kernel stores: measured on an H200), and
    :func:`divide` the correctly rounded ``fl(x / c)`` on every device, by dividing by a float32
    tensor on ``x``'s own device (a 0-dim *CPU* tensor would count as a CPU scalar on CUDA).
Sums
    ``torch.sum``, ``norm``, ``matmul`` and ``@`` reduce in an order that depends on the device, the
    kernel torch picks, the layout and the thread count. :func:`tree_sum` adds in one fixed order:
    the upper half of the values onto the lower half, elementwise, until one is left (``log2 n``
    rounds of IEEE float32 additions; a width that is not a power of two is padded with ``+0.0``).
Square roots
    ``torch.sqrt`` of float32 on this project's CPU (torch 2.13, the AVX-512 kernel) is not correctly
    rounded: 168,642 of 1,000,000 seeded values differ from the correctly rounded root (a short tensor,
    on the scalar path, is); CUDA's is correctly rounded. :func:`sqrt` takes the root in float64 and
    rounds it once to float32, which is the correctly rounded float32 root (53 >= 2 * 24 + 2 bits: the
    double rounding is innocuous) on every device.
log2 and exp2
    ``torch.log2`` is the platform's (Sleef on CPU, ``log2f`` on CUDA): within an ulp or so, not
    correctly rounded, and not the same function on both. Where the exponent it gives is stored,
    :func:`log2_round_half_up` and :func:`log2_ceil` give what a *correctly rounded* float32
    ``log2`` gives, exactly, from the input's exponent bits (``torch.frexp``) and one mantissa
    threshold per exponent (found once, on the host, from a correctly rounded log2: ``math.log2``
    in float64 with its margin checked, ``decimal`` where the margin is too thin); and
    :func:`power_of_two` builds ``2**e`` from bits.
"""

from __future__ import annotations

import functools
import math
from decimal import Decimal, localcontext

import numpy as np
import torch

F32 = np.float32
E0_MIN, E0_MAX = -148, 128  # frexp exponents of the positive finite float32 values (2**-149 .. ~2**128)


# -- division ------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def _reciprocal(c: float, device: str) -> torch.Tensor:
    inv = F32(1.0) / F32(c)  # IEEE float32 division on the host: fl(1 / fl(c))
    return torch.tensor(inv, dtype=torch.float32, device=device)


def reciprocal(c: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """``fl(1 / fl(c))``: the float32 reciprocal of the float32 constant ``c``, a 0-dim tensor on ``device``."""
    return _reciprocal(float(c), str(torch.device(device)))


def times_reciprocal(x: torch.Tensor, c: float) -> torch.Tensor:
    """``fl(x * fl(1/c))`` in float32 on every device: what torch on CUDA and vLLM's compiled Triton
    kernels compute for ``x / c``. A 16-bit ``x`` is multiplied in float32 and rounded back once, as
    torch's CUDA kernel does (its opmath type is float32)."""
    out = x.float() * reciprocal(c, x.device)
    return out if x.dtype == torch.float32 else out.to(x.dtype)


@functools.lru_cache(maxsize=64)
def _constant(c: float, device: str) -> torch.Tensor:
    return torch.tensor(c, dtype=torch.float32, device=device)


def divide(x: torch.Tensor, c: float) -> torch.Tensor:
    """``fl(x / c)``, correctly rounded, on every device (float32 ``x``): ``c`` as a float32 tensor on
    ``x``'s device, so that no device turns the division into a multiply by a reciprocal."""
    return x / _constant(float(c), str(x.device))


# -- sums ----------------------------------------------------------------------------------------
def tree_sum(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """The sum along ``dim`` in one fixed order, the same bits on every device and for every layout:
    halves added elementwise (``x[:n/2] + x[n/2:]``) until one value is left. Padded with ``+0.0`` to
    a power of two (so an all ``-0.0`` row sums to ``+0.0``). An empty dim sums to ``+0.0``."""
    t = x.movedim(dim, -1)
    n = t.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    if width != n:
        t = torch.nn.functional.pad(t, (0, width - n))
    while t.shape[-1] > 1:
        half = t.shape[-1] // 2
        t = t[..., :half] + t[..., half:]
    return t.movedim(-1, dim) if keepdim else t.squeeze(-1)


def sqrt(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded float32 square root on every device: in float64, then rounded once."""
    return x.double().sqrt().to(torch.float32)


def tree_norm(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """The Euclidean norm ``sqrt(tree_sum(x * x))``: float32 squares, the fixed-order sum, the correctly
    rounded root (:func:`sqrt`)."""
    return sqrt(tree_sum(x * x, dim, keepdim))


# -- powers of two and log2 ----------------------------------------------------------------------
def power_of_two(exponent: torch.Tensor) -> torch.Tensor:
    """Exact float32 ``2**e`` for integer exponents in [-149, 127] (subnormals included; 128 gives inf):
    float64 bits built from the exponent, then one exact conversion."""
    bits = (exponent.to(torch.int64) + 1023).bitwise_left_shift_(52)
    return bits.view(torch.float64).to(torch.float32)


def _round_to_float32(x: float) -> float:
    return float(F32(x))


def _neighbours(f: float) -> tuple[float, float]:
    f32 = F32(f)
    return float(np.nextafter(f32, F32(-np.inf))), float(np.nextafter(f32, F32(np.inf)))


def _cr_log2(v: float) -> float:
    """The correctly rounded float32 ``log2`` of a positive finite float ``v``, as a Python float."""
    wide = math.log2(v)  # float64, within an ulp of the exact value
    f = _round_to_float32(wide)
    lo, hi = _neighbours(f)
    margin = 8 * math.ulp(wide)
    if all(abs(wide - (f + g) / 2) > margin for g in (lo, hi)):
        return f  # far from both float32 rounding boundaries: the float64 error cannot move it
    with localcontext() as ctx:
        ctx.prec = 60
        exact = Decimal(v).ln() / Decimal(2).ln()
        return min((lo, f, hi), key=lambda g: abs(Decimal(g) - exact))


def _to_dtype(f: float, dtype: torch.dtype) -> float:
    return f if dtype == torch.float32 else float(torch.tensor(f, dtype=torch.float32).to(dtype).float())


def _threshold(e0: int, wins) -> float:
    """The smallest float32 mantissa m in [0.5, 1) with ``wins(m * 2**e0)`` (1.0 if none); ``wins`` monotone."""
    lo, hi = int(F32(0.5).view(np.int32)), int(F32(1.0).view(np.int32))  # wins(hi) stands for "none wins"
    if wins(math.ldexp(0.5, e0)):
        return 0.5
    while hi - lo > 1:  # wins(lo) is False
        mid = (lo + hi) // 2
        if wins(math.ldexp(float(np.int32(mid).view(F32)), e0)):
            hi = mid
        else:
            lo = mid
    return float(np.int32(hi).view(F32))


@functools.lru_cache(maxsize=8)
def thresholds(kind: str, dtype: torch.dtype = torch.float32) -> tuple[float, ...]:
    """One mantissa threshold per frexp exponent E0_MIN..E0_MAX: the smallest m in [0.5, 1) whose
    ``m * 2**e0`` gives ``e0`` rather than ``e0 - 1`` (``kind``: "half_up" or "ceil"). About 0.1 s, once."""

    def half_up(e0: int, v: float) -> bool:  # floor(fl32(log2 v) + 0.5) == e0 (else e0 - 1)
        return float(F32(_cr_log2(v)) + F32(0.5)) >= e0

    def ceil(e0: int, v: float) -> bool:  # ceil(fl(log2 v)) == e0 (else e0 - 1)
        return _to_dtype(_cr_log2(v), dtype) > e0 - 1

    rule = half_up if kind == "half_up" else ceil
    return tuple(_threshold(e0, functools.partial(rule, e0)) for e0 in range(E0_MIN, E0_MAX + 1))


@functools.lru_cache(maxsize=16)
def _table(kind: str, dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.tensor(thresholds(kind, dtype), dtype=torch.float32, device=device)


def _by_threshold(v: torch.Tensor, kind: str, dtype: torch.dtype, below: torch.Tensor) -> torch.Tensor:
    """``e0 - 1`` or ``e0`` by comparing v's mantissa with its exponent's threshold (finite v > 0 only)."""
    m, e0 = torch.frexp(v.float())
    table = _table(kind, dtype, str(v.device))
    index = (e0.to(torch.int64) - E0_MIN).clamp_(0, E0_MAX - E0_MIN)
    exact = (e0 - (m < table[index]).to(e0.dtype)).to(torch.float32)
    return torch.where(torch.isfinite(v) & (v > 0), exact, below)


def log2_round_half_up(v: torch.Tensor) -> torch.Tensor:
    """``floor(log2(v) + 0.5)`` as float32 arithmetic with a correctly rounded ``log2`` gives it (float32 out).

    0 gives -inf, +inf gives +inf, NaN and negatives NaN (the exact IEEE results, the same everywhere)."""
    v = v.float()
    return _by_threshold(v, "half_up", torch.float32, torch.floor(torch.log2(v) + 0.5))


def log2_ceil(v: torch.Tensor) -> torch.Tensor:
    """``ceil(log2(v))`` with ``log2`` correctly rounded to float32 and then, for a 16-bit ``v``, rounded
    to v's dtype (as torch computes a 16-bit ``log2``: in float32, then one rounding); float32 out.
    0, inf, NaN and negatives as :func:`log2_round_half_up`."""
    dtype = v.dtype if v.dtype in (torch.bfloat16, torch.float16) else torch.float32
    return _by_threshold(v, "ceil", dtype, torch.ceil(torch.log2(v.float())))
