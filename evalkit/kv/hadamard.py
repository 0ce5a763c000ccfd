"""Walsh-Hadamard rotations as vLLM's rotated KV caches apply them, in O(d log d).

Three of vLLM 0.32's KV cache dtypes rotate K (and, for INT4, V) by a Sylvester Hadamard matrix
before quantizing, so that one outlier channel is spread over all of them. Each computes it its own
way, and the float32 rounding of the rotated values is part of what decides a code, so each way is
modelled as the engine computes it (never as a dense ``d x d`` matmul, where the engine does not):

- :func:`fwht`: the unnormalised transform ``H x`` (``H H^T = d I``) by the butterfly of
  ``vllm/v1/attention/ops/int4_per_token_head.py`` ``fast_hadamard_transform`` (its PyTorch tier, the
  one that runs off CUDA): stages ``h = 1, 2, 4, ...``, each pair ``(a, b)`` at distance ``h``
  becoming ``(a + b, a - b)`` in float32.
- :func:`single_rht` / :func:`single_rht_inverse`: the INT4 per-token-head rotation ``H D x`` (``D``
  the diagonal of :func:`rht_signs`), block-diagonal over blocks of ``b`` = the largest power of two
  dividing ``d`` when ``d`` is not one (``single_rht`` in the same file); the norm grows by ``sqrt(b)``
  and the inverse is ``D H y / b``.
- :func:`fwht_orthonormal_stagewise`: UltraQuant's in-register butterfly
  (``vllm/v1/attention/ops/ultraquant/triton_store.py`` ``_ultraquant_store_kernel``): each stage
  ``(a + b) * c`` and ``(a - b) * c`` with ``c = float32(1 / sqrt(2))``, so the result is orthonormal
  and rounded at every stage.
- :func:`fwht_orthonormal`: ``x H / sqrt(d)`` for TurboQuant, which multiplies by the normalised
  Sylvester matrix (``turboquant_attn.py`` ``_build_hadamard``; no sign vector: "random sign flips
  do not improve Lloyd-Max quantization quality"). The engine uses a float32 GEMM; the butterfly
  here equals it up to float32 summation order (the kernel conformance counts where that moves a
  codebook index).

Every stage is elementwise: each output is one float32 ``a + b`` or ``a - b`` (``b * (+-1)`` is exact,
so a fused multiply-add rounds the same), in a fixed order. So every rotation here gives the same
bits on every device, batch size and layout, where a GEMM or ``torch.sum`` would not (issue 39). On
CUDA sm80+ vLLM's INT4 rotation runs in Hadacore instead (bf16 tensor cores), a tier no CPU takes:
evalkit models vLLM's float32 butterfly tier on every device.

The sign vector is vLLM's ``_get_rht_signs(d, round_idx)``: a CPU ``torch.Generator`` seeded with
``0x9E3779B9 + round_idx * 0x517CC1B7`` draws ``bernoulli(0.5)`` for each of ``d`` entries, mapped to
``2 b - 1``; INT4 uses round 0. Drawn the same way here, so the signs are vLLM's bit for bit.
"""

from __future__ import annotations

import functools
import math

import torch

from evalkit.errors import SchemeError

RHT_SEED = 0x9E3779B9
RHT_ROUND_STEP = 0x517CC1B7
INV_SQRT2 = 0.7071067811865476  # UltraQuant's constexpr, a float32 in the kernel


def is_power_of_two(d: int) -> bool:
    return d > 0 and d & (d - 1) == 0


def largest_power_of_two_divisor(d: int) -> int:
    return d & -d


def _signs(d: int, round_idx: int) -> torch.Tensor:
    gen = torch.Generator(device="cpu")
    gen.manual_seed(RHT_SEED + round_idx * RHT_ROUND_STEP)
    return 2.0 * torch.bernoulli(torch.full((d,), 0.5), generator=gen) - 1.0


_SIGNS: dict[tuple[int, int, str], torch.Tensor] = {}  # made once per (width, round, device)


def rht_signs(d: int, round_idx: int = 0, device: torch.device | str = "cpu") -> torch.Tensor:
    """vLLM's deterministic +-1 sign vector of length ``d`` (float32) for RHT round ``round_idx``.

    Kept in a plain dict rather than an ``lru_cache``: a compiled decode step (``torch.compile``,
    which traces through ``lru_cache`` wrappers) then finds the vector the eager prefill made, instead
    of tracing the generator that made it."""
    key = (d, round_idx, str(torch.device(device)))
    signs = _SIGNS.get(key)
    if signs is None:
        signs = _SIGNS.setdefault(key, _signs(d, round_idx).to(device))
    return signs


def _check_power_of_two(d: int, what: str) -> None:
    if not is_power_of_two(d):
        raise SchemeError(f"{what} needs a power-of-two width, not {d}")


@functools.lru_cache(maxsize=16)
def _pair_signs(device: str) -> torch.Tensor:
    """``[[1], [-1]]`` (float32): a pair ``(a, b)`` becomes ``a + b * [[1], [-1]] = (a + b, a - b)``."""
    return torch.tensor([[1.0], [-1.0]], dtype=torch.float32, device=device)


def _stages(x: torch.Tensor, what: str, c: torch.Tensor | None = None) -> torch.Tensor:
    """The butterfly's ``log2 d`` stages on float32 ``x``, each ``(a + b, a - b)`` (then ``* c`` if given).

    A stage is one ``addcmul``, ``a + b * (+-1)`` broadcast over the pairs at distance ``h``: ``b * (+-1)``
    is exact, so each output is the float32 ``a + b`` or ``a - b`` rounded once, signed zeros
    included, fused or not (three torch calls a stage where a stack of the two sums takes six)."""
    d = x.shape[-1]
    _check_power_of_two(d, what)
    lead = x.shape[:-1]
    signs = _pair_signs(str(x.device))
    h = 1
    while h < d:
        a, b = x.reshape(*lead, d // (2 * h), 2, h).split(1, dim=-2)
        x = torch.addcmul(a, b, signs)
        if c is not None:
            x = x * c
        h *= 2
    return x.reshape(*lead, d)


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised Walsh-Hadamard transform along the last dim (a power of two), float32 butterfly."""
    return _stages(x, "the Walsh-Hadamard transform")


def fwht_orthonormal_stagewise(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal transform scaled by float32 1/sqrt(2) at each stage, as UltraQuant's store kernel does."""
    return _stages(x, "UltraQuant's Hadamard rotation", _inv_sqrt2(str(x.device)))


@functools.lru_cache(maxsize=8)
def _inv_sqrt2(device: str) -> torch.Tensor:
    return torch.tensor(INV_SQRT2, dtype=torch.float32, device=device)


def fwht_orthonormal(x: torch.Tensor) -> torch.Tensor:
    """``x @ (H / sqrt(d))`` with the float32 normalised matrix's entries: the butterfly, then times
    ``float32(1 / sqrt(d))`` (exact where ``d`` is a power of four)."""
    return fwht(x) * _inv_sqrt(x.shape[-1])


@functools.lru_cache(maxsize=64)
def _inv_sqrt(d: int) -> float:
    """float32(1 / float32(sqrt(d))), as a Python float (exact in float32, so the product rounds once)."""
    return float(torch.tensor(1.0, dtype=torch.float32) / torch.tensor(math.sqrt(d), dtype=torch.float32))


def _blocked(x: torch.Tensor, fn) -> torch.Tensor:
    d = x.shape[-1]
    b = largest_power_of_two_divisor(d)
    if b == d:
        return fn(x)
    return fn(x.reshape(*x.shape[:-1], d // b, b)).reshape(x.shape)


def single_rht(x: torch.Tensor) -> torch.Tensor:
    """vLLM INT4's forward rotation ``H (D x)`` in float32, block-diagonal for a non-power-of-two width."""
    return _blocked(x.float(), lambda t: fwht(t * rht_signs(t.shape[-1], 0, t.device)))


def single_rht_inverse(y: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`single_rht`: ``D (H y) / b`` (``b`` the block width), as a multiply by the
    exact power of two ``1 / b`` (the same bits as the division, on every device)."""
    b = largest_power_of_two_divisor(y.shape[-1])
    return _blocked(y.float(), lambda t: fwht(t) * rht_signs(t.shape[-1], 0, t.device)) * (1.0 / b)
