"""Serving capacity measured from vLLM itself: the KV tokens its allocator fits, how many requests it
admits at once, and its prefill and decode speed, per ``kv_cache_dtype``, next to evalkit's count.

For each ``kv_cache_dtype`` one in-process engine (:class:`~evalkit.engines.vllm.runner.VllmRunner`)
is started on the model with the same KV budget (``kv_cache_memory_bytes``: on the CPU what
``VLLM_CPU_KVCACHE_SPACE`` sets, on CUDA the alternative to ``gpu_memory_utilization``) and
``max_model_len`` = the context. Read from the engine's own objects, not its log:

- capacity (:class:`Allocation`): the scheduler's ``KVCacheConfig`` (blocks, the backing tensors'
  bytes, each group's block size and layers) and the cache config's
  ``kv_cache_max_concurrency`` (vLLM's ``get_max_concurrency_for_kv_cache_config``: blocks over
  the blocks one request of ``max_model_len`` tokens takes). ``kv_tokens`` = blocks x block size;
  the engine's bytes per token = allocated bytes / kv_tokens; ``usable_kv_tokens`` is what the
  block pool has free on an idle engine (vLLM keeps one block as its null block).
- admission under load (:func:`run_load`): ``ceil(max concurrency) + 2`` requests of ``context``
  tokens each (prompt ``context - decode_tokens``, then ``decode_tokens`` generated, EOS ignored),
  added at once and stepped one engine step at a time; after every step the scheduler's
  ``get_request_counts()`` (running, waiting) and the requests' ``num_preemptions`` are read.
  ``admitted_requests`` is the most requests running in a step that left some waiting: what ran at
  once before the engine queued. The scheduler's per-step token budget and sequence limit are set
  above what the budget can hold, so the KV cache is the limit.
- speed (:func:`speeds`): from the same steps. Each request's ``num_computed_tokens`` before and
  after a step splits the tokens it computed into prompt (prefill) and generated (decode) tokens;
  prefill tok/s is prompt tokens over the wall time of the steps that computed any, decode tok/s
  is generated tokens over the steps that computed only those (at the admitted concurrency: steps
  running exactly that many). Batch 1 is one request alone on the same engine, after a warm-up.

Next to each: evalkit's bytes per token for the scheme the engine profile maps the dtype to
(``auto`` is the unquantized BF16 count; ``fp8_e4m3`` is ``fp8_e4m3/tensor/unit+rounding=rtz`` on
vllm-cpu), the tokens that count fits in the budget and the ratio of the two
(:func:`compare`). A ratio more than 1 % from 1 is flagged with the term that explains it, each
worked out from the engine's numbers: the per-token storage (the engine's page holds other bytes
per token than evalkit counts, e.g. a float32 unquantized cache where evalkit counts BF16) and
block rounding (the allocator hands out whole blocks). The capacity ratio of a dtype against
``auto`` is given both ways (``capacity_vs_auto`` from the allocator, ``computed_capacity_vs_auto``
from evalkit's count).

:func:`serving_rows` turns the measurements into :class:`~evalkit.evals.base.MetricRow` rows for a
results store; ``python -m evalkit capacity --engine vllm`` prints them (:mod:`evalkit.cli.capacity`).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evalkit.errors import EvalkitError

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2")
START_FLAGS = {"context": "--context", "budget": "--budget-gib"}  # what sets max_model_len and the KV budget
DEFAULT_DTYPE = (
    "bfloat16"  # the model dtype the engine runs: ``auto`` then stores BF16, what evalkit's unquantized count is
)
DEFAULT_CONTEXT = 2048
DEFAULT_DECODE_TOKENS = 16
EXTRA_REQUESTS = 2  # submitted beyond the engine's max concurrency, so a queue forms
MISMATCH = 0.01  # a capacity ratio further than this from 1 is flagged
WARMUP_TOKENS = 16


# -- what the engine allocated --------------------------------------------------------------------------
@dataclass(frozen=True)
class Allocation:
    """The engine's KV cache for one kv_cache_dtype, read from its scheduler and cache config."""

    kv_cache_dtype: str
    budget_bytes: int
    context: int  # max_model_len
    num_blocks: int
    block_size: int
    allocated_bytes: int  # the backing tensors' bytes
    max_concurrency: float  # vLLM's own, for requests of ``context`` tokens
    usable_blocks: int  # free in the block pool on an idle engine (the null block excluded)
    layers: int

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def usable_kv_tokens(self) -> int:
        return self.usable_blocks * self.block_size

    @property
    def bytes_per_token(self) -> Fraction:
        return Fraction(self.allocated_bytes, self.kv_tokens)


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
    from evalkit.engines.profiles import get_profile

    return get_profile(profile).scheme_for(kv_cache_dtype)


def check_kv_cache_dtypes(names, profile: str) -> tuple[str, ...]:
    """The names, each one the profile's engine takes, or EvalkitError naming the ones it does
    (``None``: those of :data:`DEFAULT_KV_CACHE_DTYPES` the profile lists)."""
    from evalkit.engines.profiles import get_profile

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


@dataclass(frozen=True)
class Comparison:
    """The allocator's tokens against evalkit's count for the same dtype and budget."""

    computed_bytes_per_token: Fraction
    computed_tokens: int  # floor(budget / computed bytes per token)
    ratio: float  # kv_tokens / computed_tokens
    flagged: bool
    terms: tuple[str, ...]  # what explains a flagged ratio (empty when not flagged)


def compare(alloc: Allocation, computed_bpt: Fraction, engine_dtype: str = DEFAULT_DTYPE) -> Comparison:
    """Hold the allocation against evalkit's bytes per token and name what explains a mismatch over
    :data:`MISMATCH`: the per-token storage term (engine bytes per token differ) and block rounding
    (whole blocks), each with its share, computed from the engine's own numbers."""
    computed = math.floor(alloc.budget_bytes / computed_bpt)
    ratio = alloc.kv_tokens / computed if computed else math.inf
    if abs(ratio - 1) <= MISMATCH:
        return Comparison(computed_bpt, computed, ratio, False, ())
    terms = []
    engine_bpt = alloc.bytes_per_token
    if engine_bpt != computed_bpt:
        why = (
            f"the unquantized cache is the model dtype {engine_dtype}, evalkit's unquantized count is BF16"
            if alloc.kv_cache_dtype == "auto" and engine_dtype not in ("bfloat16", "float16", "half")
            else "padding or scales inside the engine's pages"
        )
        terms.append(
            f"per-token storage: the engine stores {float(engine_bpt):,.2f} B/token, evalkit counts "
            f"{float(computed_bpt):,.2f} (x{float(computed_bpt / engine_bpt):.4f} tokens; {why})"
        )
    unrounded = math.floor(alloc.budget_bytes / engine_bpt)
    if unrounded != alloc.kv_tokens:
        terms.append(
            f"block rounding: whole blocks of {alloc.block_size} tokens, {unrounded - alloc.kv_tokens:,} of "
            f"{unrounded:,} tokens ({(unrounded - alloc.kv_tokens) / unrounded:.2%}) left unallocated"
        )
    blocks_left = alloc.kv_tokens - math.floor(alloc.budget_bytes / engine_bpt / alloc.block_size) * alloc.block_size
    if blocks_left:
        terms.append(f"unexplained: {blocks_left:,} tokens beyond whole blocks of the engine's own bytes per token")
    return Comparison(computed_bpt, computed, ratio, True, tuple(terms))


# -- admission and speed -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One engine step: wall seconds, requests running and waiting after it, prompt and generated
    tokens it computed, and the preemptions so far."""

    seconds: float
    running: int
    waiting: int
    prefill_tokens: int
    decode_tokens: int
    preemptions: int
    active: int = 0  # requests that computed tokens in the step


@dataclass
class LoadRun:
    """A load run: the requests submitted and the engine's steps."""

    requests: int
    prompt_tokens: int
    decode_tokens: int
    steps: list[Step] = field(default_factory=list)

    @property
    def admitted(self) -> int | None:
        """Most requests running in a step that left requests waiting (None: no queue ever formed)."""
        queued = [s.running for s in self.steps if s.waiting > 0]
        return max(queued) if queued else None

    @property
    def peak_running(self) -> int:
        return max((s.running for s in self.steps), default=0)

    @property
    def preemptions(self) -> int:
        return max((s.preemptions for s in self.steps), default=0)


def split_tokens(before: int, after: int, prompt: int) -> tuple[int, int]:
    """(prompt tokens, generated tokens) a request computed in a step that moved its
    ``num_computed_tokens`` from ``before`` to ``after`` (a preempted request restarts from 0)."""
    if after < before:  # preempted and recomputed in this step: the recompute starts from 0
        before = 0
    pre = max(0, min(after, prompt) - min(before, prompt))
    return pre, (after - before) - pre


def speeds(steps: list[Step], running: int | None = None) -> tuple[float | None, float | None]:
    """(prefill tok/s, decode tok/s) of a list of steps: prompt tokens over the steps that computed
    any, generated tokens over the steps that computed only those (with ``running``, only steps that
    computed tokens for exactly that many requests count for decode)."""
    pre = [s for s in steps if s.prefill_tokens]
    dec = [s for s in steps if not s.prefill_tokens and s.decode_tokens and (running is None or s.active == running)]
    pre_t, dec_t = sum(s.seconds for s in pre), sum(s.seconds for s in dec)
    return (
        sum(s.prefill_tokens for s in pre) / pre_t if pre_t else None,
        sum(s.decode_tokens for s in dec) / dec_t if dec_t else None,
    )


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
@dataclass
class Measurement:
    allocation: Allocation
    comparison: Comparison
    scheme: str  # the evalkit scheme of the computed count
    info: dict[str, Any]
    single: LoadRun | None = None
    load: LoadRun | None = None


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
    from evalkit.engines.vllm.runner import VllmRunner, _import_vllm
    from evalkit.kv.memory import bytes_per_token

    _import_vllm()
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


# -- rows ---------------------------------------------------------------------------------------------------
def serving_rows(measurements: list[Measurement]) -> list:
    """MetricRow rows: per kv_cache_dtype the allocation, evalkit's count and their ratio, the capacity
    against ``auto`` (both ways, where auto was measured), and with a load run admission and speed."""
    from evalkit.evals.base import MetricRow

    auto = next((m for m in measurements if m.allocation.kv_cache_dtype == "auto"), None)
    rows = []
    for m in measurements:
        a, c = m.allocation, m.comparison
        labels = {"kv_cache_dtype": a.kv_cache_dtype, "budget_bytes": a.budget_bytes, "context": a.context}
        info = {**m.info, "computed_scheme": m.scheme}

        def add(metric, value, extra=None, more=None, labels=labels, info=info):
            if value is not None:
                rows.append(
                    MetricRow(metric, float(value), labels={**labels, **(extra or {})}, info={**info, **(more or {})})
                )

        add("kv_tokens", a.kv_tokens, more={"kv_blocks": a.num_blocks, "allocated_bytes": a.allocated_bytes})
        add("usable_kv_tokens", a.usable_kv_tokens, more={"null_blocks": a.num_blocks - a.usable_blocks})
        add("max_concurrency", a.max_concurrency)
        add("engine_bytes_per_token", a.bytes_per_token)
        add("computed_bytes_per_token", c.computed_bytes_per_token)
        add("computed_kv_tokens", c.computed_tokens)
        add("capacity_ratio_vs_computed", c.ratio, more={"flagged": c.flagged, "mismatch_terms": list(c.terms)})
        if auto is not None:
            add("capacity_vs_auto", a.kv_tokens / auto.allocation.kv_tokens)
            add("computed_capacity_vs_auto", auto.comparison.computed_bytes_per_token / c.computed_bytes_per_token)
        if m.load is not None:
            run = {
                "requests": m.load.requests,
                "prompt_tokens": m.load.prompt_tokens,
                "decode_tokens": m.load.decode_tokens,
            }
            add("admitted_requests", m.load.admitted, more={**run, "peak_running": m.load.peak_running})
            add("preemptions", m.load.preemptions, more=run)
        for run, batch in ((m.single, 1), (m.load, m.load.admitted if m.load else None)):
            if run is None or batch is None:
                continue
            prefill, decode = speeds(run.steps, None if batch == 1 else batch)
            more = {
                "prompt_tokens": run.prompt_tokens,
                "decode_tokens": run.decode_tokens,
                "timing": "wall, per engine step",
            }
            add("prefill_tok_s", prefill, {"batch": batch}, more)
            add("decode_tok_s", decode, {"batch": batch}, more)
    return rows


TABLE_COLUMNS = {
    "kv_tokens": "KV tokens",
    "max_concurrency": "max conc",
    "engine_bytes_per_token": "engine B/tok",
    "computed_bytes_per_token": "evalkit B/tok",
    "computed_kv_tokens": "evalkit tokens",
    "capacity_ratio_vs_computed": "engine/evalkit",
    "capacity_vs_auto": "x auto (engine)",
    "computed_capacity_vs_auto": "x auto (evalkit)",
    "admitted_requests": "admitted",
    "preemptions": "preempted",
}


def format_serving_table(table, fmt: str = "table") -> str:
    """The table as text (``table``), markdown (``md``) or CSV (``csv``): counts with separators,
    ratios to 4 decimals, speeds to 1."""
    if fmt == "csv":
        return table.to_csv(index=False).rstrip("\n")
    shown = table.copy()
    for col in shown.columns:
        if col in ("kv_cache_dtype", "note"):
            continue
        digits = (
            1 if "tok/s" in col else (4 if col.startswith(("engine/", "x auto")) else 2 if col == "max conc" else 0)
        )
        shown[col] = [
            _cell(v, 2 if "B/tok" in col and isinstance(v, float) and not v.is_integer() else digits)
            for v in shown[col]
        ]
    if fmt == "md":
        return shown.to_markdown(index=False, disable_numparse=True)
    return shown.to_string(index=False)


def _cell(v, digits: int) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return ""
    return f"{v:,.{digits}f}" if isinstance(v, (int, float)) else str(v)


def serving_table(rows) -> pd.DataFrame:
    """One line per kv_cache_dtype (the table ``capacity --engine vllm`` prints)."""
    import pandas as pd

    lines: dict[str, dict] = {}
    for r in rows:
        line = lines.setdefault(r.labels["kv_cache_dtype"], {"kv_cache_dtype": r.labels["kv_cache_dtype"]})
        if r.metric in TABLE_COLUMNS:
            line[TABLE_COLUMNS[r.metric]] = r.value
        elif r.metric in ("prefill_tok_s", "decode_tok_s"):
            batch = r.labels["batch"]
            line[f"{r.metric.removesuffix('_tok_s')} tok/s @{'1' if batch == 1 else 'admitted'}"] = r.value
        if r.metric == "capacity_ratio_vs_computed":
            line["block"] = r.info.get("engine_block_size")
            line["note"] = "; ".join(r.info.get("mismatch_terms") or [])
    return pd.DataFrame(list(lines.values()))
