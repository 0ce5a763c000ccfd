"""vLLM's scale-out and sizing options, as the engine declaration (:mod:`evalkit.engines.vllm.engine`) gives them.

They reach ``vllm.LLM`` unchanged and enter a run id when set. The API check
(:mod:`evalkit.engines.vllm.api_uses`) holds their names against ``vllm.LLM``'s keywords: that is why they
stand apart from the declaration, whose plan checks the installed build with that same API check.
"""

from __future__ import annotations

from evalkit.engines.registry import Option

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
        "CUDA: the share of each GPU vLLM may use, and then sizes its KV cache from (default: a fixed 4 GiB "
        "KV cache, and the free share at start-up for vLLM's check)",
    ),
)
