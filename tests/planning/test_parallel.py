"""Deployment shapes: the parallel sizes vLLM accepts, its pipeline split, and the KV a rank stores."""

from __future__ import annotations

import pytest

from evalkit.errors import EvalkitError
from evalkit.kv.memory import bytes_per_token
from evalkit.kv.scheme import Scheme, parse_scheme
from evalkit.models.info import kv_layout
from evalkit.models.presets import PRESETS, config_namespace
from evalkit.planning.parallel import Parallel, kv_heads_per_rank, make_parallel, rank_layout, stage_layers


def test_gpus_alone_read_as_tensor_parallel_and_checked_against_the_product():
    assert make_parallel(gpus=8) == (Parallel(8, 1, 1, 1), make_parallel(gpus=8)[1])
    assert "read as --tensor-parallel 8" in make_parallel(gpus=8)[1]
    assert make_parallel(tp=2, dp=4, ep=8, gpus=8) == (Parallel(2, 1, 4, 8), None)
    assert make_parallel(tp=2, pp=2) == (Parallel(2, 2, 1, 1), None)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"tp": 8, "gpus": 16}, "--gpus 16 but --tensor-parallel 8 x --pipeline-parallel 1 x --data-parallel 1 = 8"),
        ({"tp": 2, "dp": 4, "ep": 4}, "so it is 1 (off) or --tensor-parallel x --data-parallel = 8"),
        ({"tp": 0}, "--tensor-parallel must be at least 1, got 0"),
        ({"dp": -2}, "--data-parallel must be at least 1"),
    ],
)
def test_bad_sizes_are_one_line(kwargs, message):
    with pytest.raises(EvalkitError) as exc:
        make_parallel(**kwargs)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_pipeline_split_as_vllm_get_pp_indices():
    """Even split; the remainder to the stages before the last, the last-but-one first."""
    assert [len(r) for r in stage_layers(80, 2)] == [40, 40]
    assert [len(r) for r in stage_layers(61, 2)] == [31, 30]  # 1 left over: partitions[-2] += 1
    assert [len(r) for r in stage_layers(61, 4)] == [15, 15, 16, 15]  # a middle stage takes it
    assert [len(r) for r in stage_layers(62, 4)] == [15, 16, 16, 15]
    assert [len(r) for r in stage_layers(7, 3)] == [2, 3, 2]
    assert [(r.start, r.stop) for r in stage_layers(10, 3)] == [(0, 3), (3, 7), (7, 10)]
    with pytest.raises(EvalkitError, match="more stages than the model's 4 layers"):
        stage_layers(4, 5)


@pytest.mark.parametrize("tp,heads", [(1, 8), (2, 4), (4, 2), (8, 1), (16, 1), (32, 1)])
def test_gqa_kv_heads_shard_up_to_their_count_then_replicate(tp, heads):
    assert kv_heads_per_rank(8, tp) == heads == max(1, 8 // tp)


@pytest.mark.parametrize("tp", [3, 5, 12])
def test_kv_heads_and_tp_must_divide_one_another(tp):
    with pytest.raises(EvalkitError, match=f"--tensor-parallel {tp}"):
        kv_heads_per_rank(8, tp)


def test_rank_layout_shards_gqa_heads_and_keeps_the_whole_mla_latent():
    llama = kv_layout(config_namespace(PRESETS["llama-3.1-70b"]["config"]))
    kimi = kv_layout(config_namespace(PRESETS["kimi-k2"]["config"]))
    bf16, fp8 = Scheme(), parse_scheme("fp8_e4m3/tensor/unit")
    # Llama-3.1-70B: 80 layers x K and V x heads x 128 x 2 bytes
    assert bytes_per_token(rank_layout(llama, Parallel(tp=1), 0), bf16) == 80 * 2 * 8 * 128 * 2 == 327_680
    assert bytes_per_token(rank_layout(llama, Parallel(tp=2), 0), bf16) == 80 * 2 * 4 * 128 * 2
    assert bytes_per_token(rank_layout(llama, Parallel(tp=8), 0), bf16) == 80 * 2 * 1 * 128 * 2 == 40_960
    assert bytes_per_token(rank_layout(llama, Parallel(tp=16), 0), bf16) == 40_960  # one head each, replicated x2
    # pipeline: the stage's layers only
    assert bytes_per_token(rank_layout(llama, Parallel(tp=8, pp=2), 1), bf16) == 40 * 2 * 1 * 128 * 2
    # Kimi K2: 61 layers x (512 latent + 64 RoPE key), on every rank whatever the TP
    for tp in (1, 8, 16):
        assert bytes_per_token(rank_layout(kimi, Parallel(tp=tp), 0), bf16) == 61 * 576 * 2 == 70_272
        assert bytes_per_token(rank_layout(kimi, Parallel(tp=tp), 0), fp8) == 61 * 576 == 35_136
    assert bytes_per_token(rank_layout(kimi, Parallel(tp=8, pp=4), 2), bf16) == 16 * 576 * 2
