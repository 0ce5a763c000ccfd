"""``capacity --vllm-version``: each release's block size and memory default, held to counts made by hand.

The figures are recomputed here from the plain rules (vLLM 0.33: ``ceil(memory x 0.92)`` less weights and
reserve, blocks of 16; 0.34: ``min(memory x 1.0, memory - max(1 GiB, 0.75 x peak))`` less the same, blocks of
64), not read back from evalkit's own arithmetic.
"""

from __future__ import annotations

import json
import math

import pytest

from evalkit.cli import main
from evalkit.planning.vllm_sizing import SIZING, vllm_sizing

GIB = 2**30


def _json(capsys, *argv) -> dict:
    assert main(["capacity", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_releases_defaults_as_their_source_sets_them():
    assert [(s.version, s.block_size, s.utilization, s.extensible) for s in SIZING.values()] == [
        ("0.32", 16, 0.92, False),
        ("0.33", 16, 0.92, False),
        ("0.34", 64, 1.0, True),
    ]
    assert vllm_sizing("0.34.0") is SIZING["0.34"]
    assert SIZING["0.34"].margin(4 * GIB) == 3 * GIB and SIZING["0.34"].margin(GIB) == GIB
    assert SIZING["0.33"].margin(4 * GIB) == 0


def test_llama_8b_on_an_h100_by_hand(capsys):
    """The count in the note: llama-3.1-8b, one H100, 32k context, bf16 (auto) and fp8 per-tensor."""
    args = [
        "--preset",
        "llama-3.1-8b",
        "--gpu",
        "h100",
        "--context",
        "32k",
        "--schemes",
        "auto,fp8_e4m3/tensor/dynamic",
    ]
    old, new = _json(capsys, *args, "--vllm-version", "0.33"), _json(capsys, *args, "--vllm-version", "0.34")
    memory = old["gpu_memory"]
    assert memory == new["gpu_memory"] == 84_943_715_697  # the H100's 79.11 GiB as CUDA reports it
    stage = old["stages"][0]
    weights, est = stage["weights_bytes"], stage["reserve"]
    assert weights == 16_060_522_496  # 8.03e9 parameters in bf16, as the table splits them
    peak = max(est["forward"], est["sampler"])
    assert (est["forward"], est["sampler"], est["graphs"]) == (
        2 * 8192 * 51200,  # 8,192 batched tokens x 51,200 values x 2 B
        1024 * 128256 * 14,  # 1,024 sequences x the vocabulary x 14 B
        2 * 512 * 51200 + 100 * 2**20,  # the largest graph's forward + 100 graphs at 1 MiB
    )
    reserve = peak + est["graphs"]
    per_token = {
        "auto": 32 * 2 * 8 * 128 * 2,
        "fp8_e4m3/tensor/dynamic": 32 * 2 * 8 * 128,
    }  # layers x K,V x heads x dim x B
    budget_033 = math.ceil(memory * 0.92) - weights - reserve
    margin = max(GIB, int(0.75 * peak))
    budget_034 = min(memory, memory - margin) - weights - reserve
    assert (budget_033, budget_034) == (60_091_731_530, 65_508_220_273)
    assert new["stages"][0]["margin_bytes"] == margin == 1_379_008_512
    for report, budget, block in ((old, budget_033, 16), (new, budget_034, 64)):
        assert report["stages"][0]["kv_budget"] == budget
        for row in report["rows"]:
            rate = per_token[row["scheme"]]
            assert row["tokens"] == block * (budget // (block * rate))
            assert row["sequences"] == budget // (math.ceil(32768 / block) * block * rate)
    got = {r["scheme"]: (r["tokens"], r["sequences"]) for r in old["rows"]}
    assert got == {"auto": (458_448, 13), "fp8_e4m3/tensor/dynamic": (916_912, 27)}
    got = {r["scheme"]: (r["tokens"], r["sequences"]) for r in new["rows"]}
    assert got == {"auto": (499_776, 15), "fp8_e4m3/tensor/dynamic": (999_552, 30)}


@pytest.fixture
def small_config(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}
    cfg |= {"hidden_size": 256, "max_position_embeddings": 4096}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_blocks_and_memory_default_with_every_input_given(capsys, small_config):
    base = ["--config", str(small_config), "--gpu-memory", "80GiB", "--weights-bytes", "16GiB", "--reserve", "2GiB"]
    base += ["--context", "1000", "--schemes", "auto"]
    rate = 4 * 2 * 2 * 64 * 2  # 4 layers x K,V x 2 KV heads x head_dim 64 x 2 B = 2,048 B per token
    memory = 80 * GIB
    # the same share given: only the blocks differ (16 x 63 = 1,008 tokens a sequence vs 64 x 16 = 1,024)
    b16 = _json(capsys, *base, "--utilization", "0.9", "--vllm-version", "0.33")
    budget = math.ceil(memory * 0.9) - 16 * GIB - 2 * GIB
    assert b16["rows"][0]["sequences"] == budget // (1008 * rate)
    assert b16["rows"][0]["tokens"] == 16 * (budget // (16 * rate))
    # 0.34 at 0.9: min(ceil(memory x 0.9), memory - max(1 GiB, 0.75 x 2 GiB)) is the 0.9 share
    b64 = _json(capsys, *base, "--utilization", "0.9", "--vllm-version", "0.34")
    assert b64["stages"][0]["kv_budget"] == budget
    assert b64["rows"][0]["sequences"] == budget // (1024 * rate) < b16["rows"][0]["sequences"]
    assert b64["rows"][0]["tokens"] == 64 * (budget // (64 * rate))
    # the releases' own defaults: 0.92 and the whole GPU less the margin
    d33 = _json(capsys, *base, "--vllm-version", "0.33")
    d34 = _json(capsys, *base, "--vllm-version", "0.34")
    assert (d33["utilization"], d34["utilization"]) == (0.92, 1.0)
    assert d33["stages"][0]["kv_budget"] == math.ceil(memory * 0.92) - 18 * GIB
    assert d34["stages"][0]["kv_budget"] == memory - int(1.5 * GIB) - 18 * GIB
    # without --vllm-version: the plain count (0.9, no blocks)
    plain = _json(capsys, *base)
    assert plain["utilization"] == 0.9 and plain["block_size"] is None
    assert plain["rows"][0]["sequences"] == budget // (1000 * rate)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--vllm-version", "0.31"], "--vllm-version 0.31: evalkit knows how vLLM 0.32, 0.33, 0.34 size"),
        (["--engine", "vllm", "--vllm-version", "0.34"], "--vllm-version sizes a counted deployment"),
    ],
)
def test_bad_version_is_one_line(capsys, small_config, extra, message):
    code = main(["capacity", "--config", str(small_config), "--gpu-memory", "80GiB", "--weights-bytes", "1GiB", *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err, err
