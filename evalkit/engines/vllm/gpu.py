"""vLLM on CUDA: what evalkit starts it with, what it checks first, and what it records of the attention path.

Memory. vLLM's GPU worker refuses to start unless the free memory of its GPU is at least
``gpu_memory_utilization`` x total (``request_memory`` in ``vllm/v1/worker/utils.py``; the default is
0.92, ``vllm/entrypoints/llm.py``), and it sizes the KV cache from that share after profiling, unless
``kv_cache_memory_bytes`` fixes it (``Worker.determine_available_memory``, ``vllm/v1/worker/gpu_worker.py``).
evalkit's run holds its own copy of the model on the same GPU (its tokenizer, config and weights
fingerprint come from it), so :func:`start_memory` does this:

- with the engine option ``gpu_memory_utilization``: that, unchanged; vLLM sizes the cache from it;
- without: a fixed KV cache of :data:`KV_CACHE_BYTES_CUDA` per GPU (``kv_cache_memory_bytes``), so that
  how many sequences run at once, and so the batches the numbers come from, never depend on what
  else holds memory; and a ``gpu_memory_utilization`` just under the free share at start-up
  (:func:`startup_utilization`, at most vLLM's 0.92), which then only passes vLLM's start-up check.

Both figures go into each row's info (``engine_kv_cache_bytes``, ``engine_gpu_memory_utilization``).

The attention path. vLLM selects a backend per attention layer at start-up
(``vllm/v1/attention/selector.py`` ``get_attn_backend``, by the priorities of
``vllm/platforms/cuda.py`` ``_get_backend_priorities``: FLASH_ATTN first below Blackwell, FLASHINFER
first on SM100) and keeps it on the layer (``Attention.attn_backend``,
``vllm/model_executor/layers/attention/attention.py``). FlashAttention picks its version per GPU
(``vllm/v1/attention/backends/fa_utils.py`` ``get_flash_attn_version``: FA3 on Hopper, FA4 on SM100
where supported), held as ``FlashAttentionImpl.vllm_flash_attn_version``; a layer whose backend takes
FP8 queries with an FP8 cache quantizes Q (``Attention.query_quant``). :func:`attention_record` turns the
per-layer readings (:func:`evalkit.engines.vllm.runner._attention_layers`) into the row's fields.
"""

from __future__ import annotations

import math

from evalkit.errors import EngineUnavailableError, EvalkitError

KV_CACHE_BYTES_CUDA = 4 << 30  # per GPU
VLLM_DEFAULT_UTILIZATION = 0.92  # vllm.LLM's default gpu_memory_utilization (0.32 and 0.33)
HEADROOM = 0.02  # of the GPU left free under the start-up share
MEMORY_ARGUMENTS = ("kv_cache_memory_bytes", "gpu_memory_utilization")  # the vllm.LLM keywords start_memory sets


def check_cuda() -> None:
    """EngineUnavailableError (one line) unless torch sees a CUDA GPU here."""
    import torch

    if torch.version.cuda is None:
        raise EngineUnavailableError(
            f"this environment's vLLM runs on CUDA, but torch {torch.__version__} has no CUDA: install vLLM's CUDA "
            "torch (docs/install.md, 'On a GPU')"
        )
    if not torch.cuda.is_available():
        raise EngineUnavailableError(
            "this environment's vLLM runs on CUDA, but no CUDA GPU is visible (check nvidia-smi and "
            "CUDA_VISIBLE_DEVICES)"
        )


def startup_utilization(device_index: int | None = None) -> float:
    """A ``gpu_memory_utilization`` that vLLM's start-up check passes now: the free share of the GPU less
    :data:`HEADROOM`, rounded down to 0.01, at most :data:`VLLM_DEFAULT_UTILIZATION`."""
    import torch

    free, total = torch.cuda.mem_get_info(device_index)
    share = math.floor((free / total - HEADROOM) * 100) / 100
    if share < 0.05:
        raise EvalkitError(
            f"only {free / 2**30:.1f} of {total / 2**30:.1f} GiB are free on the GPU: vLLM cannot start beside "
            "what holds it (free the GPU, or run a smaller model)"
        )
    return min(VLLM_DEFAULT_UTILIZATION, share)


def start_memory(device: str, kv_cache_bytes: int | None, engine_args: dict, cpu_default: int) -> dict:
    """The memory arguments of ``vllm.LLM`` on ``device`` (see the module docstring)."""
    if device == "cpu":
        return {"kv_cache_memory_bytes": int(kv_cache_bytes or cpu_default)}
    if engine_args.get("gpu_memory_utilization") is not None:
        return {"kv_cache_memory_bytes": int(kv_cache_bytes)} if kv_cache_bytes else {}
    return {
        "kv_cache_memory_bytes": int(kv_cache_bytes or KV_CACHE_BYTES_CUDA),
        "gpu_memory_utilization": startup_utilization(),
    }


def attention_record(layers: list) -> dict:
    """The attention path vLLM runs, from the per-layer rows of ``_attention_layers`` (name, k_scale, v_scale,
    kv_cache_dtype, backend, FlashAttention version or None, whether Q is quantized to FP8)."""
    versions = sorted({r[5] for r in layers if len(r) > 5 and r[5] is not None})
    return {
        "attention_backend": ",".join(sorted({r[4] for r in layers})),
        "attention_fa_version": versions or None,
        "attention_query_fp8": sorted({bool(r[6]) for r in layers if len(r) > 6}) == [True],
    }
