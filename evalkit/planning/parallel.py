"""How a deployment splits a model over GPUs, as vLLM splits it: tensor, pipeline, data and expert parallelism.

A :class:`Parallel` is the four sizes vLLM takes (``--tensor-parallel-size``, ``--pipeline-parallel-size``,
``--data-parallel-size``, ``--enable-expert-parallel``); the GPUs it needs are TP x PP x DP. Expert
parallelism is not a size of its own in vLLM: when enabled, the experts of every MoE layer are spread
over all TP x DP ranks (``vllm/model_executor/layers/fused_moe/config.py``,
``FusedMoEParallelConfig.make``: ``ep_size = tp_size * dp_size``), so ``ep`` is 1 (off) or TP x DP.

Pipeline stages hold consecutive layers, split as :func:`stage_layers` (vLLM's
``vllm/distributed/utils.py`` ``get_pp_indices``: an even split, the remainder going to the stages
before the last, last-but-one first). A KV cache rank holds, per token, its stage's layers and:

- standard attention (MHA/GQA/MQA): ``max(1, kv_heads / tp)`` KV heads. vLLM shards the KV heads over
  the TP ranks while there are enough; past ``tp = kv_heads`` each rank keeps one head, replicated
  ``tp / kv_heads`` times (``QKVParallelLinear``: ``num_kv_head_replicas``);
- MLA: the whole latent and RoPE key of every token its TP group serves (the latent has no heads to
  shard); under data-parallel attention each DP rank holds only its own requests' latents.

vLLM gives every rank of one engine the same number of KV blocks, the smallest any rank fits
(``vllm/v1/core/kv_cache_planning.py``: "Change the num_blocks of each rank to the smallest among
all ranks"), so a replica (one DP rank's TP x PP group) serves the tokens of its tightest rank, and the
deployment serves DP times that.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from evalkit.errors import EvalkitError
from evalkit.models.info import KVLayout


@dataclass(frozen=True)
class Parallel:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1  # 1: off; else TP x DP (vLLM's expert group)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def expert_parallel(self) -> bool:
        return self.ep > 1

    def __str__(self) -> str:
        parts = [f"TP {self.tp}"]
        if self.pp > 1:
            parts.append(f"PP {self.pp}")
        if self.dp > 1:
            parts.append(f"DP {self.dp}")
        if self.ep > 1:
            parts.append(f"EP {self.ep}")
        return " x ".join(parts)


def make_parallel(
    tp: int | None = None, pp: int | None = None, dp: int | None = None, ep: int | None = None, gpus: int | None = None
) -> tuple[Parallel, str | None]:
    """The deployment the flags describe, and a note when ``--gpus`` alone was read as tensor parallelism.

    One line (EvalkitError) for a size below 1, an expert-parallel size vLLM cannot have, or ``--gpus``
    that disagrees with TP x PP x DP."""
    for flag, value in (
        ("--tensor-parallel", tp),
        ("--pipeline-parallel", pp),
        ("--data-parallel", dp),
        ("--expert-parallel", ep),
        ("--gpus", gpus),
    ):
        if value is not None and value < 1:
            raise EvalkitError(f"{flag} must be at least 1, got {value}")
    note = None
    if tp is None and pp is None and dp is None and ep is None and gpus and gpus > 1:
        tp = gpus
        note = (
            f"--gpus {gpus} with no parallel sizes: read as --tensor-parallel {gpus} (vLLM's way to spread one model)"
        )
    par = Parallel(tp or 1, pp or 1, dp or 1, 1)
    if ep is not None and ep > 1 and ep != par.tp * par.dp:
        raise EvalkitError(
            f"--expert-parallel {ep}: vLLM spreads the experts over every TP and DP rank (--enable-expert-parallel), "
            f"so it is 1 (off) or --tensor-parallel x --data-parallel = {par.tp * par.dp}"
        )
    par = dataclasses.replace(par, ep=ep or 1)
    if gpus is not None and gpus != par.gpus:
        raise EvalkitError(
            f"--gpus {gpus} but --tensor-parallel {par.tp} x --pipeline-parallel {par.pp} x --data-parallel {par.dp} "
            f"= {par.gpus} GPUs: make them agree (or drop --gpus)"
        )
    return par, note


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """The decoder layers of each pipeline stage, as vLLM's ``get_pp_indices`` splits them."""
    if pp > num_layers:
        raise EvalkitError(
            f"--pipeline-parallel {pp} is more stages than the model's {num_layers} layers: use at most {num_layers}"
        )
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    starts = [sum(sizes[:i]) for i in range(pp)]
    return [range(start, start + size) for start, size in zip(starts, sizes)]


def kv_heads_per_rank(kv_heads: int, tp: int) -> int:
    """KV heads one TP rank stores: shared out while there are enough, one (replicated) past that."""
    if tp <= kv_heads:
        if kv_heads % tp:
            raise EvalkitError(
                f"--tensor-parallel {tp} does not divide the model's {kv_heads} KV heads: vLLM needs one to divide "
                "the other; use a TP size that divides the KV heads or a multiple of them"
            )
        return kv_heads // tp
    if tp % kv_heads:
        raise EvalkitError(
            f"--tensor-parallel {tp} is not a multiple of the model's {kv_heads} KV heads: vLLM replicates KV heads "
            "only a whole number of times; use a TP size that divides the KV heads or a multiple of them"
        )
    return 1


def rank_layout(layout: KVLayout, par: Parallel, stage: int) -> KVLayout:
    """The KV layout one rank of pipeline ``stage`` stores: its stage's attention layers, its share of the KV
    heads (all of an MLA latent). ``num_layers`` stays the model's, so ``+skip=`` counts layers as before."""
    layers = stage_layers(layout.num_layers, par.pp)[stage]
    every = layout.attention_layers if layout.attention_layers is not None else range(layout.num_layers)
    mine = tuple(i for i in every if i in layers)
    heads = layout.num_kv_heads if layout.is_mla else kv_heads_per_rank(layout.num_kv_heads, par.tp)
    return dataclasses.replace(layout, num_kv_heads=heads, attention_layers=mine)
