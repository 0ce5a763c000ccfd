"""Weights per GPU: a model's parameters by part, and the share one rank holds as vLLM shards them.

:class:`Architecture` reads, from a config (a preset's fields or a ``config.json``), the parts that size
the weights: attention (standard Q/K/V/O, or MLA's down- and up-projections), dense MLPs, MoE routed and
shared experts with their router, embeddings and LM head. :func:`rank_weights` counts the parameters one
rank of a pipeline stage holds, as vLLM 0.33 builds its layers (``vllm/model_executor/layers/linear.py``,
``vocab_parallel_embedding.py``, ``models/llama.py``, ``models/deepseek_v2.py``):

- attention: Q/O column/row parallel, heads / TP per rank; K/V ``max(1, kv_heads / TP)`` heads per rank
  (``QKVParallelLinear`` replicates them past TP = kv_heads). MLA: ``q_a_proj`` and ``kv_a_proj_with_mqa``
  replicated (``DeepSeekV2FusedQkvAProjLinear``, ``disable_tp=True``), ``q_b_proj``/``kv_b_proj`` column and
  ``o_proj`` row parallel, heads / TP;
- dense MLP: gate/up column, down row parallel (intermediate / TP);
- routed experts: with expert parallelism each rank holds whole experts, ``ceil(experts / EP)`` on the
  fullest rank (``determine_expert_map``: the remainder goes to the first ranks); without it every rank
  holds a 1/(TP x DP) slice of every expert (``flatten_tp_across_dp_and_pcp``). Shared experts: TP
  over the TP group, replicated when vLLM runs the MoE sequence-parallel (EP with TP > 1 and DP > 1,
  ``use_sequence_parallel_moe``); the router (``GateLinear``) replicated;
- embeddings and LM head: vocab-parallel over TP, the vocabulary padded to a multiple of 64 first
  (``DEFAULT_VOCAB_PADDING_SIZE``), on the first and last pipeline stage; norms replicated;
- data parallelism replicates all of it, except what expert parallelism spreads.

Bytes: decoder linear weights in the checkpoint's dtype (``fp8``, ``int4`` ...), with one float32 scale per
128 x 128 block when the checkpoint is block-quantized (DeepSeek-V3, Kimi K2); embeddings, LM head,
norms and router in BF16 (FP8 checkpoints keep them so), or all in the dtype when it is 16- or 32-bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from evalkit.errors import EvalkitError
from evalkit.models.presets import DTYPE_BYTES, config_namespace
from evalkit.planning.parallel import Parallel, kv_heads_per_rank, stage_layers

VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE
UNQUANTIZED_BYTES = 2  # BF16: embeddings, LM head, norms and router of a quantized checkpoint


@dataclass(frozen=True)
class Architecture:
    """The parts of a decoder-only model that size its weights (every field from its config)."""

    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    # MLA (kv_lora > 0)
    q_lora: int = 0
    kv_lora: int = 0
    qk_nope: int = 0
    qk_rope: int = 0
    v_head: int = 0
    # MoE (experts > 0)
    experts: int = 0
    topk: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    dense_layers: tuple[int, ...] = field(default=())  # layers with a dense MLP in an MoE model

    @property
    def is_mla(self) -> bool:
        return self.kv_lora > 0

    def is_moe_layer(self, layer: int) -> bool:
        return self.experts > 0 and layer not in self.dense_layers

    @classmethod
    def from_config(cls, fields: dict) -> Architecture | None:
        """The architecture, or None when the config lacks a part (intermediate size, vocabulary)."""
        c = vars(config_namespace(fields))
        needed = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
        if any(not isinstance(c.get(k), int) for k in needed):
            return None
        heads = c["num_attention_heads"]
        hidden = c["hidden_size"]
        kv_lora = int(c.get("kv_lora_rank") or 0)
        experts = int(c.get("n_routed_experts") or c.get("num_experts") or c.get("num_local_experts") or 0)
        expert_inter = int(c.get("moe_intermediate_size") or (c["intermediate_size"] if experts else 0))
        shared = int(c.get("shared_expert_intermediate_size") or expert_inter * int(c.get("n_shared_experts") or 0))
        first_dense = int(c.get("first_k_dense_replace") or 0)
        dense = set(range(first_dense)) | set(c.get("mlp_only_layers") or ())
        step = int(c.get("moe_layer_freq") or c.get("decoder_sparse_step") or 1) if experts else 1
        dense |= {i for i in range(c["num_hidden_layers"]) if step > 1 and i % step}
        return cls(
            model_type=str(c.get("model_type", "unknown")),
            hidden=hidden,
            layers=c["num_hidden_layers"],
            heads=heads,
            kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or hidden // heads),
            intermediate=c["intermediate_size"],
            vocab=c["vocab_size"],
            tied=bool(c.get("tie_word_embeddings", False)),
            qkv_bias=bool(c.get("attention_bias") or c.get("model_type") == "qwen2"),
            qk_norm=c.get("model_type") in ("qwen3", "qwen3_moe"),
            q_lora=int(c.get("q_lora_rank") or 0),
            kv_lora=kv_lora,
            qk_nope=int(c.get("qk_nope_head_dim") or 0),
            qk_rope=int(c.get("qk_rope_head_dim") or 0),
            v_head=int(c.get("v_head_dim") or 0),
            experts=experts,
            topk=int(c.get("num_experts_per_tok") or 0),
            expert_intermediate=expert_inter,
            shared_intermediate=shared,
            dense_layers=tuple(sorted(dense)) if experts else (),
        )


@dataclass(frozen=True)
class RankWeights:
    """Parameters of one rank of one stage: ``linear`` (decoder linears, in the checkpoint dtype) and
    ``other`` (embeddings, LM head, norms, router: BF16 in a quantized checkpoint), and by part."""

    linear: int
    other: int
    parts: dict

    def nbytes(self, dtype: str, block: int | None = None) -> int:
        per = DTYPE_BYTES[dtype]
        other = per if per >= 2 else UNQUANTIZED_BYTES
        scales = self.linear * 4 // (block * block) if block else 0  # one float32 per block x block tile
        return int(self.linear * per) + int(self.other * other) + scales


def _divide(n: int, by: int, what: str, flag: str = "--tensor-parallel") -> int:
    if n % by:
        raise EvalkitError(f"{flag} {by} does not divide the model's {what} ({n}): use a size that divides it")
    return n // by


def attention_params(a: Architecture, tp: int) -> tuple[int, int]:
    """(linear, other) parameters of one layer's attention on one TP rank."""
    h = a.hidden
    heads = _divide(a.heads, tp, "attention heads")
    if a.is_mla:
        qk = a.qk_nope + a.qk_rope
        q = (h * a.q_lora + a.q_lora * heads * qk) if a.q_lora else h * heads * qk
        kv_a = h * (a.kv_lora + a.qk_rope)
        kv_b = a.kv_lora * heads * (a.qk_nope + a.v_head)
        o = heads * a.v_head * h
        return q + kv_a + kv_b + o, a.q_lora + a.kv_lora + 2 * h
    kv = kv_heads_per_rank(a.kv_heads, tp)
    qkv = h * (heads + 2 * kv) * a.head_dim
    bias = (heads + 2 * kv) * a.head_dim if a.qkv_bias else 0
    norms = 2 * h + (2 * a.head_dim if a.qk_norm else 0)
    return qkv + heads * a.head_dim * h, bias + norms


def mlp_params(a: Architecture, layer: int, par: Parallel) -> tuple[int, int]:
    """(linear, other) parameters of one layer's MLP or MoE block on the fullest rank."""
    h = a.hidden
    if not a.is_moe_layer(layer):
        return 3 * h * _divide(a.intermediate, par.tp, "intermediate size"), 0
    if par.expert_parallel:
        routed = math.ceil(a.experts / par.ep) * 3 * h * a.expert_intermediate
    else:
        flat = par.tp * par.dp
        routed = a.experts * 3 * h * _divide(a.expert_intermediate, flat, "expert intermediate size", "TP x DP")
    sequence_parallel = par.expert_parallel and par.tp > 1 and par.dp > 1
    shared_tp = 1 if sequence_parallel else par.tp
    shared = 3 * h * _divide(a.shared_intermediate, shared_tp, "shared-expert size") if a.shared_intermediate else 0
    return routed + shared, a.experts * h + a.experts  # router weight (BF16) and its bias


def padded_vocab(a: Architecture) -> int:
    return math.ceil(a.vocab / VOCAB_PADDING) * VOCAB_PADDING


def rank_weights(a: Architecture, par: Parallel, stage: int = 0) -> RankWeights:
    """Parameters the fullest rank of pipeline ``stage`` holds."""
    if par.expert_parallel and not a.experts:
        raise EvalkitError(
            f"--expert-parallel {par.ep}: {a.model_type} has no experts (a dense model): drop --expert-parallel"
        )
    layers = stage_layers(a.layers, par.pp)[stage]
    parts: dict[str, int] = {}
    linear = other = 0
    for layer in layers:
        for name, (lin, oth) in (("attention", attention_params(a, par.tp)), ("mlp", mlp_params(a, layer, par))):
            key = name
            if name == "mlp" and a.experts:
                key = "experts" if a.is_moe_layer(layer) else "dense mlp"
            parts[key] = parts.get(key, 0) + lin + oth
            linear += lin
            other += oth
    vocab_rows = _divide(padded_vocab(a), par.tp, "padded vocabulary")
    first, last = stage == 0, stage == par.pp - 1
    if first or (last and a.tied):
        parts["embedding"] = vocab_rows * a.hidden
        other += vocab_rows * a.hidden
    if last:
        head = 0 if (a.tied and first) else vocab_rows * a.hidden
        parts["lm head + final norm"] = head + a.hidden
        other += head + a.hidden
    return RankWeights(linear, other, parts)


def model_params(a: Architecture) -> int:
    """All parameters of the model, each once (TP 1, no padding of the vocabulary)."""
    whole = rank_weights(a, Parallel())
    pad = (padded_vocab(a) - a.vocab) * a.hidden * (1 if a.tied else 2)
    return whole.linear + whole.other - pad
