"""vLLM on CUDA: what evalkit starts it with, what it checks first, and what it records of the attention path.

Memory. vLLM's GPU worker refuses to start unless the free memory of its GPU is at least
``gpu_memory_utilization`` x total (``request_memory`` in ``vllm/v1/worker/utils.py``; the default is
0.92, ``vllm/entrypoints/llm.py``), and it sizes the KV cache from that share after profiling, unless
``kv_cache_memory_bytes`` fixes it (``Worker.determine_available_memory``, ``vllm/v1/worker/gpu_worker.py``).
:func:`start_memory` starts it as served:

- with the engine option ``gpu_memory_utilization``: that, unchanged; vLLM sizes the cache from it;
- with ``kv_cache_memory_bytes`` (an engine option, or a caller's fixed budget such as the serving
  evaluation's): that cache, and a ``gpu_memory_utilization`` that passes vLLM's start-up check;
- with neither: vLLM's own default share (0.92), or the free share at start-up when less
  (:func:`startup_utilization`: another process may hold part of the GPU; an engine run of evalkit holds
  no copy of the weights), and vLLM sizes
  the cache from it, as ``vllm serve`` does.

Before vLLM starts, :func:`check_kv_fit` sizes the cache that share leaves with evalkit's capacity
arithmetic (:mod:`evalkit.planning.engine_fit`: the GPU's memory, the rank's weights and reserve) and
refuses, in one line, a run whose longest request (its ``max_model_len``) it cannot hold, naming the
share that would (the dry run's check, :mod:`evalkit.sweep.preflight.kv_fit`, is the same arithmetic on a
named GPU). Both figures go into each row's info (``engine_kv_cache_bytes``,
``engine_gpu_memory_utilization``).

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
    """The memory arguments of ``vllm.LLM`` on ``device`` (see the module docstring); ``kv_cache_bytes``: a
    caller's fixed budget, which the ``kv_cache_memory_bytes`` engine option replaces."""
    fixed = engine_args.get("kv_cache_memory_bytes") or kv_cache_bytes
    if device == "cpu":
        return {"kv_cache_memory_bytes": int(fixed or cpu_default)}
    share = engine_args.get("gpu_memory_utilization")
    if fixed:
        return {"kv_cache_memory_bytes": int(fixed), "gpu_memory_utilization": share or startup_utilization()}
    if share is not None:
        return {}
    return {"gpu_memory_utilization": startup_utilization()}


def cache_scheme(kv_cache_dtype: str):
    """The evalkit scheme whose bytes per token are those of vLLM's ``kv_cache_dtype``."""
    from evalkit.kv.scheme import Scheme, parse_scheme

    if kv_cache_dtype in ("auto", "bfloat16", "float16"):
        return Scheme()
    if kv_cache_dtype in ("fp8_e4m3", "fp8_e5m2"):
        return parse_scheme(f"{kv_cache_dtype}/tensor/unit")
    return parse_scheme(f"vllm:{'fp8_e4m3' if kv_cache_dtype == 'fp8' else kv_cache_dtype}")


def check_kv_fit(model_dir, kv_cache_dtype: str, max_model_len: int, memory: dict, engine_args: dict, dtype: str):
    """EvalkitError (one line) when the KV cache vLLM would size from ``memory`` (:func:`start_memory`'s
    arguments) on this GPU cannot hold one request of ``max_model_len`` tokens; the cache's figures
    otherwise (:class:`evalkit.planning.engine_fit.EngineCache`), or None where the config cannot say."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    import torch

    from evalkit.planning.engine_fit import engine_cache, fit_problem, needed_utilization
    from evalkit.planning.parallel import Parallel

    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    _, total = torch.cuda.mem_get_info()
    name = torch.cuda.get_device_name()
    gpu = SimpleNamespace(memory=total, name=name, key=name, sm100_family=torch.cuda.get_device_capability()[0] == 10)
    par = Parallel(
        tp=int(engine_args.get("tensor_parallel_size") or 1), pp=int(engine_args.get("pipeline_parallel_size") or 1)
    )
    scheme = cache_scheme(kv_cache_dtype)
    size = {"dtype_bytes": float(getattr(torch, dtype).itemsize)}
    share = memory.get("gpu_memory_utilization", engine_args.get("gpu_memory_utilization"))
    try:
        cache = engine_cache(
            config, scheme, parallel=par, gpu=gpu, utilization=share, kv_cache_bytes=memory.get("kv_cache_memory_bytes"),
            **size,
        )  # fmt: skip
    except EvalkitError as exc:
        raise EvalkitError(f"vLLM cannot start on {name}: {exc}") from None
    need = needed_utilization(config, scheme, max_model_len, parallel=par, gpu=gpu, **size)
    fix = (
        f"set --engine-option gpu_memory_utilization={need:g} (free the GPU for it), or lower the evaluation's lengths"
        if need is not None
        else "raise tensor_parallel_size or lower the evaluation's lengths"
    )
    line = fit_problem(max_model_len, f"max_model_len of kv_cache_dtype {kv_cache_dtype}", cache, fix)
    if line is not None:
        raise EvalkitError(line)
    return cache


def attention_record(layers: list) -> dict:
    """The attention path vLLM runs, from the per-layer rows of ``_attention_layers`` (name, k_scale, v_scale,
    kv_cache_dtype, backend, FlashAttention version or None, whether Q is quantized to FP8)."""
    versions = sorted({r[5] for r in layers if len(r) > 5 and r[5] is not None})
    return {
        "attention_backend": ",".join(sorted({r[4] for r in layers})),
        "attention_fa_version": versions or None,
        "attention_query_fp8": sorted({bool(r[6]) for r in layers if len(r) > 6}) == [True],
    }
