"""Calibration: statistics against K/V read independently from the model's own DynamicCache,
the three methods, the file and its sidecar, overlap warnings and bad input."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from evalkit import quantized_kv
from evalkit.errors import EvalkitError
from evalkit.integration.hf_compat import output_cache
from evalkit.integration.observe import observe_kv
from evalkit.kv.scale_table import load_scale_table, save_scale_table
from evalkit.models.loading import load_model
from evalkit.scales.calibrate import (
    BINS,
    DEFAULT_CORPUS,
    KVObserver,
    _run,
    calibrate,
    calibration_batches,
    load_text,
    overlap_fraction,
    parse_method,
    percentile_from_histogram,
)

E4M3_MAX = 448.0
TEXT = load_text(DEFAULT_CORPUS)


def cached_kv(lm, ids):
    """Post-RoPE K/V per layer as the model's own cache stores them (independent of the hook)."""
    with torch.no_grad():
        out = lm.model(input_ids=ids, use_cache=True)
    cache = output_cache(out)
    return [(layer.keys.float(), layer.values.float()) for layer in cache.layers]


def test_observer_amax_matches_the_models_cache_and_changes_nothing(tiny):
    ids = calibration_batches(tiny.tokenizer, TEXT, 3, 64, bos=False)
    with torch.no_grad():
        plain = tiny.model(input_ids=ids).logits
    obs = KVObserver(tiny.layout)
    with torch.no_grad(), observe_kv(tiny.model, obs):
        observed = tiny.model(input_ids=ids, use_cache=False).logits
    assert torch.equal(plain, observed)  # the observer is transparent
    for i, (k, v) in enumerate(cached_kv(tiny, ids)):
        assert torch.equal(obs.amax["k"][i].float(), k.abs().amax(dim=(0, 2, 3)))
        assert torch.equal(obs.amax["v"][i].float(), v.abs().amax(dim=(0, 2, 3)))
        assert int(obs.count["k"][i]) == k.numel() // k.shape[1]


def test_amax_static_scales_reproduce_dynamic_tensor_scales_on_the_calibration_sequence(tiny):
    """One sequence: its per-tensor amax table must equal the dynamic per-tensor scale bit for bit."""
    table = calibrate(
        tiny, text=TEXT, samples=1, seq_len=96, granularity="tensor", method="amax", eval_corpus=None, bos=False
    )
    ids = calibration_batches(tiny.tokenizer, TEXT, 1, 96, bos=False)
    for i, (k, v) in enumerate(cached_kv(tiny, ids)):
        assert float(table.k_scale[i]) == float(k.abs().max() / E4M3_MAX)
        assert float(table.v_scale[i]) == float(v.abs().max() / E4M3_MAX)
    # only layer 0 quantized: later layers' K/V would see layer 0's quantization error
    skip = ",".join(str(i) for i in range(1, tiny.layout.num_layers))
    with torch.no_grad():
        with quantized_kv(tiny.model, f"fp8_e4m3/tensor/dynamic+skip={skip}"):
            dyn = tiny.model(input_ids=ids).logits
        with quantized_kv(
            tiny.model, f"fp8_e4m3/tensor/static+scales=unused.safetensors+skip={skip}", scale_table=table
        ):
            stat = tiny.model(input_ids=ids).logits
        base = tiny.model(input_ids=ids).logits
    assert torch.equal(dyn, stat) and not torch.equal(dyn, base)


def test_head_amax_and_percentile_against_plain_quantiles(tiny):
    ids = calibration_batches(tiny.tokenizer, TEXT, 4, 64, bos=False)
    kv = cached_kv(tiny, ids)
    head = calibrate(
        tiny, text=TEXT, samples=4, seq_len=64, granularity="head", method="amax", eval_corpus=None, bos=False
    )
    pct = calibrate(
        tiny, text=TEXT, samples=4, seq_len=64, granularity="head", method="percentile:99", eval_corpus=None, bos=False
    )
    for i, (k, _) in enumerate(kv):
        per_head = k.abs().transpose(0, 1).reshape(k.shape[1], -1)
        assert torch.equal(head.k_scale[i], per_head.amax(dim=1) / E4M3_MAX)
        n = per_head.shape[1]
        q = per_head.double().sort(dim=1).values[:, math.ceil(0.99 * n) - 1]  # the 99th percentile value
        bin_width = k.abs().max().double() * 2 / BINS  # one range per layer, at most twice its max
        got = pct.k_scale[i].double() * E4M3_MAX
        assert bool((got >= q - 1e-6).all()) and bool((got <= q + bin_width + 1e-6).all())
        assert bool((pct.k_scale[i] <= head.k_scale[i]).all())


def test_percentile_from_histogram_on_known_counts():
    hist = torch.zeros(BINS, dtype=torch.float64)
    hist[9] = 90  # 90 values in (9, 10] * rng/BINS
    hist[99] = 10
    assert float(percentile_from_histogram(hist, float(BINS), 50)) == 10.0
    assert float(percentile_from_histogram(hist, float(BINS), 95)) == 100.0


def test_histogram_range_doubling_keeps_counts(tiny):
    obs = KVObserver(tiny.layout, histograms=True)
    a1 = torch.rand(2, 1000) * 0.5
    a2 = torch.rand(2, 1000) * 3.0
    obs._histogram("k", 0, a1)
    obs._histogram("k", 0, a2)
    hist, rng = obs.hist["k"][0], float(obs.hist_range["k"][0])
    assert rng >= 3.0 * 0.999 and float(hist.sum()) == 4000
    lower = hist[:, : int(BINS * 0.25 / rng)].sum()  # bins wholly below 0.25
    expected = float((a1 < 0.25 * 0.99).sum() + (a2 < 0.25 * 0.99).sum())
    assert abs(float(lower) - expected) <= 0.02 * 4000


def test_mse_picks_the_candidate_with_least_error_under_a_real_fp8_cast(tiny):
    table = calibrate(
        tiny, text=TEXT, samples=2, seq_len=64, granularity="tensor", method="mse", eval_corpus=None, bos=False
    )
    amax = calibrate(
        tiny, text=TEXT, samples=2, seq_len=64, granularity="tensor", method="amax", eval_corpus=None, bos=False
    )
    ids = calibration_batches(tiny.tokenizer, TEXT, 2, 64, bos=False)

    def sse(x, s):  # torch's own float8 cast, not evalkit's emulation
        return float((((x / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * s - x) ** 2).sum())

    for i, (k, v) in enumerate(cached_kv(tiny, ids)):
        for x, chosen, base in ((k, table.k_scale[i], amax.k_scale[i]), (v, table.v_scale[i], amax.v_scale[i])):
            cands = [base * 2.0 ** (-j / 8) for j in range(17)]
            errors = [sse(x, c) for c in cands]
            assert sse(x, chosen) == pytest.approx(min(errors), rel=1e-6)
            assert sse(x, chosen) <= sse(x, base)


def test_scale_table_file_and_sidecar_validate_against_the_model(tiny, tmp_path):
    table = calibrate(tiny, samples=2, seq_len=64, granularity="head", method="amax")
    path = tmp_path / "t.safetensors"
    save_scale_table(path, table)
    meta = json.loads((tmp_path / "t.safetensors.json").read_text())
    for key in (
        "model",
        "config_hash",
        "corpus",
        "corpus_hash",
        "method",
        "granularity",
        "evalkit_version",
        "samples",
        "seq_len",
    ):
        assert key in meta
    assert meta["corpus"] == DEFAULT_CORPUS and meta["samples"] == 2 and meta["eval_corpus_overlap"] == 0.0
    loaded = load_scale_table(path, tiny.layout, granularity="head", config_hash=tiny.config_hash)
    assert torch.equal(loaded.k_scale, table.k_scale) and loaded.k_scale.shape == (
        tiny.layout.num_layers,
        tiny.layout.num_kv_heads,
    )


def test_default_calibration_text_is_disjoint_from_the_embedded_eval_text():
    assert len(TEXT.split()) > 20000
    assert overlap_fraction(TEXT, load_text("embedded")) == 0.0
    assert overlap_fraction(load_text("embedded")[:20000], load_text("embedded")) == 1.0


def test_overlap_with_the_evaluation_text_warns(tiny):
    with pytest.warns(UserWarning, match="also occurs in the evaluation text"):
        calibrate(tiny, corpus="embedded", samples=1, seq_len=32, eval_corpus="embedded")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calibrate(tiny, samples=1, seq_len=32, eval_corpus="embedded")


def test_bad_input_is_one_clear_error(tiny, tiny_llama_dir):
    with pytest.raises(EvalkitError, match="fewer than one sequence"):
        calibrate(tiny, text="only a few words", samples=4, seq_len=64, eval_corpus=None)
    for bad in ("max", "percentile:0", "percentile:101", "percentile:x"):
        with pytest.raises(EvalkitError):
            parse_method(bad)
    with pytest.raises(EvalkitError, match="granularity"):
        calibrate(tiny, samples=1, seq_len=32, granularity="block16")
    dead = load_model(str(tiny_llama_dir))
    with torch.no_grad():
        dead.model.model.layers[1].self_attn.k_proj.weight.zero_()
    with pytest.raises(EvalkitError, match="layer 1 K are all zero"):
        calibrate(dead, samples=1, seq_len=32, eval_corpus=None)


def test_padding_is_left_out_of_the_statistics(tiny):
    ids = calibration_batches(tiny.tokenizer, TEXT, 1, 48, bos=False)
    obs_plain = KVObserver(tiny.layout)
    _run(tiny.model, ids, obs_plain, 1)
    pad = torch.full((1, 16), tiny.tokenizer.pad_token_id)
    padded = torch.cat([pad, ids], dim=1)
    mask = torch.cat([torch.zeros(1, 16, dtype=torch.long), torch.ones_like(ids)], dim=1)
    obs = KVObserver(tiny.layout)
    with torch.no_grad(), observe_kv(tiny.model, obs):
        tiny.model(
            input_ids=padded, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=False
        )
    assert torch.equal(obs.count["k"], obs_plain.count["k"])
    assert torch.allclose(obs.amax["k"], obs_plain.amax["k"], rtol=1e-5)


def test_cli_writes_table_refuses_to_overwrite_and_reads_recipes(tiny_llama_dir, tmp_path, capsys):
    from evalkit.cli import main

    out = tmp_path / "s.safetensors"
    args = [
        "calibrate",
        "--model",
        str(tiny_llama_dir),
        "--samples",
        "2",
        "--seq-len",
        "32",
        "--granularity",
        "head",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    assert f"fp8_e4m3/head/static+scales={out}" in capsys.readouterr().out
    assert main(args) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(args + ["--force"]) == 0
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"model: {tiny_llama_dir}\nsamples: 1\nseq_len: 32\nmethod: percentile:99.9\nout: {tmp_path / 'r.safetensors'}\n"
    )
    assert main(["calibrate", "--recipe", str(recipe)]) == 0
    meta = json.loads((tmp_path / "r.safetensors.json").read_text())
    assert meta["method"] == "percentile:99.9" and meta["granularity"] == "tensor" and meta["samples"] == 1
    short = tmp_path / "short.txt"
    short.write_text("A few words only.")
    assert (
        main(
            [
                "calibrate",
                "--model",
                str(tiny_llama_dir),
                "--corpus",
                f"file:{short}",
                "--seq-len",
                "64",
                "--out",
                str(tmp_path / "x.safetensors"),
            ]
        )
        == 2
    )
    assert "fewer than one sequence" in capsys.readouterr().err
    assert (
        main(
            [
                "calibrate",
                "--model",
                str(tiny_llama_dir),
                "--seq-len",
                "100000",
                "--out",
                str(tmp_path / "x.safetensors"),
            ]
        )
        == 2
    )
    assert "maximum length" in capsys.readouterr().err
    assert not (tmp_path / "x.safetensors").exists()


@pytest.mark.slow
def test_shipped_embedded_scales_match_their_recipes_and_validate(embedded):
    """calibration/ holds the recipes and the scale files they produced for the embedded model."""
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2] / "calibration"
    recipes = sorted(root.glob("*.yaml"))
    assert recipes
    for recipe in recipes:
        r = yaml.safe_load(recipe.read_text())
        out = root.parent / r["out"]
        table = load_scale_table(out, embedded.layout, granularity=r["granularity"], config_hash=embedded.config_hash)
        meta = table.meta
        assert (meta["method"], meta["granularity"], meta["corpus"], meta["seq_len"], meta["samples"]) == (
            r["method"],
            r["granularity"],
            r["corpus"],
            r["seq_len"],
            r["samples"],
        )
        assert meta["eval_corpus_overlap"] == 0.0
        # amax/448 of real activations: positive and far below 1 (a unit scale would waste the range)
        assert bool((table.k_scale > 0).all()) and float(table.k_scale.max()) < 1.0
