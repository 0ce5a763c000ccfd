"""Capacity planning: size parsing and printing (evalkit.units), the KV budget, tokens/sequences per scheme, the CLI."""

from __future__ import annotations

import json

import pytest

from evalkit.cli import main
from evalkit.errors import EvalkitError
from evalkit.kv.scheme import parse_schemes
from evalkit.models.info import kv_layout
from evalkit.models.presets import PRESETS, config_namespace, get_preset
from evalkit.planning.capacity import kv_budget, parse_count, plan
from evalkit.units import format_bytes, format_seconds, parse_bytes


# ---- sizes and durations as text (evalkit.units) ---------------------------------------------
@pytest.mark.parametrize(
    "text,want",
    [
        ("80GiB", 80 * 2**30),
        ("80GB", 80 * 10**9),
        ("1.03TB", 1_030_000_000_000),
        ("512MiB", 512 * 2**20),
        ("1024", 1024),
        ("141 GB", 141 * 10**9),
    ],
)
def test_parse_bytes(text, want):
    assert parse_bytes(text) == want


@pytest.mark.parametrize("bad", ["80 parsecs", "GiB", "", "-3GB"])
def test_parse_bytes_rejects(bad):
    with pytest.raises(EvalkitError, match="cannot read a memory size"):
        parse_bytes(bad)


@pytest.mark.parametrize(
    "n,want",
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (10**6, "976.6 KiB"),
        (2**20, "1.0 MiB"),
        (80 * 2**30, "80.0 GiB"),
        (141 * 10**9, "131.3 GiB"),
        (1.03e12, "959.3 GiB"),
        (3 * 2**40, "3.0 TiB"),
        (-(2**30), "-1.0 GiB"),
    ],
)
def test_format_bytes_is_binary_one_decimal(n, want):
    assert format_bytes(n) == want


def test_format_bytes_reads_back():
    for n in (2**20, 80 * 2**30, 3 * 2**40):
        assert parse_bytes(format_bytes(n).replace(" ", "")) == n


@pytest.mark.parametrize(
    "s,want",
    [
        (None, "?"),
        (0.04, "0.0 s"),
        (59.94, "59.9 s"),
        (60, "1 min 00 s"),
        (245.9, "4 min 05 s"),
        (3600, "1 h 00 min"),
        (7625, "2 h 07 min"),
    ],
)
def test_format_seconds(s, want):
    assert format_seconds(s) == want


@pytest.mark.parametrize("text,want", [("32k", 32768), ("128K", 131072), ("4096", 4096), ("1m", 2**20)])
def test_parse_count(text, want):
    assert parse_count(text) == want


def test_weights_larger_than_memory_is_one_clear_error():
    with pytest.raises(EvalkitError, match="do not fit"):
        kv_budget(80 * 10**9, gpus=8, utilization=0.9, weights=int(1.03e12))


def test_plan_numbers_for_kimi_k2_on_16x80gb():
    layout = kv_layout(config_namespace(PRESETS["kimi-k2"]["config"]))
    budget = kv_budget(80 * 10**9, gpus=16, utilization=0.9, weights=int(1.03e12))
    assert budget == int(16 * 80e9 * 0.9) - int(1.03e12)
    rows = plan(layout, parse_schemes("fp8_e4m3/tensor/dynamic,fp8_e4m3/group128/dynamic+rope=bf16"), budget, 32768)
    assert [r.scheme for r in rows][0] == "auto"  # the reference is added and put first
    bf16, fp8, tiles = rows
    assert (bf16.bytes_per_token, fp8.bytes_per_token, tiles.bytes_per_token) == (70_272, 35_136, 40_016)
    assert bf16.tokens == budget // 70_272 and fp8.tokens == budget // 35_136
    assert fp8.multiplier == 2.0 and tiles.multiplier == 70_272 / 40_016
    assert bf16.sequences == budget // (70_272 * 32768)
    assert fp8.sequences == budget // (35_136 * 32768 + 61 * 2 * 4)  # per-sequence tensor scales of latent and RoPE


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_preset_prints_the_kimi_figures(capsys):
    code, out, _ = run_cli(
        capsys,
        "capacity",
        "--preset",
        "kimi-k2",
        "--gpu-memory",
        "80GB",
        "--gpus",
        "16",
        "--weights-bytes",
        "1.03TB",
        "--context",
        "32k",
    )
    assert code == 0
    for figure in ("70,272", "35,136", "40,016"):
        assert figure in out
    assert "2.00" in out


def test_cli_json_and_config_file(capsys, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 1,
                "hidden_size": 64,
            }
        )
    )
    code, out, _ = run_cli(
        capsys,
        "capacity",
        "--config",
        str(cfg),
        "--gpu-memory",
        "1GiB",
        "--weights-bytes",
        "0",
        "--utilization",
        "1",
        "--context",
        "1k",
        "--schemes",
        "fp8_e4m3/tensor/unit",
        "--json",
    )
    assert code == 0
    data = json.loads(out)
    bf16, fp8 = data["rows"]
    assert bf16["bytes_per_token"] == 2 * 2 * 1 * 16 * 2
    assert bf16["tokens"] == 2**30 // 128 and fp8["tokens"] == 2**30 // 64
    assert fp8["sequences"] == 2**30 // (64 * 1024 + 2 * 2 * 4)


def test_cli_model_folder_reads_config_and_weight_files(capsys, tiny_llama_dir):
    code, out, _ = run_cli(
        capsys, "capacity", "--model", str(tiny_llama_dir), "--gpu-memory", "1GiB", "--context", "256"
    )
    assert code == 0 and "safetensors" in out and "fp8_e4m3/tensor/dynamic" in out


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--preset", "gpt-5"],
            "unknown preset 'gpt-5': use one of llama-3.1-8b, llama-3.1-70b, qwen3-32b, deepseek-v3, kimi-k2, "
            "deepseek-v4-flash-base, smollm2-135m",
        ),
        (["--preset", "kimi-k2", "--gpu-memory", "80GB", "--gpus", "8"], "do not fit"),
        (["--preset", "kimi-k2", "--schemes", "fp8_e4m3/head/dynamic", "--gpus", "16"], "tensor, token or group"),
        (["--config", "/nonexistent/config.json"], "does not exist"),
        (["--preset", "llama-3.1-8b", "--gpu-memory", "lots"], "cannot read a memory size"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(capsys, argv, message):
    code, out, err = run_cli(capsys, "capacity", *argv)
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("name", ["kimi-k2", "Kimi-K2", "moonshotai/Kimi-K2-Instruct", "Kimi-K2-Instruct"])
def test_one_preset_lookup_for_capacity_and_the_dry_run(name):
    """--preset and the sweep's dry run find presets by one rule (key or hub id, suffix ignored)."""
    from evalkit.models.facts import model_facts
    from evalkit.models.presets import find_preset

    assert find_preset(name)[0] == "kimi-k2" and get_preset(name) is PRESETS["kimi-k2"]
    if "/" in name:
        facts = model_facts(name)
        assert facts.source.startswith("evalkit preset kimi-k2") and facts.download_bytes == int(1.04e12 * 1.0)


def test_one_dtype_table_for_weights_and_downloads():
    from evalkit.models.presets import DTYPE_BYTES, weights_bytes

    assert weights_bytes(8e9, "bf16") == weights_bytes(8e9, "bfloat16") == 16 * 10**9
    assert DTYPE_BYTES["fp8"] == 1 and DTYPE_BYTES["int4"] == 0.5
    with pytest.raises(EvalkitError, match="unknown weights dtype 'fp6'"):
        weights_bytes(1e9, "fp6")


def test_list_presets(capsys):
    code, out, _ = run_cli(capsys, "capacity", "--list-presets")
    assert code == 0 and all(name in out for name in PRESETS)
    assert get_preset("Kimi-K2")["config"]["kv_lora_rank"] == 512


@pytest.mark.parametrize(
    "preset,gpus,weights,rows",
    [
        (
            "llama-3.1-8b",
            "1",
            "16GB",
            {
                "nvfp4": ("36,864", "3.56"),
                "mxfp4": ("34,816", "3.76"),
                "sglang_fp4": ("36,864", "3.56"),
                "mxfp8_e4m3": ("67,584", "1.94"),
                "fp8_e4m3/tensor/dynamic": ("65,536", "2.00"),
            },
        ),
        (
            "kimi-k2",
            "16",
            "1.03TB",
            {
                "nvfp4+rope=bf16": ("25,376", "2.77"),
                "nvfp4": ("19,764", "3.56"),
                "mxfp4+rope=bf16": ("24,400", "2.88"),
                "fp8_e4m3/group128/dynamic+rope=bf16": ("40,016", "1.76"),
            },
        ),
    ],
)
def test_cli_presets_show_the_fp4_rows_and_where_engine_layouts_differ(capsys, preset, gpus, weights, rows):
    """Whole-model bytes per token on one rank: one GPU for Llama (all its KV heads), any TP for an MLA latent."""
    code, out, _ = run_cli(
        capsys,
        "capacity",
        "--preset",
        preset,
        "--gpu-memory",
        "80GB",
        "--gpus",
        gpus,
        "--weights-bytes",
        weights,
        "--context",
        "32k",
    )
    assert code == 0
    table = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in out.splitlines()
        if line.startswith("| ") and not line.startswith("| scheme")
    }
    for scheme, (per_token, multiplier) in rows.items():
        assert table[scheme][0] == per_token and table[scheme][-1] == multiplier, scheme
    assert "Notes" in out and "nvfp4:" in out and ("one 576-wide E4M3 entry" in out) == (preset == "kimi-k2")


def test_default_schemes_a_model_cannot_tile_are_left_out_with_a_note(capsys, tmp_path):
    cfg = tmp_path / "config.json"  # head_dim 48: the 32-wide MX groups and int4/group32 do not fit
    cfg.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "hidden_size": 192,
            }
        )
    )
    code, out, _ = run_cli(
        capsys, "capacity", "--config", str(cfg), "--gpu-memory", "1GiB", "--weights-bytes", "0", "--json"
    )
    data = json.loads(out)
    assert code == 0 and "nvfp4" in {r["scheme"] for r in data["rows"]}
    assert not {"mxfp4", "mxfp8_e4m3", "int4/group32/dynamic"} & {r["scheme"] for r in data["rows"]}
    assert any(
        n.startswith("mxfp4 left out of the default list: group32 does not divide head_dim 48") for n in data["notes"]
    )


@pytest.mark.parametrize(
    "preset,text,dtype",
    [
        ("llama-3.1-8b", "auto", "auto"),
        ("llama-3.1-8b", "fp8_e4m3/tensor/unit", "fp8_e4m3"),
        ("llama-3.1-8b", "fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz", "fp8_e4m3"),
        ("llama-3.1-8b", "fp8_e5m2/tensor/dynamic", "fp8_e5m2"),
        ("llama-3.1-8b", "nvfp4", "nvfp4"),
        ("llama-3.1-8b", "vllm:int8_per_token_head", "int8_per_token_head"),
        ("llama-3.1-8b", "mxfp4", None),
        ("llama-3.1-8b", "sglang_fp4", None),
        ("kimi-k2", "fp8_e4m3/tensor/unit", "fp8"),
        ("kimi-k2", "fp8_e4m3/group128/dynamic+rope=bf16", "fp8_ds_mla"),
        ("kimi-k2", "nvfp4+rope=bf16", "nvfp4"),
    ],
)
def test_the_vllm_dtype_that_stores_a_schemes_bytes(preset, text, dtype):
    from evalkit.planning.capacity import vllm_dtype

    layout = kv_layout(config_namespace(PRESETS[preset]["config"]))
    assert vllm_dtype(parse_schemes(text)[0], layout) == dtype
