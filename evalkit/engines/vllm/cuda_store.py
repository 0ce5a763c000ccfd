"""vLLM's own CUDA KV-cache write, called directly: the per-tensor FP8 store FlashAttention's backend runs.

vLLM on CUDA writes K and V into its paged cache with ``torch.ops._C_cache_ops.reshape_and_cache_flash``
(``vllm._custom_ops.reshape_and_cache_flash``, what ``FlashAttentionImpl.do_kv_cache_update`` calls in
``vllm/v1/attention/backends/flash_attn.py``). Its cache is one tensor per layer, (blocks, kv_heads,
block_size, 2 x head_dim) bytes for an FP8 cache (``FlashAttentionBackend``'s shape in 0.32 and 0.33), of
which the backend passes two strided views, ``kv_cache.transpose(1, 2).split(head_dim, dim=-1)``:
K and V as (blocks, block_size, kv_heads, head_dim). :func:`write_cache` builds that cache on the GPU,
writes K and V through the op at the slots given (scattered by default, as the scheduler's blocks
are) with per-tensor ``k_scale``/``v_scale`` tensors (the layer's ``_k_scale``/``_v_scale``), and
reads the codes back by slot: (tokens, kv_heads, head_dim) float8 on the CPU, in the order of
:func:`evalkit.engines.vllm.kernel.write_cache`, the CPU store's reader, so that the kernel table
(:func:`evalkit.engines.vllm.kernel_conformance.kernel_conformance`) holds either store against evalkit's quantizer.

vLLM is imported only here, on a machine with its CUDA build (:func:`require_store`); without one,
:class:`~evalkit.errors.EngineUnavailableError` says so in one line.
"""

from __future__ import annotations

import torch

from evalkit.errors import EngineUnavailableError, EvalkitError

STORE = "torch.ops._C_cache_ops.reshape_and_cache_flash"
BLOCK_SIZE = 16  # vLLM's default block size on CUDA
KV_CACHE_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def require_store(device: str = "cuda") -> None:
    """vLLM's CUDA build checked (:func:`evalkit.engines.vllm.versions.check_build`, a visible GPU) and its
    cache-write op registered (importing ``vllm._custom_ops`` registers it), or EngineUnavailableError in one line."""
    from evalkit.engines.vllm.gpu import check_cuda
    from evalkit.engines.vllm.install import set_in_process
    from evalkit.engines.vllm.versions import check_build

    check_build("cuda")
    check_cuda()
    set_in_process()
    try:
        from vllm import _custom_ops
    except ImportError as exc:
        raise EngineUnavailableError(f"vLLM is installed but its CUDA ops cannot be imported ({exc})") from None
    if not hasattr(_custom_ops, "reshape_and_cache_flash") or not hasattr(
        torch.ops._C_cache_ops, "reshape_and_cache_flash"
    ):
        raise EngineUnavailableError(f"this vLLM registers no {STORE}: install vLLM's CUDA build (docs/install.md)")


def device_record(device: str = "cuda") -> str:
    """The GPU the store ran on, for the report (``sm_90 NVIDIA H200``)."""
    dev = torch.device(device)
    major, minor = torch.cuda.get_device_capability(dev)
    return f"sm_{major}{minor} {torch.cuda.get_device_name(dev)}"


def write_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_scale: float,
    v_scale: float,
    kv_cache_dtype: str = "fp8_e4m3",
    block_size: int = BLOCK_SIZE,
    device: str = "cuda",
    slots: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write ``key`` and ``value`` (tokens, kv_heads, head_dim), float, through vLLM's CUDA cache write into a
    fresh cache laid out as FlashAttention's backend lays it out, and return the stored codes by slot as float8
    tensors on the CPU, (tokens, kv_heads, head_dim). ``slots``: the slot of each token (default: a seeded
    permutation of the cache's slots)."""
    if key.dim() != 3 or key.shape != value.shape:
        raise EvalkitError(
            f"key and value must both be (tokens, kv_heads, head_dim), got {tuple(key.shape)} and {tuple(value.shape)}"
        )
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise EvalkitError(f"kv_cache_dtype {kv_cache_dtype!r}: this store holds {', '.join(KV_CACHE_DTYPES)}")
    require_store(device)
    from vllm import _custom_ops

    tokens, heads, head_dim = key.shape
    blocks = -(-tokens // block_size) + 1  # one spare block, so that the scattered slots leave gaps
    if slots is None:
        slots = torch.randperm(blocks * block_size, generator=torch.Generator().manual_seed(1))[:tokens]
    kv_cache = torch.zeros(blocks, heads, block_size, 2 * head_dim, dtype=torch.uint8, device=device)
    key_cache, value_cache = kv_cache.transpose(1, 2).split(head_dim, dim=-1)
    _custom_ops.reshape_and_cache_flash(
        key.to(device).contiguous(),
        value.to(device).contiguous(),
        key_cache,
        value_cache,
        slots.to(device=device, dtype=torch.long),
        kv_cache_dtype,
        torch.tensor(float(k_scale), dtype=torch.float32, device=device),
        torch.tensor(float(v_scale), dtype=torch.float32, device=device),
    )
    torch.cuda.synchronize(device)
    dtype8 = KV_CACHE_DTYPES[kv_cache_dtype]
    flat = slots.to(device=device, dtype=torch.long)
    k = key_cache.reshape(blocks * block_size, heads, head_dim)[flat]
    v = value_cache.reshape(blocks * block_size, heads, head_dim)[flat]
    return k.cpu().contiguous().view(dtype8), v.cpu().contiguous().view(dtype8)
