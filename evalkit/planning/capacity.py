"""Serving capacity: how many KV tokens and concurrent sequences fit, per KV scheme.

The KV budget is what is left of the GPUs' memory, at the engine's utilization fraction, after
the weights::

    budget    = gpus * gpu_memory * utilization - weights
    sequences = floor(budget / bytes of one sequence at the context)      (exact, memory.model_cache_bytes)
    tokens    = floor(budget / bytes per token)                           (long-context rate, memory.bytes_per_token)
    multiplier = BF16 bytes per token / bytes per token   (the tokens ratio, before rounding down)

Activations, CUDA graphs and fragmentation are what ``utilization`` leaves room for; like the
engines' own ``gpu_memory_utilization``, it is a fraction of the whole memory. Sizes parse and
print as :mod:`evalkit.units` says (``80GiB`` or ``80GB`` in, binary units out); token counts
parse as ``32k`` (32 x 1024) or ``128K``.

Bytes are evalkit's plain count (data plus each scale at its storage size, :mod:`evalkit.kv.memory`).
:func:`layout_notes` says where an engine's own layout differs from it, for the schemes shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from evalkit.errors import EvalkitError
from evalkit.kv.formats import ScaleDType
from evalkit.kv.memory import bytes_per_token, model_cache_bytes
from evalkit.kv.scheme import Scheme
from evalkit.models.info import KVLayout
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
    if layout.is_mla:
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
    if names & {"mxfp4", "mxfp8_e4m3"}:
        notes.append(
            "mxfp4 / mxfp8_e4m3: the OCP MX v1.0 layout, blocks of 32 values with one E8M0 byte each "
            "(0.25 bit per value); SGLang's fp4_e2m1 KV uses E8M0 blocks of 16 instead (sglang_fp4)."
        )
    if any(s.scale_dtype is ScaleDType.FP32 and s.granularity.size and s.kv_format.group_scaled for s in schemes):
        notes.append("fp4_e2m1 with fp32 scales is a reference point (ideal scales), not an engine layout.")
    return notes
