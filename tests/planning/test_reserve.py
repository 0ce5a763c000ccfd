"""The activation and CUDA graph reserve, against the formula computed plainly, and vLLM's batch defaults."""

from __future__ import annotations

import pytest

from evalkit.models.presets import PRESETS
from evalkit.planning.parallel import Parallel
from evalkit.planning.reserve import Batch, capture_sizes, estimate, serve_defaults
from evalkit.planning.weights import Architecture

GIB, MIB = 2**30, 2**20


@pytest.mark.parametrize(
    "memory,name,want",
    [
        (139.81 * GIB, "NVIDIA H200", (8192, 1024)),
        (79.11 * GIB, "NVIDIA H100 80GB HBM3", (8192, 1024)),
        (79.14 * GIB, "NVIDIA A100-SXM4-80GB", (2048, 256)),  # A100 kept on the small tier (vLLM PR #17885)
        (178.35 * GIB, "NVIDIA B200", (16384, 1024)),
        (44.39 * GIB, "NVIDIA L40S", (2048, 256)),
    ],
)
def test_vllm_serve_batch_defaults(memory, name, want):
    assert serve_defaults(int(memory), name) == want


def test_cuda_graph_sizes_as_vllm_captures_them():
    hopper = capture_sizes(Batch(8192, 1024, 512))
    assert hopper[:5] == [1, 2, 4, 8, 16] and hopper[-3:] == [480, 496, 512]
    assert len(hopper) == 3 + len(range(8, 256, 8)) + len(range(256, 513, 16)) == 51
    assert len(capture_sizes(Batch(16384, 1024, 1024))) == 3 + 31 + len(range(256, 1025, 16)) == 83
    assert capture_sizes(Batch(2048, 16, 512))[-1] == 32  # 2 x max_num_seqs caps it
    assert capture_sizes(Batch(100, 1024, 512))[-1] == 100  # max_num_batched_tokens is captured when below


def plain_reserve(h, width, tokens, seqs, vocab, graphs_at=512, n_sizes=51):
    forward = 2 * tokens * (2 * h + width)
    sampler = min(tokens, seqs) * vocab * 14
    graphs = 2 * graphs_at * (2 * h + width) + (n_sizes - 1 + n_sizes - 1) * MIB
    return forward, sampler, max(forward, sampler) + graphs


def test_llama_70b_tp8_reserve_by_hand():
    a = Architecture.from_config(PRESETS["llama-3.1-70b"]["config"])
    r = estimate(a, Parallel(tp=8), Batch(8192, 1024, 512))
    attention = (8 + 2 * 1) * 128 + 8 * 128  # q, k, v and the output of 8 heads and 1 KV head
    mlp = 3 * 28672 // 8  # gate/up output (2 x I/TP) and the activation (I/TP)
    forward, sampler, total = plain_reserve(8192, max(attention, mlp), 8192, 1024, 128256)
    assert (r.forward, r.sampler, r.total) == (forward, sampler, total)
    assert (r.forward, r.sampler, r.total) == (444_596_224, 1_838_678_016, 1_971_322_880)


def test_kimi_k2_moe_workspaces_by_hand():
    a = Architecture.from_config(PRESETS["kimi-k2"]["config"])
    h = 7168
    # TP 8: each rank runs a 256-wide slice of every expert on its own 8,192 tokens
    tp8 = estimate(a, Parallel(tp=8), Batch(8192, 1024, 512))
    moe = 8 * (max(256, h) + max(512, h)) + 3 * 2048 // 8
    assert (tp8.forward, tp8.sampler, tp8.total) == plain_reserve(h, moe, 8192, 1024, 163840)
    assert tp8.total == 2_586_574_848
    # DP 16 x EP 16: whole experts, but the MoE gathers all 16 ranks' tokens and their hidden states
    dp16 = estimate(a, Parallel(dp=16, ep=16), Batch(8192, 1024, 512))
    moe = 16 * (8 * (max(2048, h) + max(4096, h)) + h) + 3 * 2048
    assert (dp16.forward, dp16.sampler, dp16.total) == plain_reserve(h, moe, 8192, 1024, 163840)
    assert dp16.total == 34_401_681_408
    # a smaller batch shrinks it in proportion
    small = estimate(a, Parallel(dp=16, ep=16), Batch(1024, 256, 512))
    assert small.forward == dp16.forward // 8 and small.sampler == 256 * 163840 * 14


def test_only_the_last_pipeline_stage_samples():
    a = Architecture.from_config(PRESETS["llama-3.1-70b"]["config"])
    first, last = (estimate(a, Parallel(tp=8, pp=2), Batch(8192, 1024, 512), s) for s in (0, 1))
    assert first.sampler == 0 and last.sampler == 1024 * 128256 * 14 and first.forward == last.forward
