"""Serving capacity measured from vLLM itself: the KV tokens its allocator fits, how many requests it
admits at once, and its prefill and decode speed, per ``kv_cache_dtype``, next to evalkit's count.

For each ``kv_cache_dtype`` one in-process engine (:class:`~evalkit.engines.vllm.runner.VllmRunner`)
is started on the model with the same KV budget (``kv_cache_memory_bytes``: on the CPU what
``VLLM_CPU_KVCACHE_SPACE`` sets, on CUDA the alternative to ``gpu_memory_utilization``) and
``max_model_len`` = the context. Read from the engine's own objects, not its log:

- capacity (:class:`~evalkit.engines.vllm.serving_results.Allocation`): the scheduler's
  ``KVCacheConfig`` (blocks, the backing tensors' bytes, each group's block size and layers) and the
  cache config's ``kv_cache_max_concurrency`` (vLLM's ``get_max_concurrency_for_kv_cache_config``:
  blocks over the blocks one request of ``max_model_len`` tokens takes). ``kv_tokens`` = blocks x
  block size; the engine's bytes per token = allocated bytes / kv_tokens; ``usable_kv_tokens`` is
  what the block pool has free on an idle engine (vLLM keeps one block as its null block).
- admission under load (:func:`run_load`): ``ceil(max concurrency) + 2`` requests of ``context``
  tokens each (prompt ``context - decode_tokens``, then ``decode_tokens`` generated, EOS ignored),
  added at once and stepped one engine step at a time; after every step the scheduler's
  ``get_request_counts()`` (running, waiting) and the requests' ``num_preemptions`` are read.
  ``admitted_requests`` is the most requests running in a step that left some waiting: what ran at
  once before the engine queued. The scheduler's per-step token budget and sequence limit are set
  above what the budget can hold, so the KV cache is the limit.
- speed (:func:`~evalkit.engines.vllm.serving_results.speeds`): from the same steps. Each request's
  ``num_computed_tokens`` before and after a step splits the tokens it computed into prompt
  (prefill) and generated (decode) tokens; prefill tok/s is prompt tokens over the wall time of the
  steps that computed any, decode tok/s is generated tokens over the steps that computed only those
  (at the admitted concurrency: steps running exactly that many). Batch 1 is one request alone on
  the same engine, after a warm-up.

Next to each: evalkit's bytes per token for the scheme the engine profile maps the dtype to
(``auto`` is the unquantized BF16 count; ``fp8_e4m3`` is ``fp8_e4m3/tensor/unit+rounding=rtz`` on
vllm-cpu), the tokens that count fits in the budget and the ratio of the two
(:func:`~evalkit.engines.vllm.serving_results.compare`). A ratio more than 1 % from 1 is flagged
with the term that explains it, each worked out from the engine's numbers: the per-token storage
(the engine's page holds other bytes per token than evalkit counts, e.g. a float32 unquantized cache
where evalkit counts BF16) and block rounding (the allocator hands out whole blocks). The capacity
ratio of a dtype against ``auto`` is given both ways (``capacity_vs_auto`` from the allocator,
``computed_capacity_vs_auto`` from evalkit's count).

:func:`~evalkit.engines.vllm.serving_results.serving_rows` turns the measurements into
:class:`~evalkit.evals.base.MetricRow` rows for a results store;
``python -m evalkit capacity --engine vllm`` prints them (:mod:`evalkit.cli.capacity`).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from evalkit.engines.vllm.serving_results import (
    DEFAULT_DTYPE,
    Allocation,
    LoadRun,
    Measurement,
    Step,
    compare,
    split_tokens,
)
from evalkit.errors import EvalkitError

DEFAULT_KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2")
START_FLAGS = {"context": "--context", "budget": "--budget-gib"}  # what sets max_model_len and the KV budget
DEFAULT_CONTEXT = 2048
DEFAULT_DECODE_TOKENS = 16
EXTRA_REQUESTS = 2  # submitted beyond the engine's max concurrency, so a queue forms
WARMUP_TOKENS = 16


# -- what the engine allocated --------------------------------------------------------------------------
def read_allocation(runner, budget_bytes: int, context: int) -> Allocation:
    """The :class:`Allocation` of a started :class:`~evalkit.engines.vllm.runner.VllmRunner`."""
    engine = runner.llm.llm_engine
    scheduler = _scheduler(runner)
    kcc = scheduler.kv_cache_config
    sizes = {g.kv_cache_spec.block_size for g in kcc.kv_cache_groups}
    if len(sizes) != 1:
        raise EvalkitError(
            f"the engine's KV cache has groups of different block sizes {sorted(sizes)}: "
            "this measurement reads one uniform full-attention cache"
        )
    cache = engine.vllm_config.cache_config
    return Allocation(
        kv_cache_dtype=runner.kv_cache_dtype,
        budget_bytes=int(budget_bytes),
        context=int(context),
        num_blocks=int(kcc.num_blocks),
        block_size=sizes.pop(),
        allocated_bytes=int(sum(t.size for t in kcc.kv_cache_tensors)),
        max_concurrency=float(cache.kv_cache_max_concurrency),
        usable_blocks=int(scheduler.kv_cache_manager.block_pool.get_num_free_blocks()),
        layers=sum(len(g.layer_names) for g in kcc.kv_cache_groups),
    )


def _scheduler(runner):
    core = runner.llm.llm_engine.engine_core
    inner = getattr(core, "engine_core", None)  # the in-process client holds the EngineCore
    if inner is None:
        raise EvalkitError(
            "vLLM runs its engine core in another process: set VLLM_ENABLE_V1_MULTIPROCESSING=0 "
            "so evalkit can read the scheduler"
        )
    return inner.scheduler


def check_budget(gib) -> int:
    """A KV budget in GiB as bytes (EvalkitError unless positive)."""
    try:
        gib = float(gib)
    except (TypeError, ValueError):
        raise EvalkitError(f"--budget-gib must be a number of GiB, got {gib!r}") from None
    if not gib > 0 or not math.isfinite(gib):
        raise EvalkitError(f"--budget-gib must be a positive number of GiB, got {gib}")
    return int(gib * 2**30)


def too_small(message: str, budget_bytes: int, context: int, kv_cache_dtype: str, one_request_bytes: int) -> str | None:
    """One line for vLLM's refusal of a budget that holds no request of ``context`` tokens (it says
    so, or that not one block fits); None for another error. ``one_request_bytes`` is evalkit's count."""
    import re

    m = re.search(r"\(([0-9.]+) GiB KV cache is needed", message)
    if m is not None and "at least one request" in message:
        need = f"vLLM needs {m.group(1)} GiB for one"
    elif "No available memory for the cache blocks" in message:
        need = "not one cache block fits"
    else:
        return None
    return (
        f"a KV budget of {budget_bytes / 2**30:.4g} GiB holds no request of {context:,} tokens with kv_cache_dtype "
        f"{kv_cache_dtype} ({need}; evalkit counts {one_request_bytes / 2**20:,.1f} MiB): "
        "raise --budget-gib or lower --context"
    )


# -- evalkit's count next to it ---------------------------------------------------------------------------
def computed_scheme(kv_cache_dtype: str, profile: str):
    """The evalkit scheme the engine profile says this kv_cache_dtype stores (``auto``: unquantized, BF16)."""
    from evalkit.engines.registry import get_profile

    return get_profile(profile).scheme_for(kv_cache_dtype)


def check_kv_cache_dtypes(names, profile: str) -> tuple[str, ...]:
    """The names, each one the profile's engine takes, or EvalkitError naming the ones it does
    (``None``: those of :data:`DEFAULT_KV_CACHE_DTYPES` the profile lists)."""
    from evalkit.engines.registry import get_profile

    known = [d.name for d in get_profile(profile).kv_cache_dtypes]
    if names is None:
        return tuple(n for n in DEFAULT_KV_CACHE_DTYPES if n in known)
    names = tuple(dict.fromkeys(n.strip() for n in names if n.strip()))
    if not names:
        raise EvalkitError(f"no kv_cache_dtype given: use some of {', '.join(known)}")
    bad = [n for n in names if n not in known]
    if bad:
        raise EvalkitError(f"{profile} has no kv_cache_dtype {bad[0]!r}: use {', '.join(known)}")
    return names


# -- admission and speed -----------------------------------------------------------------------------------
def run_load(runner, n_requests: int, prompt_tokens: int, decode_tokens: int, seed: int = 0) -> LoadRun:
    """Add ``n_requests`` requests at once and step the engine until all finish, reading the scheduler
    after every step (see the module docstring)."""
    from vllm import SamplingParams

    engine = runner.llm.llm_engine
    scheduler = _scheduler(runner)
    params = SamplingParams(
        max_tokens=decode_tokens, min_tokens=decode_tokens, ignore_eos=True, temperature=0.0, detokenize=False
    )
    vocab = runner.llm.llm_engine.model_config.get_vocab_size()
    run = LoadRun(n_requests, prompt_tokens, decode_tokens)
    tag = f"evalkit-load-{time.monotonic_ns()}"
    for i in range(n_requests):
        ids = [(seed + 7919 * i + 104729 * j) % (vocab - 10) + 10 for j in range(prompt_tokens)]  # distinct prompts
        engine.add_request(f"{tag}-{i}", {"prompt_token_ids": ids}, params)
    held = {rid: r for rid, r in scheduler.requests.items() if rid.startswith(tag)}
    if len(held) != n_requests:
        raise EvalkitError(
            f"vLLM's scheduler holds {len(held)} of the {n_requests} requests added: cannot follow their admission"
        )
    while engine.has_unfinished_requests():
        before = {rid: r.num_computed_tokens for rid, r in held.items()}
        start = time.perf_counter()
        engine.step()
        seconds = time.perf_counter() - start
        pre = dec = active = 0
        for rid, r in held.items():
            p, d = split_tokens(before[rid], r.num_computed_tokens, prompt_tokens)
            pre, dec, active = pre + p, dec + d, active + bool(p or d)
        running, waiting = scheduler.get_request_counts()
        run.steps.append(
            Step(seconds, running, waiting, pre, dec, sum(r.num_preemptions for r in held.values()), active)
        )
    return run


# -- one dtype, measured ---------------------------------------------------------------------------------
def measure(
    model_dir: str | Path,
    layout,
    kv_cache_dtypes=None,
    budget_bytes: int = 2 << 30,
    context: int = DEFAULT_CONTEXT,
    dtype: str = DEFAULT_DTYPE,
    load: bool = False,
    decode_tokens: int = DEFAULT_DECODE_TOKENS,
    profile: str | None = None,
    progress=None,
) -> list[Measurement]:
    """Start one engine per kv_cache_dtype on ``model_dir`` with ``budget_bytes`` of KV cache and
    ``max_model_len = context``; read its allocation, and with ``load`` run batch 1 and the load run."""
    from evalkit.engines.vllm.runner import VllmRunner
    from evalkit.engines.vllm.startup import import_vllm
    from evalkit.kv.memory import bytes_per_token

    import_vllm()
    profile = profile or engine_profile()
    kv_cache_dtypes = check_kv_cache_dtypes(kv_cache_dtypes, profile)
    if load and not 1 <= decode_tokens < context:
        raise EvalkitError(
            f"--decode-tokens must be between 1 and the context - 1 ({context - 1}), got {decode_tokens}"
        )
    counted = {kvd: bytes_per_token(layout, computed_scheme(kvd, profile)) for kvd in kv_cache_dtypes}
    for (
        kvd,
        bpt,
    ) in counted.items():  # evalkit's count first: no engine starts for a budget that cannot hold one request
        if budget_bytes < bpt * context:
            raise EvalkitError(
                f"a KV budget of {budget_bytes / 2**30:.4g} GiB holds no request of {context:,} tokens with "
                f"kv_cache_dtype {kvd} (one takes {float(bpt * context) / 2**20:,.1f} MiB by evalkit's count): "
                "raise --budget-gib or lower --context"
            )
    out = []
    for kvd in kv_cache_dtypes:
        scheme = computed_scheme(kvd, profile)
        computed_bpt = counted[kvd]
        engine_args = {"async_scheduling": False}
        if load:  # the scheduler's limits sit above what the budget can hold, so the KV cache limits admission
            seqs = max(8, math.ceil(budget_bytes / (computed_bpt * context) * 4) + EXTRA_REQUESTS)
            engine_args.update(max_num_seqs=seqs, max_num_batched_tokens=seqs * context)
        if progress:
            progress(f"vLLM {kvd}: starting ({budget_bytes / 2**30:.4g} GiB KV budget, context {context:,})")
        started = time.perf_counter()
        try:
            runner = VllmRunner(
                model_dir,
                dtype=dtype,
                kv_cache_dtype=kvd,
                max_model_len=context,
                kv_cache_bytes=budget_bytes,
                top_k=1,
                engine_args=engine_args,
                flags=START_FLAGS,
            )
        except EvalkitError as exc:
            line = too_small(str(exc.__cause__ or exc), budget_bytes, context, kvd, math.ceil(computed_bpt * context))
            if line is None:
                raise
            raise EvalkitError(line) from None
        with runner:
            alloc = read_allocation(runner, budget_bytes, context)
            info = {
                **runner.info(),
                "engine_profile": profile,
                "engine_block_size": alloc.block_size,
                "engine_start_seconds": round(time.perf_counter() - started, 3),
                "host_load_average": round(os.getloadavg()[0], 2),
            }  # speeds are wall time: what else ran counts
            info.pop("engine_top_k", None)
            m = Measurement(alloc, compare(alloc, computed_bpt, dtype), str(scheme), info)
            if load:
                prompt = context - decode_tokens
                if progress:
                    progress(
                        f"vLLM {kvd}: batch 1, then {math.ceil(alloc.max_concurrency) + EXTRA_REQUESTS} "
                        f"requests of {context:,} tokens"
                    )
                run_load(runner, 1, WARMUP_TOKENS, 2)  # vLLM's first steps on a new engine pay one-off costs
                m.single = run_load(runner, 1, prompt, decode_tokens)
                m.load = run_load(runner, math.ceil(alloc.max_concurrency) + EXTRA_REQUESTS, prompt, decode_tokens)
        out.append(m)
    return out


def engine_profile() -> str:
    """The evalkit profile of the vLLM build installed here (vllm-cpu, vllm-cuda, vllm-rocm)."""
    from vllm.platforms import current_platform

    kind = str(current_platform.device_type)
    if kind == "cpu":
        return "vllm-cpu"
    if kind == "cuda":
        return "vllm-rocm" if current_platform.is_rocm() else "vllm-cuda"
    raise EvalkitError(f"evalkit has no engine profile for vLLM on {kind}: it knows vllm-cpu, vllm-cuda and vllm-rocm")
