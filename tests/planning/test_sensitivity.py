"""Per-layer sensitivity: the right schemes are measured, the numbers match a plain KL computation,
the greedy recommendation and its memory cost are checked by hand, and the CLI writes its outputs."""

from __future__ import annotations

import json

import pytest
import torch

from evalkit import quantized_kv
from evalkit.errors import EvalkitError
from evalkit.kv.scheme import parse_scheme
from evalkit.planning.sensitivity import KL, PPL_REL, layer_table, perplexity_measure, plot, recommend

SCHEME = "int4/head/dynamic"  # coarse enough that a random tiny model shows a clear KL


def plain_kl(lm, scheme, ids) -> float:
    """Mean KL(baseline || scheme) per position, full precision, plain torch."""
    with torch.no_grad():
        base = torch.log_softmax(lm.model(input_ids=ids).logits.double(), -1)
        with quantized_kv(lm.model, scheme):
            q = torch.log_softmax(lm.model(input_ids=ids).logits.double(), -1)
    return float((base.exp() * (base - q)).sum(-1)[:, :-1].mean())


def test_one_layer_and_all_but_one_use_the_right_schemes_and_match_plain_kl(tiny):
    ids = torch.randint(0, len(tiny.tokenizer), (2, 48), generator=torch.Generator().manual_seed(1))
    seen = []

    def measure(scheme):
        seen.append(str(scheme))
        return {KL: (plain_kl(tiny, scheme, ids), None, None)}

    table, full = layer_table(tiny, SCHEME, measure)
    L = tiny.layout.num_layers
    assert seen[0] == SCHEME and len(seen) == 1 + 2 * L
    assert f"{SCHEME}+skip=1" in seen and f"{SCHEME}+skip=0" in seen  # (L = 2: one layer == all but the other)
    for _, r in table.iterrows():
        i = int(r["layer"])
        others = ",".join(str(j) for j in range(L) if j != i)
        assert r[f"{KL}_one"] == pytest.approx(plain_kl(tiny, parse_scheme(f"{SCHEME}+skip={others}"), ids), rel=1e-12)
        assert r[f"{KL}_all_but"] == pytest.approx(plain_kl(tiny, parse_scheme(f"{SCHEME}+skip={i}"), ids), rel=1e-12)
        assert r["gain"] == pytest.approx(full[KL][0] - r[f"{KL}_all_but"])
        assert r[f"{KL}_one"] > 0
    assert list(table["rank"]) == list(range(1, L + 1))
    assert table["gain"].is_monotonic_decreasing


class Additive:
    """A synthetic measure: KL = sum of the weights of the quantized layers (records its calls)."""

    def __init__(self, weights):
        self.weights, self.calls = weights, []

    def __call__(self, scheme):
        self.calls.append(scheme.skip_layers)
        kl = sum(w for i, w in enumerate(self.weights) if i not in scheme.skip_layers)
        return {KL: (kl, kl * 0.9, kl * 1.1), PPL_REL: (kl, None, None)}


def fake_lm(layers: int, heads: int = 2, head_dim: int = 16):
    from types import SimpleNamespace

    from evalkit.models.info import KVLayout

    return SimpleNamespace(layout=KVLayout("llama", layers, heads, head_dim, head_dim, (), None, 4096))


def test_recommendation_is_the_smallest_greedy_set_with_exact_memory():
    weights = [0.1, 2.0, 0.3, 1.0, 0.05]  # layer 1 worst, then 3, then 2
    lm = fake_lm(len(weights))
    measure = Additive(weights)
    table, full = layer_table(lm, "fp8_e4m3/tensor/dynamic", measure)
    assert list(table["layer"]) == [1, 3, 2, 0, 4]
    rec = recommend(lm, "fp8_e4m3/tensor/dynamic", measure, table, full, target_kl=0.5, context=1000)
    assert rec.keep == (1, 3) and rec.reached and rec.metrics[KL][0] == pytest.approx(0.45)
    assert rec.scheme == "fp8_e4m3/tensor/dynamic+skip=1,3"
    assert [s["keep"] for s in rec.steps] == [[], [1], [1, 3]]
    # bytes by hand: per layer K and V, 2 heads x 16 dims x 1000 tokens; BF16 2 bytes, FP8 1 byte + one
    # float32 dynamic per-tensor scale per sequence for K and for V
    per_layer_bf16 = 2 * 2 * 16 * 1000 * 2
    per_layer_fp8 = 2 * (2 * 16 * 1000 * 1 + 4)
    assert rec.bytes_bf16 == 5 * per_layer_bf16
    assert rec.bytes_all_quantized == 5 * per_layer_fp8
    assert rec.bytes_recommended == 2 * per_layer_bf16 + 3 * per_layer_fp8
    assert rec.extra_bytes == 2 * (per_layer_bf16 - per_layer_fp8)
    assert "keep layers [1, 3] in BF16" in rec.summary()
    unreachable = recommend(
        lm, "fp8_e4m3/tensor/dynamic", measure, table, full, target_kl=0.01, context=1000, max_keep=2
    )
    assert not unreachable.reached and unreachable.keep == (1, 3)
    everything = recommend(lm, "fp8_e4m3/tensor/dynamic", measure, table, full, target_kl=0.0, context=1000)
    assert everything.reached and everything.keep == (0, 1, 2, 3, 4) and everything.scheme == "auto"


def test_bad_input(tiny):
    m = Additive([1.0, 1.0])
    with pytest.raises(EvalkitError, match="not auto"):
        layer_table(tiny, "auto", m)
    with pytest.raises(EvalkitError, match="already skips"):
        layer_table(tiny, "fp8_e4m3/tensor/dynamic+skip=0", m)
    with pytest.raises(EvalkitError, match="not attention layers"):
        layer_table(tiny, "fp8_e4m3/tensor/dynamic", m, layers=[7])
    table, full = layer_table(tiny, "fp8_e4m3/tensor/dynamic", m)
    with pytest.raises(EvalkitError, match="give a target"):
        recommend(tiny, "fp8_e4m3/tensor/dynamic", m, table, full)
    with pytest.raises(EvalkitError, match=">= 0"):
        recommend(tiny, "fp8_e4m3/tensor/dynamic", m, table, full, target_kl=-1)


def test_perplexity_measure_and_cli_outputs(tiny, tiny_llama_dir, tmp_path, capsys):
    params = dict(window=32, max_windows=3, bootstrap_samples=200)
    measure = perplexity_measure(tiny, params, tmp_path / "work")
    m = measure(parse_scheme(SCHEME))
    assert m[KL][0] > 0 and m[KL][1] <= m[KL][0] <= m[KL][2]
    assert measure(parse_scheme(f"{SCHEME}+skip=0,1"))[KL][0] == 0.0  # nothing quantized
    table, full = layer_table(tiny, SCHEME, measure)
    png = plot(table, tmp_path / "s.png", title="tiny")
    assert png.stat().st_size > 1000
    from evalkit.cli import main

    out = tmp_path / "cli"
    args = [
        "sensitivity",
        "--model",
        str(tiny_llama_dir),
        "--scheme",
        SCHEME,
        "--perplexity-window",
        "32",
        "--perplexity-max-windows",
        "3",
        "--perplexity-bootstrap-samples",
        "200",
        "--target-kl",
        "0",
        "--context",
        "512",
        "--out",
        str(out),
        "--cache-dir",
        str(tmp_path / "work"),
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "keep layers [" in text and "all layers quantized" in text
    rec = json.loads((out / "recommendation.json").read_text())
    assert rec["reached"] and rec["scheme"] == "auto"  # KL 0 needs every layer kept
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert {r["labels"]["layer"] for r in rows} == {0, 1} and all(r["eval"] == "sensitivity" for r in rows)
    assert (out / "sensitivity.png").is_file() and (out / "sensitivity.csv").is_file()
    assert main(args) == 2  # refuses to overwrite
    assert main(["sensitivity", "--model", str(tiny_llama_dir), "--scheme", "auto"]) == 2
    assert main(["sensitivity", "--model", str(tiny_llama_dir), "--scheme", SCHEME, "--target-kl-fraction", "2"]) == 2
    assert "--target-kl-fraction must be in [0, 1]" in capsys.readouterr().err


class Noisy(Additive):
    """Additive, with intervals as wide as ``spread`` (absolute) and a stated sample size."""

    def __init__(self, weights, spread, windows):
        super().__init__(weights)
        self.spread, self.windows = spread, windows

    def __call__(self, scheme):
        kl = super().__call__(scheme)[KL][0]
        return {
            KL: (kl, kl - self.spread, kl + self.spread),
            "n_windows": (float(self.windows), None, None),
            "n_tokens": (128.0 * self.windows, None, None),
        }


def test_no_warning_when_the_sample_resolves_the_kept_layers():
    weights = [0.1, 2.0, 0.3, 1.0, 0.05]
    lm = fake_lm(len(weights))
    measure = Noisy(weights, spread=0.05, windows=20)
    table, full = layer_table(lm, "fp8_e4m3/tensor/dynamic", measure)
    rec = recommend(lm, "fp8_e4m3/tensor/dynamic", measure, table, full, target_kl=0.5, context=1000)
    assert rec.keep == (1, 3) and rec.warnings == [] and "WARNING" not in rec.summary()


def test_too_few_windows_for_any_paired_difference_is_a_warning():
    """The smallest exact signed-rank p-value with W windows is 2 / 2^W: above 0.05 up to W = 5."""
    from evalkit.planning.sensitivity import sample_warnings

    weights = [0.1, 2.0, 0.3, 1.0, 0.05]
    lm = fake_lm(len(weights))
    for windows, warned in ((5, True), (6, False)):
        measure = Noisy(weights, spread=0.05, windows=windows)
        table, full = layer_table(lm, "fp8_e4m3/tensor/dynamic", measure)
        got = sample_warnings(table, full, (1, 3))
        assert bool(got) == warned, (windows, got)
        if warned:
            assert f"{windows} windows" in got[0] and f"2/2^{windows} = {2 / 2**windows:.3g}" in got[0]
    assert sample_warnings(table, full, ()) == []  # nothing kept: nothing to support


def test_kept_layers_inside_the_noise_are_named():
    """Intervals wider than the layers' savings: layer 3's all-but-one interval contains the
    all-layers KL, and it overlaps layer 2's (the best one left quantized)."""
    weights = [0.1, 2.0, 0.3, 1.0, 0.05]
    lm = fake_lm(len(weights))
    measure = Noisy(weights, spread=1.2, windows=20)
    table, full = layer_table(lm, "fp8_e4m3/tensor/dynamic", measure)
    rec = recommend(lm, "fp8_e4m3/tensor/dynamic", measure, table, full, target_kl=0.5, context=1000)
    assert rec.keep == (1, 3) and len(rec.warnings) == 1
    w = rec.warnings[0]
    assert "20 windows, 2560 tokens" in w
    assert "1 of the 2 kept layers save no more KL than the noise" in w and "[3]" in w  # 3.45 - 1.0 +- 1.2 holds 3.45
    assert "not separated from layer 2" in w  # 2.45 +- 1.2 overlaps 3.15 +- 1.2
    assert "WARNING: the sample" in rec.summary()


def test_estimate_and_progress_before_the_layer_sweep(capsys):
    from evalkit.planning.sensitivity import estimate_line

    assert estimate_line(30, 4.0, 30) == (
        "sensitivity: 60 more evaluations (one layer / all but one, 30 layers) at about "
        "4.0 s each (the all-layers one just took that): about 4.0 min; a recommendation "
        "adds up to 30 more (2.0 min)"
    )
    lm = fake_lm(3)
    layer_table(lm, "fp8_e4m3/tensor/dynamic", Additive([1.0, 2.0, 3.0]), progress=True)
    captured = capsys.readouterr()
    assert "sensitivity: 6 more evaluations (one layer / all but one, 3 layers)" in captured.out
    assert "layers: 100%" in captured.err  # the bar
