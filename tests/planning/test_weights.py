"""Weights per rank, against parameter counts written out by hand from the published configs."""

from __future__ import annotations

import pytest

from evalkit.errors import EvalkitError
from evalkit.models.presets import PRESETS
from evalkit.planning.parallel import Parallel
from evalkit.planning.weights import Architecture, model_params, rank_weights


def arch(name: str) -> Architecture:
    return Architecture.from_config(PRESETS[name]["config"])


@pytest.mark.parametrize(
    "name,published,tolerance",
    [
        ("llama-3.1-8b", 8_030_261_248, 0),  # the count Meta's safetensors index gives
        ("smollm2-135m", 134_515_008, 0),  # counted on the meta device (the preset's source)
        ("llama-3.1-70b", 70.6e9, 0.001),
        ("qwen3-32b", 32.8e9, 0.002),
        ("deepseek-v3", 671e9, 0.001),  # without the MTP layer, which vLLM loads only for speculative decoding
        ("kimi-k2", 1.04e12, 0.014),  # the preset's "1.04T"; its parts add to 1.026T
    ],
)
def test_parts_add_up_to_the_published_parameter_count(name, published, tolerance):
    assert abs(model_params(arch(name)) - published) <= tolerance * published


def test_llama_70b_per_rank_by_hand():
    h, inter, vocab, layers = 8192, 28672, 128256, 80
    for tp in (2, 8):
        heads, kv = 64 // tp, 8 // tp
        attention = h * (heads + 2 * kv) * 128 + heads * 128 * h
        mlp = 3 * h * (inter // tp)
        norms = 2 * h
        embedding = (vocab // tp) * h  # 128256 is a multiple of 64: no padding
        total = layers * (attention + mlp + norms) + embedding + embedding + h
        w = rank_weights(arch("llama-3.1-70b"), Parallel(tp=tp))
        assert w.linear + w.other == total
        assert w.nbytes("bf16") == 2 * total
    assert rank_weights(arch("llama-3.1-70b"), Parallel(tp=2)).nbytes("bf16") == 70_555_025_408
    assert rank_weights(arch("llama-3.1-70b"), Parallel(tp=8)).nbytes("bf16") == 17_640_734_720


def kimi_by_hand(tp: int, dp: int, ep: int) -> tuple[int, int]:
    """(decoder linear parameters, other parameters) of Kimi K2's fullest rank, written out."""
    h, heads = 7168, 64 // tp
    q = h * 1536 + 1536 * heads * (128 + 64)  # q_a (replicated) + q_b (column parallel)
    kv = h * (512 + 64) + 512 * heads * (128 + 128)  # kv_a_proj_with_mqa (replicated) + kv_b (column)
    o = heads * 128 * h
    attention_linear, attention_other = q + kv + o, 1536 + 512 + 2 * h  # q_a/kv_a norms + 2 layer norms
    dense = 3 * h * (18432 // tp)
    expert = 3 * h * 2048
    routed = -(-384 // ep) * expert if ep > 1 else 384 * expert // (tp * dp)
    shared = expert // (1 if (ep > 1 and tp > 1 and dp > 1) else tp)
    router = 384 * h + 384
    vocab_rows = 163840 // tp
    linear = 61 * attention_linear + dense + 60 * (routed + shared)
    other = 61 * attention_other + 60 * router + vocab_rows * h + vocab_rows * h + h
    return linear, other


@pytest.mark.parametrize("tp,dp,ep", [(8, 1, 1), (1, 16, 16), (1, 8, 8), (2, 8, 16), (2, 4, 1)])
def test_kimi_k2_per_rank_by_hand(tp, dp, ep):
    w = rank_weights(arch("kimi-k2"), Parallel(tp=tp, dp=dp, ep=ep))
    linear, other = kimi_by_hand(tp, dp, ep)
    assert (w.linear, w.other) == (linear, other)
    # FP8 linears + one float32 per 128x128 block + BF16 for the rest
    assert w.nbytes("fp8", 128) == linear + linear * 4 // (128 * 128) + 2 * other


def test_kimi_k2_tp8_and_ep16_bytes():
    """The figures `capacity` prints for 8 x H200 TP 8 and 16 x H200 DP 16 EP 16."""
    assert rank_weights(arch("kimi-k2"), Parallel(tp=8)).nbytes("fp8", 128) == 129_745_696_816
    assert rank_weights(arch("kimi-k2"), Parallel(dp=16, ep=16)).nbytes("fp8", 128) == 77_672_806_576


def test_data_parallel_replicates_and_expert_parallel_splits_experts():
    a = arch("kimi-k2")
    one, dp8 = rank_weights(a, Parallel()), rank_weights(a, Parallel(dp=8))
    ep8 = rank_weights(a, Parallel(dp=8, ep=8))
    expert = 3 * 7168 * 2048
    assert one.parts["attention"] == dp8.parts["attention"] == ep8.parts["attention"]  # attention replicated
    assert one.parts["experts"] - ep8.parts["experts"] == 60 * (384 - 48) * expert
    assert dp8.parts["experts"] == 60 * (384 * expert // 8 + expert + 384 * 7168 + 384)  # slices of every expert
    assert rank_weights(arch("deepseek-v3"), Parallel(dp=3, ep=3)).parts["experts"] == 58 * (
        86 * expert + expert + 256 * 7168 + 256
    )  # 256 experts over 3 ranks: 86 on the fullest


def test_pipeline_stages_hold_their_layers_and_the_embeddings_at_the_ends():
    a = arch("llama-3.1-70b")
    first, last = (rank_weights(a, Parallel(tp=8, pp=2), s) for s in (0, 1))
    assert "embedding" in first.parts and "lm head + final norm" not in first.parts
    assert "lm head + final norm" in last.parts and "embedding" not in last.parts
    whole = rank_weights(a, Parallel(tp=8))
    assert first.linear + last.linear == whole.linear and first.other + last.other == whole.other
    tied = Architecture.from_config(PRESETS["smollm2-135m"]["config"])
    assert "embedding" in rank_weights(tied, Parallel(pp=2), 1).parts  # a tied head needs the table on the last stage
    assert rank_weights(tied, Parallel()).parts["lm head + final norm"] == 576  # tied: the final norm only


@pytest.mark.parametrize(
    "name,par,message",
    [
        ("llama-3.1-70b", Parallel(dp=2, ep=2), "has no experts"),
        ("llama-3.1-70b", Parallel(tp=3), "--tensor-parallel 3 does not divide the model's attention heads"),
        ("kimi-k2", Parallel(tp=5), "--tensor-parallel 5 does not divide"),
    ],
)
def test_shapes_vllm_refuses_are_one_line(name, par, message):
    with pytest.raises(EvalkitError, match=message.replace("(", r"\(")):
        rank_weights(arch(name), par)


def test_configs_without_parts_give_none():
    assert Architecture.from_config({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64}) is None
