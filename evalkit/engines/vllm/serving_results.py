"""What a serving measurement holds and how it reads, without vLLM: the records
:mod:`evalkit.engines.vllm.serving` fills from the engine it starts, and the arithmetic on them.

- :class:`Allocation`: the engine's KV cache for one ``kv_cache_dtype`` (blocks, block size,
  allocated bytes, vLLM's max concurrency); ``kv_tokens``, ``usable_kv_tokens`` and the engine's bytes
  per token follow from it.
- :func:`compare`: the allocation against evalkit's bytes per token (:class:`Comparison`), a ratio
  more than :data:`MISMATCH` from 1 flagged with the terms that explain it (per-token storage,
  block rounding).
- :class:`Step` and :class:`LoadRun`: a load run's engine steps; :func:`split_tokens` splits a
  request's computed tokens into prompt and generated ones, :func:`speeds` gives prefill and decode
  tok/s.
- :class:`Measurement` (one dtype, measured), :func:`serving_rows` (its
  :class:`~evalkit.evals.base.MetricRow` rows) and :func:`serving_table` /
  :func:`format_serving_table` (the table ``capacity --engine vllm`` prints).

Kept apart from the module that drives the engine so that these run, and are tested, where vLLM is
not installed; the method itself is described in :mod:`evalkit.engines.vllm.serving`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_DTYPE = (
    "bfloat16"  # the model dtype the engine runs: ``auto`` then stores BF16, what evalkit's unquantized count is
)
MISMATCH = 0.01  # a capacity ratio further than this from 1 is flagged


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


# -- evalkit's count next to it ---------------------------------------------------------------------------
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


# -- one dtype, measured ---------------------------------------------------------------------------------
@dataclass
class Measurement:
    allocation: Allocation
    comparison: Comparison
    scheme: str  # the evalkit scheme of the computed count
    info: dict[str, Any]
    single: LoadRun | None = None
    load: LoadRun | None = None


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
