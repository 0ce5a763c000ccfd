"""The memory vLLM keeps out of the KV cache besides the weights: activations and CUDA graphs, estimated.

vLLM 0.33 measures it at start-up (``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``)::

    KV cache = ceil(total memory x gpu_memory_utilization) - (weights + non-torch growth + transient peak)
               - CUDA graph estimate

- the transient peak is the torch allocator's peak during ``profile_run`` (``gpu_model_runner.py``): one
  forward of ``max_num_batched_tokens`` dummy tokens spread over ``min(tokens, max_num_seqs)``
  requests, then the sampler on one row of logits per request;
- the CUDA graph estimate (``profile_cudagraph_memory``, on by default,
  ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1``) captures the largest graph of each mode (its memory
  pool holds that forward's activations, which the smaller graphs reuse) and a second one, and
  counts the second's cost, at least 1 MiB, for every further graph.

evalkit cannot run the profile, so it sizes the same two passes from the model (:func:`estimate`), per
rank, in the model dtype (BF16, 2 bytes):

    forward(n)  = 2 x n x (2 x hidden + max(attention, mlp))            residual + hidden states, widest block
      attention = (q_heads + 2 kv_heads) x head_dim + q_heads x head_dim    per token (MLA: q, k, v and output
                                                                            of the up-projection, 2 x (nope+rope) + 2 x v per head)
      mlp       = 3 x intermediate / TP                                     gate/up output and the activation
      MoE       = M/n x (top_k x (max(I_e, hidden) + max(2 I_e, hidden))   fused-MoE workspaces
                  + hidden if DP > 1) + 3 x shared_intermediate / TP        (TritonExperts.workspace_shapes), I_e the
                                                                            expert slice a rank runs; M = n x DP tokens:
                                                                            data-parallel MoE gathers every DP rank's
                                                                            tokens (and their hidden states)
    sampler     = min(n, max_num_seqs) x vocab x 14                         BF16 logits, their float32 copy, the float32
                                                                            probabilities and exponential noise (last stage)
    graphs      = forward(largest capture size) + 1 MiB x (graphs - 1, per mode)
    reserve     = max(forward(max_num_batched_tokens), sampler) + graphs

Not counted: memory outside torch that grows during start-up (NCCL and custom all-reduce buffers,
cuBLAS workspaces: typically a few hundred MiB per rank), and the per-graph cost above vLLM's 1 MiB floor.
``capacity --reserve SIZE`` replaces the estimate with a figure read from vLLM's own log
("Available KV cache memory", the profiler's non-KV total).

Batch defaults as vLLM's ``EngineArgs.get_batch_defaults`` for ``vllm serve`` (:func:`serve_defaults`):
8,192 batched tokens and 1,024 sequences on a GPU of 70 GiB or more (not an A100), 16,384 and 1,024 at
160 GiB or more, 2,048 and 256 otherwise. CUDA graph sizes as ``VllmConfig._set_cudagraph_sizes``
(:func:`capture_sizes`): 1, 2, 4, multiples of 8 below 256, then multiples of 16, up to
``min(2 x max_num_seqs, 512)`` (1,024 on SM100-family GPUs) and ``max_num_batched_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass

from evalkit.planning.parallel import Parallel, kv_heads_per_rank, stage_layers
from evalkit.planning.weights import Architecture

ACT_BYTES = 2  # the model dtype activations run in (BF16)
SAMPLER_BYTES = 14  # per logit: BF16 logits + float32 copy + float32 probabilities + float32 exponential noise
GRAPH_FLOOR = 2**20  # vLLM's least per-graph cost
GIB = 2**30


@dataclass(frozen=True)
class Batch:
    """The batch vLLM profiles: ``max_num_batched_tokens`` and ``max_num_seqs``, and its CUDA graph ceiling."""

    tokens: int
    seqs: int
    graph_ceiling: int = 512  # 1024 on SM100-family GPUs

    @property
    def requests(self) -> int:
        return min(self.tokens, self.seqs)


def serve_defaults(memory: int, name: str = "") -> tuple[int, int]:
    """``vllm serve``'s (max_num_batched_tokens, max_num_seqs) for a GPU of ``memory`` bytes."""
    if memory >= 160 * GIB:
        return 16384, 1024
    if memory >= 70 * GIB and "a100" not in name.lower():
        return 8192, 1024
    return 2048, 256


def capture_sizes(batch: Batch) -> list[int]:
    """The CUDA graph batch sizes vLLM captures by default."""
    ceiling = min(batch.seqs * 2, batch.graph_ceiling, batch.tokens)
    sizes = [s for s in (1, 2, 4) if s <= ceiling]
    sizes += list(range(8, min(ceiling + 1, 256), 8)) + list(range(256, ceiling + 1, 16))
    if batch.tokens <= ceiling and batch.tokens not in sizes:
        sizes.append(batch.tokens)
    return sorted(sizes)


@dataclass(frozen=True)
class Reserve:
    forward: int  # bytes: the forward of max_num_batched_tokens
    sampler: int  # bytes: the sampler pass (0 off the last stage)
    graphs: int  # bytes: the CUDA graph estimate
    graph_count: int
    largest_graph: int
    width: int = 0  # activation values per token at the widest point of the forward
    requests: int = 0  # rows of logits the sampler pass takes
    floor_graphs: int = 0  # graphs counted at vLLM's 1 MiB floor
    vocab: int = 0

    @property
    def activations(self) -> int:
        return max(self.forward, self.sampler)

    @property
    def total(self) -> int:
        return self.activations + self.graphs


def per_token(a: Architecture, par: Parallel, layers, tokens_factor: int = 1) -> int:
    """Activation elements per token at the widest point of a forward on one rank of a stage."""
    heads = a.heads // par.tp
    if a.is_mla:
        attention = heads * (2 * (a.qk_nope + a.qk_rope) + 2 * a.v_head) + a.q_lora + a.kv_lora + a.qk_rope
    else:
        attention = (heads + 2 * kv_heads_per_rank(a.kv_heads, par.tp)) * a.head_dim + heads * a.head_dim
    widest = attention
    if any(not a.is_moe_layer(i) for i in layers):
        widest = max(widest, 3 * a.intermediate // par.tp)
    if any(a.is_moe_layer(i) for i in layers):
        slice_ = a.expert_intermediate if par.expert_parallel else a.expert_intermediate // (par.tp * par.dp)
        gathered = par.dp if par.dp > 1 else 1
        sequence_parallel = par.expert_parallel and par.tp > 1 and par.dp > 1
        shared = 3 * a.shared_intermediate // (1 if sequence_parallel else par.tp)
        dispatched = a.hidden if par.dp > 1 else 0  # the gathered hidden states
        moe = gathered * (a.topk * (max(slice_, a.hidden) + max(2 * slice_, a.hidden)) + dispatched) + shared
        widest = max(widest, moe)
    return 2 * a.hidden + widest


def estimate(a: Architecture, par: Parallel, batch: Batch, stage: int = 0) -> Reserve:
    """The activation and CUDA graph reserve of one rank of pipeline ``stage`` (see the module docstring)."""
    layers = stage_layers(a.layers, par.pp)[stage]
    width = per_token(a, par, layers)
    forward = ACT_BYTES * batch.tokens * width
    sampler = batch.requests * a.vocab * SAMPLER_BYTES if stage == par.pp - 1 else 0
    sizes = capture_sizes(batch)
    full = [s for s in sizes if s <= batch.seqs]  # FULL decode graphs: uniform decode batches
    largest = max(sizes)
    floor = (len(sizes) - 1) + max(len(full) - 1, 0)
    graphs = ACT_BYTES * largest * width + GRAPH_FLOOR * floor
    requests = batch.requests if stage == par.pp - 1 else 0
    return Reserve(forward, sampler, graphs, len(sizes) + len(full), largest, width, requests, floor, a.vocab)
