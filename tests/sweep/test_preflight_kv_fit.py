"""The engine's KV cache against a grid's longest request, refused before any load (dry run and sweep)."""

from __future__ import annotations

import pytest

from evalkit.cli import main
from evalkit.kv.scheme import parse_scheme
from evalkit.models.facts import read_config
from evalkit.planning.engine_fit import engine_cache, fit_problem, needed_utilization
from evalkit.planning.gpus import get_gpu
from evalkit.planning.parallel import Parallel

MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # an evalkit preset: its config, no weights


def grid(tmp_path, options: str, lengths: str = "[4k, 128k]"):
    path = tmp_path / "ruler.yaml"
    path.write_text(
        f"name: ruler\nmodels:\n  - {{name: {MODEL}, dtype: bfloat16, device: cuda}}\nengine: vllm\n"
        f"engine_options:\n  vllm: {options}\nschemes: [auto]\n"
        f"evals:\n  longcontext: {{tasks: [ruler], lengths: {lengths}, limit: 2, batch_size: auto}}\n"
    )
    return path


def test_the_cache_in_tokens_is_the_hand_count():
    config, _ = read_config(MODEL)
    # Llama-3.1-8B: 32 layers x 8 KV heads x 128 x (K and V) x 2 bytes (bf16) = 131,072 B per token
    per_token = config["num_hidden_layers"] * config["num_key_value_heads"] * 128 * 2 * 2
    assert per_token == 131072
    cache = engine_cache(config, parse_scheme("auto"), kv_cache_bytes=4 << 30)
    assert (cache.tokens, cache.bytes_per_token) == ((4 << 30) // per_token, per_token) == (32768, 131072)
    fp8 = engine_cache(config, parse_scheme("fp8_e4m3/tensor/unit"), kv_cache_bytes=4 << 30)
    assert fp8.tokens == 2 * cache.tokens
    tp2 = engine_cache(config, parse_scheme("auto"), kv_cache_bytes=4 << 30, parallel=Parallel(tp=2))
    assert tp2.tokens == 2 * cache.tokens  # each rank holds half the KV heads of every token
    line = fit_problem(131072, "RULER at 128k", cache, "FIX")
    assert "32,768 tokens" in line and "131,072 tokens" in line and "16.0 GiB" in line and line.endswith("FIX")
    assert fit_problem(32768, "x", cache) is None


def test_the_needed_utilization_is_the_least_that_holds_the_request():
    config, _ = read_config(MODEL)
    auto, h100 = parse_scheme("auto"), get_gpu("h100")
    u = needed_utilization(config, auto, 131072, parallel=Parallel(), gpu=h100)
    assert u is not None and 0.2 < u < 0.92
    assert engine_cache(config, auto, gpu=h100, utilization=u).tokens >= 131072
    assert engine_cache(config, auto, gpu=h100, utilization=round(u - 0.01, 2)).tokens < 131072


def test_a_ruler_128k_grid_on_a_4gib_cache_is_refused_before_any_load(tmp_path, capsys, monkeypatch):
    import evalkit.models.loading as loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    path = grid(tmp_path, "{kv_cache_memory_bytes: 4294967296}")
    assert main(["sweep", str(path), "--dry-run", "--assume-device", "h100", "--out", str(tmp_path / "o")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("evalkit: error:")]
    assert len(errors) == 1, errors
    assert f"{path}:9: evals.longcontext:" in errors[0]
    for part in ("131,072 tokens", "holds 32,768 tokens", "needs 16.0 GiB", "gpu_memory_utilization 0.42"):
        assert part in errors[0]
    # the real sweep refuses it the same way, before its output folder is made
    assert main(["sweep", str(path), "--out", str(tmp_path / "o")]) == 2
    assert "holds 32,768 tokens" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_the_same_grid_with_a_fitting_utilization_passes(tmp_path, capsys):
    path = grid(tmp_path, "{gpu_memory_utilization: 0.9}")
    main(["sweep", str(path), "--dry-run", "--assume-device", "h100", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert "KV cache" not in err, err
    # a share too small for it names the share that fits
    path = grid(tmp_path, "{gpu_memory_utilization: 0.3}")
    assert main(["sweep", str(path), "--dry-run", "--assume-device", "h100", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "gpu_memory_utilization 0.3 of 1 x H100" in err and "set gpu_memory_utilization 0.42" in err


def test_without_a_named_gpu_it_is_a_note(tmp_path, capsys):
    path = grid(tmp_path, "{gpu_memory_utilization: 0.9}")
    main(["sweep", str(path), "--dry-run", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert "evalkit: note:" in err and "name the GPU (--assume-device)" in err
