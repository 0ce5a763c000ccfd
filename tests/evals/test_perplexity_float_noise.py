"""Float noise in the perplexity intervals (``float_noise_seeds``): the reruns on perturbed weight
copies equal independent runs on those copies, their spread widens the interval by the documented
formula, their baselines are cached, and with the option off nothing changes (rows, run ids).
Also the llama.cpp-style mean Δp row against a plain computation."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from evalkit.data.corpus import load_corpus
from evalkit.errors import EvalkitError
from evalkit.evals.backend import Backend, Capabilities
from evalkit.evals.emulation import perplexity as emulated_perplexity
from evalkit.evals.float_noise import perturbed_model
from evalkit.evals.perplexity.evaluation import PerplexityEval
from evalkit.evals.perplexity.float_spread import combine, t_quantile
from evalkit.kv.scheme import parse_scheme

QUANT = "int4/tensor/unit"  # coarse: a change large against float rounding
SMALL = dict(window=96, max_windows=2, bootstrap_samples=200)


@pytest.fixture(scope="module")
def prose(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "prose.txt"
    path.write_text(load_corpus("embedded").text[:20_000], encoding="utf-8")
    return f"file:{path}"


def overall(rows):
    return {r.metric: r for r in rows if not r.labels}


def test_combine_is_the_mean_with_a_quadrature_prediction_interval():
    value, ci, reruns = 0.010, (0.004, 0.018), [0.012, 0.007, 0.011]
    mean, (lo, hi), info = combine(value, ci, reruns, [1, 2, 3], 1.0)
    every = [value, *reruns]
    s = float(np.std(every, ddof=1))
    t = float(stats.t.ppf(0.975, 3))
    f = t * s * math.sqrt(1 + 1 / 4)  # a prediction interval for one more realisation around the mean of 4
    assert mean == pytest.approx(sum(every) / 4) and info["unperturbed"] == value  # the mean, not one draw
    assert t == pytest.approx(3.182446, abs=1e-6) and info["t"] == t and info["sd"] == pytest.approx(s)
    assert lo == pytest.approx(mean - math.sqrt(0.006**2 + f**2))
    assert hi == pytest.approx(mean + math.sqrt(0.008**2 + f**2))
    assert info["range"] == pytest.approx(0.012 - 0.007) and info["values"] == reruns and info["seeds"] == [1, 2, 3]
    assert info["ci_sampling"] == ci
    # no spread: the windows interval unchanged; no windows interval: the float term alone
    assert combine(value, ci, [value, value], [1, 2], 1.0)[1] == pytest.approx(ci)
    m2, (lo2, hi2), _ = combine(1.0, (None, None), [1.1, 0.9], [1, 2], 1.0)
    assert m2 == pytest.approx(1.0)
    assert hi2 - 1.0 == pytest.approx(t_quantile(3) * 0.1 * math.sqrt(4 / 3)) and 1.0 - lo2 == pytest.approx(hi2 - 1.0)


def test_perturbed_model_moves_every_parameter_and_no_buffer(tiny):
    """Parameters move (each tensor, by a few ulps, seeded); buffers such as rotary ``inv_freq`` are
    config-derived constants and stay bit for bit (float_noise's docstring says why); the original
    model is untouched."""
    import torch

    from evalkit.evals.float_noise import perturb_, ulp

    before = {n: p.detach().clone() for n, p in tiny.model.named_parameters()}
    buffers = {n: b for n, b in tiny.model.named_buffers() if b.is_floating_point()}
    assert any(n.endswith("inv_freq") for n in buffers)  # the case: a float buffer to leave alone
    clone, again = perturbed_model(tiny.model, 7), perturbed_model(tiny.model, 7)
    moved = dict(clone.named_parameters())
    for n, p in before.items():
        steps = (moved[n].detach() - p) / ulp(p)
        assert (steps != 0).any() and steps.abs().max() <= 8, n
        assert torch.equal(moved[n], dict(again.named_parameters())[n]), n  # seeded
        assert torch.equal(dict(tiny.model.named_parameters())[n], p), n  # the original unchanged
    for n, b in clone.named_buffers():
        if n in buffers:
            assert torch.equal(b, buffers[n]), n
    fill = torch.full((64,), torch.finfo(torch.float32).min)  # a mask fill: one ulp up overflows
    perturb_(fill, torch.Generator().manual_seed(0))
    assert not fill.isfinite().any()  # why buffers are left alone


def test_off_by_default_and_out_of_the_run_id(prose):
    off = PerplexityEval(dict(corpus=prose, **SMALL))
    on = PerplexityEval(dict(corpus=prose, float_noise_seeds=3, **SMALL))
    assert off.params["float_noise_seeds"] == 0 and "float_noise_seeds" not in off.canonical_params()
    assert on.canonical_params()["float_noise_seeds"] == 3
    with pytest.raises(EvalkitError, match="float-noise-seeds"):
        PerplexityEval(dict(corpus=prose, float_noise_seeds=-1))


def test_reruns_equal_runs_on_the_perturbed_copies(tiny, tmp_path, prose, monkeypatch):
    scheme = parse_scheme(QUANT)
    ev = PerplexityEval(dict(corpus=prose, float_noise_seeds=2, **SMALL))
    ev.prepare(tiny, tmp_path)
    rows = ev.evaluate(tiny, scheme)
    plain = PerplexityEval(dict(corpus=prose, **SMALL))
    plain.prepare(tiny, tmp_path / "plain")
    base_rows = overall(plain.evaluate(tiny, scheme))
    got = overall(rows)
    for seed in (1, 2):  # each rerun = a plain run on that perturbed copy, against its own baseline
        copy = dataclasses.replace(tiny, model=perturbed_model(tiny.model, seed))
        other = PerplexityEval(dict(corpus=prose, **SMALL))
        other.prepare(copy, tmp_path / f"copy{seed}")
        ref = overall(other.evaluate(copy, scheme))
        for metric in ("ppl", "ppl_delta_rel", "kl_mean", "top1_agreement", "dp_mean"):
            assert got[metric].info["float_noise"]["values"][seed - 1] == pytest.approx(ref[metric].value, rel=1e-9)
    for metric in ("ppl", "ppl_delta_rel", "kl_mean", "top1_agreement", "dp_mean"):
        r, base = got[metric], base_rows[metric]
        reruns = r.info["float_noise"]["values"]
        assert r.info["float_noise"]["unperturbed"] == base.value  # the unperturbed run, kept in the info
        assert r.value == pytest.approx((base.value + sum(reruns)) / 3, rel=1e-12)  # the value: the mean of all 3
        assert r.info["ci_sampling"] == [base.ci_low, base.ci_high]
        mean, (lo, hi), _ = combine(base.value, (base.ci_low, base.ci_high), reruns, [1, 2], 1.0)
        assert (r.value, r.ci_low, r.ci_high) == (mean, lo, hi)
        assert hi - lo >= base.ci_high - base.ci_low
        assert "perturbed-weight reruns" in r.info["ci"]
    assert got["ppl_delta_rel"].info["float_noise"]["sd"] > 0  # the copies do move the numbers
    assert all("float_noise" in r.info for r in rows if r.metric == "ppl_delta_rel")  # position buckets too
    # three baselines cached (unperturbed + 2 copies); a second prepare recomputes none
    assert len([d for d in (tmp_path / "perplexity").iterdir() if (d / "meta.json").is_file()]) == 3
    monkeypatch.setattr(emulated_perplexity, "compute_baseline", lambda *a: pytest.fail("baseline recomputed"))
    again = PerplexityEval(dict(corpus=prose, float_noise_seeds=2, **SMALL))
    again.prepare(tiny, tmp_path)
    assert [r.value for r in again.evaluate(tiny, scheme)] == [r.value for r in rows]


def test_dp_mean_is_the_mean_change_of_the_correct_token_probability(tiny, tmp_path, prose):
    ev = PerplexityEval(dict(corpus=prose, **SMALL))
    ev.prepare(tiny, tmp_path)
    scores = ev.token_scores(tiny, parse_scheme(QUANT))
    rows = ev._rows(scores)
    dp = overall(rows)["dp_mean"]
    plain = float(np.mean(np.exp(-scores.nll.numpy()) - np.exp(-scores.base_nll.numpy())))
    assert dp.value == pytest.approx(plain, rel=1e-12) and dp.ci_low <= dp.value <= dp.ci_high
    assert [r.metric for r in rows[:8]] == [
        "ppl",
        "ppl_delta",
        "ppl_delta_rel",
        "kl_mean",
        "top1_agreement",
        "p_value",
        "n_tokens",
        "dp_mean",
    ]
    identity = overall(ev.evaluate(tiny, parse_scheme("auto")))["dp_mean"]
    assert identity.value == 0.0


def test_an_engine_backend_refuses_float_noise(tiny, tmp_path, prose):
    class Engine(Backend):
        capabilities = Capabilities("fake-engine 1.0")

        def prepare(self, request, lm, workdir):
            pass

    ev = PerplexityEval(dict(corpus=prose, float_noise_seeds=1, **SMALL), backend=Engine())
    with pytest.raises(EvalkitError, match="fake-engine 1.0 cannot") as err:
        ev.prepare(tiny, tmp_path)
    assert "\n" not in str(err.value)
