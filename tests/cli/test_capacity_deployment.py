"""`capacity` per rank and per deployment: the issue-40 commands against hand counts written out here.

Every figure below is plain integer arithmetic from the published configs (hidden size, heads, experts,
vocabulary) and the H200's memory as CUDA reports it (139.81 GiB), following the formulas of
docs/sizing.md, not the code's own output.
"""

from __future__ import annotations

import json
import math

import pytest

from evalkit.cli import main

GIB, MIB = 2**30, 2**20
H200 = round(139.81 * GIB)  # torch: "GPU 0 has a total capacity of 139.81 GiB"
USABLE = math.ceil(H200 * 0.9)  # vLLM's request_memory: ceil(total x gpu_memory_utilization)


def run_json(capsys, *argv):
    code = main(["capacity", *argv, "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def rows(data) -> dict:
    return {r["scheme"]: r for r in data["rows"]}


def kimi_tp8_by_hand():
    """Kimi K2 on 8 x H200, TP 8: weights, reserve and KV budget of one rank, in bytes."""
    h = 7168
    attention = h * 1536 + 1536 * 8 * 192 + h * 576 + 512 * 8 * 256 + 8 * 128 * h  # 8 of 64 heads per rank
    linear = 61 * attention + 3 * h * (18432 // 8) + 60 * (384 * 3 * h * (2048 // 8) + 3 * h * (2048 // 8))
    other = 61 * (1536 + 512 + 2 * h) + 60 * (384 * h + 384) + 2 * (163840 // 8) * h + h
    weights = linear + linear * 4 // (128 * 128) + 2 * other  # FP8 + float32 per 128x128 block + BF16 rest
    width = 2 * h + 8 * (max(256, h) + max(512, h)) + 3 * 2048 // 8  # fused-MoE workspaces per token
    reserve = max(2 * 8192 * width, 1024 * 163840 * 14) + 2 * 512 * width + 100 * MIB
    return weights, reserve, USABLE - weights - reserve


def test_kimi_k2_on_8_h200_tensor_parallel_8(capsys):
    data = run_json(
        capsys, "--preset", "kimi-k2", "--gpu", "h200", "--gpus", "8", "--tensor-parallel", "8", "--context", "32k"
    )
    weights, reserve, budget = kimi_tp8_by_hand()
    assert (weights, reserve, budget) == (129_745_696_816, 2_586_574_848, 2_775_588_308)
    (stage,) = data["stages"]
    assert (stage["usable_bytes"], stage["weights_bytes"], stage["reserve_bytes"]) == (USABLE, weights, reserve)
    assert stage["kv_budget"] == budget
    r = rows(data)
    # the whole latent (512 + 64 values x 61 layers) on every rank: BF16 70,272 B, FP8 35,136 B per token
    assert r["auto"]["bytes_per_token"] == 61 * 576 * 2
    assert r["auto"]["tokens"] == budget // 70_272 == 39_497
    assert r["fp8_e4m3/tensor/dynamic"]["tokens"] == budget // 35_136 == 78_995
    assert r["auto"]["sequences"] == budget // (70_272 * 32768) == 1
    assert r["fp8_e4m3/tensor/dynamic"]["sequences"] == budget // (35_136 * 32768 + 61 * 2 * 4) == 2
    # one TP group: the deployment holds what one rank holds (the latent is replicated, not split)
    assert r["auto"]["deployment_tokens"] == r["auto"]["tokens"]
    assert r["nvfp4"]["vllm"] == "no" and r["fp8_e4m3/tensor/dynamic"]["vllm"] == "yes: FLASHMLA"


def test_kimi_k2_data_parallel_attention_partitions_the_latent(capsys):
    data = run_json(
        capsys, "--preset", "kimi-k2", "--gpu", "h200", "--gpus", "16", "--data-parallel", "16", "--expert-parallel", "16",
        "--context", "32k",
    )  # fmt: skip
    h, expert = 7168, 3 * 7168 * 2048
    attention = h * 1536 + 1536 * 64 * 192 + h * 576 + 512 * 64 * 256 + 64 * 128 * h  # TP 1: all 64 heads
    linear = 61 * attention + 3 * h * 18432 + 60 * (24 * expert + expert)  # 384 / 16 = 24 whole experts + shared
    other = 61 * (1536 + 512 + 2 * h) + 60 * (384 * h + 384) + 2 * 163840 * h + h
    weights = linear + linear * 4 // (128 * 128) + 2 * other
    # data-parallel MoE gathers the 16 ranks' tokens: 16 x (top-8 workspaces + their hidden states)
    width = 2 * h + 16 * (8 * (h + h) + h) + 3 * 2048
    reserve = max(2 * 8192 * width, 1024 * 163840 * 14) + 2 * 512 * width + 100 * MIB
    budget = USABLE - weights - reserve
    assert (weights, reserve, budget) == (77_672_806_576, 34_401_681_408, 23_033_371_988)
    assert data["stages"][0]["kv_budget"] == budget
    bf16 = rows(data)["auto"]
    assert bf16["tokens"] == budget // 70_272 == 327_774
    assert bf16["deployment_tokens"] == 16 * 327_774  # each DP rank holds its own requests' latents
    assert bf16["sequences"] == budget // (70_272 * 32768) == 10 and bf16["deployment_sequences"] == 160


def test_kimi_k2_dp8_ep8_on_8_h200_does_not_fit_in_one_line(capsys):
    code = main(["capacity", "--preset", "kimi-k2", "--gpu", "h200", "--gpus", "8", "--data-parallel", "8",
                 "--expert-parallel", "8"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "do not fit in 125.8 GiB per GPU" in err and "DP 8 x EP 8" in err


@pytest.mark.parametrize("tp", [2, 8])
def test_llama_70b_on_h200_tensor_parallel(capsys, tp):
    data = run_json(
        capsys, "--preset", "llama-3.1-70b", "--gpu", "h200", "--tensor-parallel", str(tp), "--context", "32k"
    )
    h, heads, kv = 8192, 64 // tp, 8 // tp
    per_layer = h * (heads + 2 * kv) * 128 + heads * 128 * h + 3 * h * (28672 // tp) + 2 * h
    weights = 2 * (80 * per_layer + 2 * (128256 // tp) * h + h)
    width = 2 * h + 3 * 28672 // tp  # the MLP is wider than attention at TP 2 and 8
    reserve = max(2 * 8192 * width, 1024 * 128256 * 14) + 2 * 512 * width + 100 * MIB
    budget = USABLE - weights - reserve
    assert data["stages"][0]["kv_budget"] == budget
    r = rows(data)
    per_token = 80 * 2 * kv * 128 * 2  # K and V of this rank's KV heads, 80 layers, BF16
    assert r["auto"]["bytes_per_token"] == per_token
    assert r["auto"]["tokens"] == budget // per_token == {2: 381_765, 8: 2_819_721}[tp]
    assert r["fp8_e4m3/tensor/dynamic"]["tokens"] == budget // (per_token // 2)
    assert r["auto"]["sequences"] == budget // (per_token * 32768) == {2: 11, 8: 86}[tp]
    assert r["auto"]["deployment_tokens"] == r["auto"]["tokens"]
    assert (
        r["nvfp4"]["vllm"] == "yes: FLASHINFER (FA2 path)"
    )  # FlashInfer's FA2 path takes nvfp4 at head_size 128 on SM 9.x


def test_gqa_kv_heads_replicated_past_tp_8(capsys):
    """Llama-3.1-8B (8 KV heads) on TP 16: one head per rank, each head on two ranks: tokens do not grow."""
    tp8, tp16 = (
        run_json(capsys, "--preset", "llama-3.1-8b", "--gpu", "h200", "--tensor-parallel", n, "--reserve", "0")
        for n in ("8", "16")
    )
    for data in (tp8, tp16):
        assert rows(data)["auto"]["bytes_per_token"] == 32 * 2 * 1 * 128 * 2  # one head per rank either way
    assert rows(tp16)["auto"]["tokens"] == rows(tp16)["auto"]["deployment_tokens"]


def test_mla_replicated_under_tp_partitioned_under_dp(capsys):
    """Same GPUs, weights and reserve: TP 8 holds one copy of each latent 8 times; DP 8 holds 8 request sets."""
    common = ["--preset", "kimi-k2", "--gpu", "b300", "--reserve", "4GiB", "--context", "32k"]
    tp = run_json(capsys, *common, "--tensor-parallel", "8")
    dp = run_json(capsys, *common, "--data-parallel", "8", "--expert-parallel", "8")
    for data in (tp, dp):
        budget = data["stages"][0]["kv_budget"]
        bf16 = rows(data)["auto"]
        assert bf16["tokens"] == budget // 70_272
    assert rows(tp)["auto"]["deployment_tokens"] == rows(tp)["auto"]["tokens"]
    assert rows(dp)["auto"]["deployment_tokens"] == 8 * rows(dp)["auto"]["tokens"]


def test_gpu_memory_overrides_the_gpu_and_units_differ_by_seven_percent(capsys):
    base = ["--preset", "llama-3.1-8b", "--reserve", "0", "--weights-bytes", "0"]
    gib = run_json(capsys, *base, "--gpu", "h200", "--gpu-memory", "141GiB")
    gb = run_json(capsys, *base, "--gpu", "h200", "--gpu-memory", "141GB")
    own = run_json(capsys, *base, "--gpu", "h200")
    assert gib["gpu_memory"] == 141 * GIB and gb["gpu_memory"] == 141 * 10**9 and own["gpu_memory"] == H200
    assert gib["gpu_memory"] / gb["gpu_memory"] == pytest.approx(1.0737, abs=1e-4)


def test_table_marks_what_the_gpu_cannot_run(capsys):
    code = main(["capacity", "--preset", "kimi-k2", "--gpu", "h200", "--tensor-parallel", "8", "--schemes",
                 "nvfp4,vllm:fp8_ds_mla,fp8_e4m3/tensor/unit,mxfp4+rope=bf16"])  # fmt: skip
    out = capsys.readouterr().out
    table = {
        line.split("|")[1].strip(): line.split("|")[-2].strip() for line in out.splitlines() if line.startswith("| ")
    }
    assert table["nvfp4"] == "no" and table["vllm:fp8_ds_mla"] == "no"
    assert table["fp8_e4m3/tensor/unit"] == "yes: FLASHMLA" and table["mxfp4+rope=bf16"] == "-"
    assert "nvfp4 (nvfp4) on H200: no MLA backend of vLLM 0.33 on NVIDIA H200 (SXM) stores nvfp4" in out
    assert "stores fp8_ds_mla (DeepSeek V3.2's sparse-MLA backends only)" in out
    assert "KV budget per rank: ceil(139.81 GiB x 0.9) = 125.8 GiB" in out and "reserve per rank: max(forward" in out
    # vLLM's own nvfp4 dtype on an MLA model is refused where the scheme meets the model, in one line
    code = main(
        ["capacity", "--preset", "kimi-k2", "--gpu", "h200", "--tensor-parallel", "8", "--schemes", "vllm:nvfp4"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "no MLA backend" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--gpus", "8", "--tensor-parallel", "4"], "--gpus 8 but --tensor-parallel 4 x --pipeline-parallel 1"),
        (["--tensor-parallel", "4", "--data-parallel", "2", "--expert-parallel", "4"], "so it is 1 (off) or"),
        (["--tensor-parallel", "3"], "--tensor-parallel 3 does not divide the model's attention heads (64)"),
        (["--gpu", "h300"], "unknown GPU 'h300'"),
        (["--pipeline-parallel", "100"], "--pipeline-parallel 100 is more stages than the model's 61 layers"),
        (["--max-num-seqs", "0"], "--max-num-seqs must be at least 1"),
        (["--reserve", "lots"], "cannot read a memory size"),
        (["--gpu", "h200", "--utilization", "1.5"], "--utilization is a fraction in (0, 1]"),
    ],
)
def test_bad_flag_combinations_are_one_line_exit_2(capsys, argv, message):
    code = main(["capacity", "--preset", "kimi-k2", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err


def test_expert_parallel_on_a_dense_model_is_refused(capsys):
    code = main(["capacity", "--preset", "llama-3.1-70b", "--data-parallel", "2", "--expert-parallel", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "has no experts (a dense model): drop --expert-parallel" in err


def test_pipeline_stages_each_get_a_budget(capsys):
    data = run_json(
        capsys, "--preset", "llama-3.1-70b", "--gpu", "h100", "--tensor-parallel", "4", "--pipeline-parallel", "2"
    )
    first, last = data["stages"]
    assert (first["layers"], last["layers"]) == ([0, 40], [40, 80])
    assert first["reserve"]["sampler"] == 0 and last["reserve"]["sampler"] > 0
    bf16 = rows(data)["auto"]
    assert bf16["bytes_per_token"] == 40 * 2 * 2 * 128 * 2  # 40 layers, 2 of 8 KV heads
    assert bf16["tokens"] == min(s["kv_budget"] for s in data["stages"]) // bf16["bytes_per_token"]


def test_list_gpus_and_the_dry_run_fit(capsys):
    assert main(["capacity", "--list-gpus"]) == 0
    out = capsys.readouterr().out
    assert "h200" in out and "143,771 MiB" in out and "139.81 GiB as CUDA reports it" in out and "mi355x" in out
    from evalkit.models.presets import PRESETS
    from evalkit.planning.capacity import memory_fit
    from evalkit.planning.parallel import Parallel

    lines = memory_fit(PRESETS["llama-3.1-70b"]["config"], "h200", parallel=Parallel(tp=8), weights_dtype="bf16")
    assert lines[0].startswith("memory fit on 8 x H200 (TP 8, 125.8 GiB usable per GPU): weights 16.4 GiB")
    assert "auto: 2,819,721 tokens per rank, 86 sequences of 32,768 tokens per replica" in lines[1]
    assert "vLLM on H200: yes: FLASH_ATTN" in lines[1]
    kimi = memory_fit(
        PRESETS["kimi-k2"]["config"], "h200", parallel=Parallel(dp=8, ep=8), weights_dtype="fp8", weight_block=128
    )
    assert len(kimi) == 1 and "do not fit" in kimi[0]


def test_the_docs_block_is_the_command_output(capsys):
    from tests.doc_blocks import doc_block

    argv = [
        "capacity",
        "--preset",
        "kimi-k2",
        "--gpu",
        "h200",
        "--gpus",
        "8",
        "--tensor-parallel",
        "8",
        "--context",
        "32k",
    ]
    assert main([*argv, "--schemes", "fp8_e4m3/tensor/unit,nvfp4+rope=bf16,mxfp4+rope=bf16"]) == 0
    out = capsys.readouterr().out
    assert doc_block("capacity-kimi-h200-tp8").strip().removeprefix("```").removesuffix("```").strip() == out.strip()


def test_deployment_flags_with_engine_are_one_line(capsys):
    code = main(["capacity", "--engine", "vllm", "--model", "embedded", "--tensor-parallel", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "--tensor-parallel sizes a counted deployment" in err and err.count("\n") == 1


def test_a_total_without_a_dtype_is_spread_in_proportion(capsys, tmp_path):
    """A config without torch_dtype and a given total: shares by the BF16 parts (experts split by EP)."""
    from evalkit.models.presets import PRESETS

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(PRESETS["kimi-k2"]["config"]))
    data = run_json(capsys, "--config", str(cfg), "--gpu", "b300", "--data-parallel", "8", "--expert-parallel", "8",
                    "--weights-bytes", "1TB", "--reserve", "0")  # fmt: skip
    weights = data["stages"][0]["weights_bytes"]
    assert 10**12 / 8 < weights < 10**12 / 4  # replicated attention and embeddings on top of 1/8 of the experts


def test_with_vllms_own_reserve_the_tokens_match_a_vllm_log(capsys):
    """A public vLLM V1 start-up log, Llama-3.1-8B-Instruct on one H100: "total_gpu_memory (79.11GiB) x
    gpu_memory_utilization (0.90) = 71.20GiB; model weights take 14.99GiB; non_torch_memory takes 0.35GiB;
    PyTorch activation peak memory takes 1.24GiB; the rest of the memory reserved for KV Cache is 54.62GiB",
    then "GPU KV cache size: 447,088 tokens". Given that reserve (0.35 + 1.24 GiB), the count lands within
    0.2 % (vLLM's weights include the 33.5 MB RoPE cos/sin cache; its cache is whole 16-token blocks)."""
    data = run_json(capsys, "--preset", "llama-3.1-8b", "--gpu", "h100", "--reserve", "1.59GiB", "--schemes", "auto")
    tokens = rows(data)["auto"]["tokens"]
    assert tokens == (math.ceil(round(79.11 * GIB) * 0.9) - 8_030_261_248 * 2 - round(1.59 * GIB)) // 131_072
    assert abs(tokens - 447_088) / 447_088 < 0.002
    # the estimate in its place: the forward is counted low against that log's 1.24 GiB peak (there at
    # max_num_seqs 256), which docs/sizing.md says
    est = run_json(capsys, "--preset", "llama-3.1-8b", "--gpu", "h100", "--max-num-seqs", "256", "--schemes", "auto")
    assert est["stages"][0]["reserve"]["forward"] == 2 * 8192 * (2 * 4096 + 3 * 14336) < 1.24 * GIB
