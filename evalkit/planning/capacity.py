"""Serving capacity: how many KV tokens and concurrent sequences fit, per KV scheme, per GPU and per deployment.

A deployment (:mod:`evalkit.planning.deployment`) gives each rank a KV budget: the GPU's memory at the
engine's utilization, less the rank's weights and a reserve for activations and CUDA graphs, as vLLM
sizes it. Each rank stores its share of every cached token (:func:`evalkit.planning.parallel.rank_layout`:
its pipeline stage's layers; its share of the KV heads, or all of an MLA latent), so per scheme::

    tokens per rank      = floor(KV budget / bytes per token on the rank)   (long-context rate, memory.bytes_per_token)
    sequences per rank   = floor(KV budget / bytes of one sequence at the context on the rank)   (exact)
    tokens, deployment   = DP x the smallest stage's tokens per rank         (a TP group holds each token once,
    sequences, deployment= DP x the smallest stage's sequences               split over its ranks or replicated)
    multiplier           = BF16 bytes per token / bytes per token

With a vLLM release's block size B (``capacity --vllm-version``, :mod:`evalkit.planning.vllm_sizing`) the
cache is whole blocks, as vLLM allocates it (``num_blocks = available // bytes_per_block``)::

    tokens per rank      = B x floor(KV budget / (B x bytes per token on the rank))
    sequences per rank   = floor(KV budget / bytes of one sequence at ceil(context / B) x B tokens)

:func:`plan_ranks` makes those rows, with whether vLLM runs each scheme's ``kv_cache_dtype`` on the
chosen GPU (:mod:`evalkit.planning.kv_backends`); :func:`memory_fit` is the same plan in a few lines, for
the sweep's dry run. :func:`kv_budget` and :func:`plan` are the earlier single-budget forms
(``gpus x memory x utilization - weights``, pooled): right for one GPU, or for KV heads sharded as
evenly as the weights with no reserve; kept for the capacity notebook.

Sizes parse and print as :mod:`evalkit.units` says (``80GiB`` binary, ``80GB`` decimal in; binary units
out); token counts parse as ``32k`` (32 x 1024) or ``128K``. Bytes are evalkit's plain count (data plus
each scale at its storage size, :mod:`evalkit.kv.memory`); :func:`layout_notes` says where an engine's own
layout differs from it, for the schemes shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from evalkit.errors import EvalkitError
from evalkit.kv.formats import ScaleDType
from evalkit.kv.memory import bytes_per_token, model_cache_bytes
from evalkit.kv.scheme import GranularityKind, Scheme
from evalkit.models.info import KVLayout
from evalkit.planning.gpus import GPU
from evalkit.planning.kv_backends import kv_support
from evalkit.planning.parallel import Parallel, rank_layout
from evalkit.units import format_bytes, parse_number

_COUNT_UNITS = {"": 1, "k": 2**10, "m": 2**20}


def parse_count(text) -> int:
    """``32k`` -> 32768, ``128K`` -> 131072, ``1m`` -> 1048576, ``4096`` -> 4096."""
    value = parse_number(text, _COUNT_UNITS, "a token count", "32k, 128k or 4096")
    if value < 1 or value != int(value):
        raise EvalkitError(f"a token count must be a positive whole number, got {text!r}")
    return int(value)


@dataclass(frozen=True)
class Capacity:
    scheme: str
    bytes_per_token: float
    sequence_bytes: int
    kv_budget: int
    tokens: int
    sequences: int
    multiplier: float


def kv_budget(gpu_memory: int, gpus: int = 1, utilization: float = 0.9, weights: int = 0) -> int:
    """The pooled budget ``gpus x memory x utilization - weights`` (see the module docstring for when it holds)."""
    if gpus < 1:
        raise EvalkitError(f"--gpus must be at least 1, got {gpus}")
    if not 0 < utilization <= 1:
        raise EvalkitError(f"--utilization is a fraction in (0, 1], got {utilization}")
    usable = int(gpus * gpu_memory * utilization)
    if weights >= usable:
        raise EvalkitError(
            f"the weights ({format_bytes(weights)}) do not fit in {gpus} x {format_bytes(gpu_memory)} at utilization {utilization} "
            f"({format_bytes(usable)} usable): add GPUs, use smaller weights (--weights-dtype fp8/int4) or raise --utilization"
        )
    return usable - weights


def plan(layout: KVLayout, schemes: list[Scheme], budget: int, context: int) -> list[Capacity]:
    """One :class:`Capacity` per scheme, BF16 first (added if missing) as the multiplier's reference."""
    schemes = [Scheme()] + [s for s in schemes if not s.is_identity]
    out = []
    base = bytes_per_token(layout, Scheme())
    for scheme in schemes:
        per_token = bytes_per_token(layout, scheme)
        seq_bytes = model_cache_bytes(layout, scheme, context)
        tokens = math.floor(budget / per_token)
        out.append(
            Capacity(
                str(scheme), float(per_token), seq_bytes, budget, tokens, budget // seq_bytes, float(base / per_token)
            )
        )
    return out


def format_plan(rows: list[Capacity], context: int) -> str:
    import pandas as pd

    table = pd.DataFrame(
        [
            {
                "scheme": r.scheme,
                "bytes/token": f"{r.bytes_per_token:,.0f}"
                if r.bytes_per_token == int(r.bytes_per_token)
                else f"{r.bytes_per_token:,.2f}",
                f"MiB/seq @{context}": f"{r.sequence_bytes / 2**20:,.1f}",
                "KV tokens": f"{r.tokens:,}",
                f"seqs @{context}": f"{r.sequences:,}",
                "x BF16": f"{r.multiplier:.2f}",
            }
            for r in rows
        ]
    )
    return table.to_markdown(index=False, disable_numparse=True)


def layout_notes(layout: KVLayout, schemes: list[Scheme]) -> list[str]:
    """Where engines lay the cache out differently from the plain count, for these schemes (facts
    read in the engines' public sources; see :mod:`evalkit.kv.microscaling` for the FP4 ones)."""
    notes = []
    names = {s.name for s in schemes}
    if layout.compress_ratios is not None:
        csa = sum(1 for r in layout.compress_ratios if r == 4)
        notes.append(
            f"DeepSeek V4: every layer keeps its last {layout.sliding_window} tokens' entries plus one compressed entry "
            "per ratio tokens (compress_ratios: 0 window only, 4, 128); an entry is 448 NoPE + 64 RoPE values. "
            "Counted per entry; bytes/token is the long-context rate (the window is a per-sequence constant). Not "
            f"counted: the indexer keys of the {csa} ratio-4 layers (one 128-value FP8 key + 4 scale bytes per "
            "compressed entry in vLLM) and page alignment."
        )
        notes.append(
            "dsv4:fp8_ds_mla (584 B: 448 E4M3 + 7 UE8M0 scales + a pad byte + 64 BF16 RoPE values) and "
            "dsv4:fp8_ds_mla_v41 (528 B: 512 E4M3 + 16 UE8M0 scales, RoPE included) are what vLLM's fp8_ds_mla "
            "stores on a DeepSeek V4 / V4.1 model; auto and fp8 resolve to it on the packed DeepSeek V4 backends "
            "(models/deepseek_v41/attention.py _resolve_dsv4_kv_cache_dtype), so auto is not a BF16 cache there. "
            "'V4 backends' in the GPU column: DeepSeek V4's own attention classes, which evalkit's table of vLLM "
            "backends per GPU does not hold."
        )
    elif layout.is_mla:
        notes.append(
            "MLA: vLLM's dense MLA backends store fp8 as one 576-wide E4M3 entry under the layer's one k_scale, "
            "RoPE key included (vllm:fp8); DeepSeek V3.2's sparse backend stores fp8_ds_mla (512 E4M3 latent "
            "values + 4 power-of-two FP32 scales + 64 BF16 RoPE values = 656 B per layer, vllm:fp8_ds_mla; "
            "fp8_e4m3/group128/dynamic+rope=bf16 has the same bytes) or nvfp4_ds_mla (512 E2M1 + 32 E4M3 scales + "
            "64 E4M3 RoPE values = 352 B, vllm:nvfp4_ds_mla)."
        )
        if any(s.kv_format.group_scaled for s in schemes):
            notes.append(
                "MLA with FP4: vLLM's nvfp4_ds_mla (SM100, FlashMLA sparse) is the one FP4 MLA cache in the sources "
                "read; the other FP4 rows quantize the 512-value latent in groups along it (and the RoPE key unless "
                "+rope=bf16)."
            )
    if "nvfp4" in names:
        notes.append(
            "nvfp4: 0.5 B per value + one E4M3 byte per 16 values; the FP32 per-tensor scale is counted once "
            "per sequence for each cached tensor of each layer (K and V; MLA: latent and RoPE key), where engines "
            "keep one k_scale/v_scale per layer; either way it adds "
            "nothing per token. vLLM packs each page as [K data | K scales | V data | V scales]; TensorRT-LLM "
            "keeps the block scales in a separate pool: same bytes, modulo page alignment."
        )
    if "sglang_fp4" in names:
        notes.append(
            "sglang_fp4: SGLang's MHATokenToKVPoolFP4 holds uint8 [slots, heads, head_dim/2] codes plus uint8 "
            "[slots, heads*head_dim/16] E8M0 scales: 4.5 bits per value, as counted here."
        )
    if any(getattr(s.recipe, "value", None) == "sglang_mxfp8" for s in schemes):
        notes.append(
            "sglang:mxfp8: SGLang's --kv-cache-dtype mxfp8 (FA4) keeps 1 B per value in its K/V buffers and one "
            "UE8M0 byte per 32 values in separate K/V scale buffers (FA4's interleaved BlockScaledBasicChunk "
            "order, a page of P tokens holding heads x P x head_dim/32 bytes): head_dim + head_dim/32 bytes per "
            "token, head and side, as counted here."
        )
    if names & {"mxfp4", "mxfp8_e4m3"}:
        notes.append(
            "mxfp4 / mxfp8_e4m3: the OCP MX v1.0 layout, blocks of 32 values with one E8M0 byte each "
            "(0.25 bit per value); SGLang's fp4_mx_block16 KV uses E8M0 blocks of 16 instead (sglang_fp4)."
        )
    if any(s.scale_dtype is ScaleDType.FP32 and s.granularity.size and s.kv_format.group_scaled for s in schemes):
        notes.append("fp4_e2m1 with fp32 scales is a reference point (ideal scales), not an engine layout.")
    return notes


# -- per rank and per deployment -------------------------------------------------------------------------
@dataclass(frozen=True)
class RankRow:
    """One scheme on a deployment: per rank (the tightest pipeline stage's) and for the whole deployment."""

    scheme: str
    bytes_per_token: float  # on one rank
    sequence_bytes: int  # one sequence at the context, on one rank
    tokens: int  # per rank, = per replica (a TP group holds each token once)
    sequences: int  # per replica
    deployment_tokens: int
    deployment_sequences: int
    multiplier: float
    vllm_dtype: str | None = None  # the kv_cache_dtype that stores the scheme's bytes (None: none does)
    vllm: str | None = None  # on the named GPU: "yes: BACKEND", "no", "-" (not a vLLM dtype); None: no GPU named
    vllm_reason: str = ""


def vllm_dtype(scheme: Scheme, layout: KVLayout) -> str | None:
    """The vLLM ``kv_cache_dtype`` that stores this scheme's bytes, or None (no vLLM dtype does)."""
    if scheme.is_unscaled:  # auto, or the 16-bit dtype a bf16/fp16 cache names
        return {"auto": "auto", "bf16": "bfloat16", "fp16": "float16"}[scheme.format]
    from evalkit.kv.codec import family_of

    family = family_of(scheme.recipe)
    if family is not None:  # an engine's own cache type: vLLM's families (as each declares) name its kv_cache_dtype
        return family.cache_type(scheme) if family.engine.startswith("vLLM") else None
    if scheme.name == "nvfp4":
        return "nvfp4"
    plain = scheme.recipe.value in ("standard", "vllm_cpu") and not scheme.tensor_scale  # same bytes either way
    if plain and scheme.format in ("fp8_e4m3", "fp8_e5m2"):
        kind = scheme.granularity.kind
        if kind in (GranularityKind.TENSOR, GranularityKind.HEAD) and not scheme.rope_bf16:
            return "fp8" if layout.is_mla and scheme.format == "fp8_e4m3" else scheme.format
        mla_tiles = kind is GranularityKind.GROUP and scheme.granularity.size == 128 and scheme.rope_bf16
        if layout.is_mla and mla_tiles and scheme.format == "fp8_e4m3":
            return "fp8_ds_mla"
    return None


def _mark(scheme: Scheme, layout: KVLayout, gpu: GPU | None) -> tuple[str | None, str | None, str]:
    dtype = vllm_dtype(scheme, layout)
    if gpu is None:
        return dtype, None, ""
    if dtype is None:
        return None, "-", ""
    if layout.compress_ratios is not None:  # DeepSeek V4's own backends, which evalkit's GPU table does not hold
        if scheme.recipe.value == "dsv4_fp8_ds_mla_v41" and not gpu.sm100_family:  # the V4.1 record
            return (
                dtype,
                "no",
                (
                    "vLLM writes the V4.1 record on SM 10.x only; a V4.1 model keeps the V4 record (dsv4:fp8_ds_mla) "
                    "elsewhere (models/deepseek_v41/attention.py _use_v41_mxfp8_kv_record)"
                ),
            )
        return dtype, "V4 backends", ""
    support = kv_support(gpu, dtype, kind="mla" if layout.is_mla else "standard", head_size=layout.head_dim)
    reason = support.reason
    if not support.runs and dtype.endswith("_ds_mla"):
        reason += " (DeepSeek V3.2's sparse-MLA backends only)"
    return dtype, support.mark(), reason


def plan_ranks(
    layout: KVLayout,
    schemes: list[Scheme],
    stages,
    par: Parallel,
    context: int,
    gpu: GPU | None = None,
    block_size: int = 1,
) -> list[RankRow]:
    """One :class:`RankRow` per scheme, BF16 first (added if missing); ``stages`` from
    :func:`evalkit.planning.deployment.stages`; ``block_size`` tokens per vLLM block (1: no rounding)."""
    held = -(-context // block_size) * block_size  # the tokens of a sequence's whole blocks
    schemes = [Scheme()] + [s for s in schemes if not s.is_identity]
    layouts = [rank_layout(layout, par, st.index) for st in stages]
    rows = []
    for scheme in schemes:
        per_stage = []
        for st, rl in zip(stages, layouts):
            rate = bytes_per_token(rl, scheme)
            if rate == 0:  # a stage without attention layers stores nothing
                continue
            seq = model_cache_bytes(rl, scheme, held)
            base = bytes_per_token(rl, Scheme())
            tokens = math.floor(st.kv_budget / (rate * block_size)) * block_size
            per_stage.append((tokens, st.kv_budget // seq, rate, seq, base))
        tokens, seqs, rate, seq, base = min(per_stage)
        seqs = min(p[1] for p in per_stage)
        dtype, mark, reason = _mark(scheme, layout, gpu)
        rows.append(
            RankRow(
                str(scheme), float(rate), seq, tokens, seqs, par.dp * tokens, par.dp * seqs, float(base / rate),
                dtype, mark, reason,
            )
        )  # fmt: skip
    return rows


def format_ranks(rows: list[RankRow], context: int, gpu: GPU | None = None) -> str:
    import pandas as pd

    def per_token(x: float) -> str:
        return f"{x:,.0f}" if x == int(x) else f"{x:,.2f}"

    records = []
    for r in rows:
        rec = {
            "scheme": r.scheme,
            "bytes/token (rank)": per_token(r.bytes_per_token),
            f"MiB/seq @{context} (rank)": f"{r.sequence_bytes / 2**20:,.1f}",
            "KV tokens (rank)": f"{r.tokens:,}",
            f"seqs @{context} (rank)": f"{r.sequences:,}",
            "KV tokens (deployment)": f"{r.deployment_tokens:,}",
            f"seqs @{context} (deployment)": f"{r.deployment_sequences:,}",
            "x BF16": f"{r.multiplier:.2f}",
        }
        if gpu is not None:
            rec[f"vLLM 0.33 on {gpu.key.upper()}"] = r.vllm
        records.append(rec)
    return pd.DataFrame(records).to_markdown(index=False, disable_numparse=True)


def memory_fit(
    config: dict,
    gpu: str,
    *,
    parallel: Parallel | None = None,
    weights_dtype: str | None = None,
    context: int = 32768,
    scheme: str = "auto",
    utilization: float = 0.9,
    weight_block: int | None = None,
) -> list[str]:
    """The per-rank memory fit of a model (its config fields) on a named GPU, in a few lines: what the
    sweep's dry run prints. ``weights_dtype`` is the checkpoint's (default: the config's ``torch_dtype``,
    else bf16; a preset's ``weights_dtype`` and ``weight_block`` for FP8 presets); the batch is ``vllm
    serve``'s default for the GPU. A model that does not fit gives one line saying so (never an exception)."""
    from evalkit.kv.scheme import parse_scheme
    from evalkit.models.info import kv_layout
    from evalkit.models.presets import DTYPE_BYTES, config_namespace
    from evalkit.planning.deployment import Deployment, stages
    from evalkit.planning.gpus import get_gpu
    from evalkit.planning.reserve import Batch, serve_defaults
    from evalkit.planning.weights import Architecture

    card = get_gpu(gpu)
    par = parallel or Parallel()
    arch = Architecture.from_config(config)
    shipped = str(config.get("torch_dtype") or config.get("dtype") or "bf16")
    dtype = weights_dtype or (shipped if shipped in DTYPE_BYTES else "bf16")
    tokens, seqs = serve_defaults(card.memory, card.name)
    dep = Deployment(card.memory, utilization, par, Batch(tokens, seqs, 1024 if card.sm100_family else 512))
    layout = kv_layout(config_namespace(config))
    head = f"memory fit on {par.gpus} x {card.key.upper()} ({par}, {format_bytes(dep.usable)} usable per GPU)"
    try:
        plan = stages(dep, layout.num_layers, arch, dtype if arch else None, weight_block)
        row = plan_ranks(layout, [parse_scheme(scheme)], plan, par, context, card)[-1]
    except EvalkitError as exc:
        return [f"{head}: {exc}"]
    tight = min(plan, key=lambda st: st.kv_budget)
    return [
        f"{head}: weights {format_bytes(tight.weights)} + reserve {format_bytes(tight.reserve)} per rank leave "
        f"{format_bytes(tight.kv_budget)} of KV cache",
        f"  {row.scheme}: {row.tokens:,} tokens per rank, {row.sequences:,} sequences of {context:,} tokens per "
        f"replica, {row.deployment_sequences:,} in all; vLLM on {card.key.upper()}: {row.vllm}",
    ]
