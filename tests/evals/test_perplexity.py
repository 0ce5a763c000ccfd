"""Perplexity / KL / top-1 agreement against plain independent computations.

Every number the evaluation reports is recomputed here the obvious way: ``model(ids, labels=...)``
over the same windows for perplexity, full-precision ``log_softmax`` of the full logits for KL (the
full-vocabulary reference the 2 KB baseline summary is checked against) and argmax agreement. The
baseline reference is a plain transformers model, loaded here by ``from_pretrained`` and never touched
by evalkit (no ``quantized_kv``, no hooks), so a fault of evalkit's storage path that also shows for the
identity scheme cannot hide on both sides; a quantized scheme's reference is the model hooked by
``quantized_kv`` for it.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from evalkit.data.corpus import load_corpus
from evalkit.errors import EvalkitError
from evalkit.evals.emulation import perplexity as emulated_perplexity
from evalkit.evals.kl_topk import BYTES_PER_POSITION, TAIL_SAMPLES, TOP_K, kl_from_summary, summarize
from evalkit.evals.perplexity.evaluation import PerplexityEval, plan_windows, position_bucket_edges
from evalkit.integration.install import quantized_kv
from evalkit.kv.scheme import Scheme, parse_scheme

QUANT = "int4/tensor/dynamic"


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    from evalkit.models.loading import load_model

    return load_model(str(tiny_llama_dir))


@pytest.fixture(scope="module")
def plain_model(tiny_llama_dir):
    """The tiny llama as transformers loads it, float32 on CPU, with no evalkit code on it."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir), dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    hooks = [
        m
        for m in model.modules()
        if m._forward_hooks or m._forward_pre_hooks or getattr(m, "_forward_hooks_with_kwargs", None)
    ]
    assert not hooks and type(model).__module__.startswith("transformers."), hooks
    return model


@pytest.fixture(scope="module")
def prose(tmp_path_factory):
    """The first 40k characters of the embedded prose as a file corpus (fast to tokenize)."""
    path = tmp_path_factory.mktemp("corpus") / "prose.txt"
    path.write_text(load_corpus("embedded").text[:40_000], encoding="utf-8")
    return f"file:{path}"


def rows_by(rows, labels=None):
    return {r.metric: r for r in rows if r.labels == (labels or {})}


def window_inputs(ev, lm):
    """Input ids and first scored target index per window, rebuilt from the tokenizer directly."""
    ids = lm.tokenizer(load_corpus(ev.params["corpus"]).text, add_special_tokens=False)["input_ids"]
    c = ev.params["window"] - int(ev.bos)
    out = []
    for start, t0 in ev.plan:
        x = ([lm.tokenizer.bos_token_id] if ev.bos else []) + ids[start : start + c]
        out.append((torch.tensor([x]), t0))
    return out


def reference(ev, lm, scheme, plain):
    """The plain way: (scheme ppl, baseline ppl, exact mean KL, top-1 agreement, n tokens), with
    perplexity from ``model(ids, labels=...)`` and KL from full-precision log-softmax. The baseline is
    ``plain`` (transformers' own model, no evalkit hooks); ``scheme`` None: the baseline alone (the
    scheme's numbers None), else the scheme's from ``lm.model`` under ``quantized_kv``."""
    total, base_total, n, kl, agree = 0.0, 0.0, 0, 0.0, 0
    with torch.inference_mode():
        for x, t0 in window_inputs(ev, lm):
            labels = x.clone()
            labels[:, :t0] = -100
            out = plain(x, labels=labels)
            base = out.logits[0, t0 - 1 : -1].double().log_softmax(-1)
            m = x.shape[1] - t0
            base_total += float(out.loss) * m
            n += m
            if scheme is None:
                continue
            with quantized_kv(lm.model, scheme):
                out = lm.model(x, labels=labels)
            total += float(out.loss) * m
            quant = out.logits[0, t0 - 1 : -1].double().log_softmax(-1)
            kl += float((base.exp() * (base - quant)).sum())
            agree += int((base.argmax(-1) == quant.argmax(-1)).sum())
    if scheme is None:
        return None, math.exp(base_total / n), None, None, n
    return math.exp(total / n), math.exp(base_total / n), kl / n, agree / n, n


@pytest.mark.parametrize(
    "n, window, stride, bos",
    [
        (1000, 64, 64, False),
        (1000, 64, 17, False),
        (1000, 64, 64, True),
        (1000, 64, 1, True),
        (130, 64, 50, False),
        (64, 64, 10, False),
    ],
)
def test_each_token_scored_exactly_once(n, window, stride, bos):
    plan = plan_windows(n, window, stride, bos, None)
    c = window - bos
    scored = []
    for start, t0 in plan:
        assert 0 <= start <= n - c and 1 <= t0 < window
        scored += [start + t - int(bos) for t in range(t0, window)]  # corpus index of each target
    assert sorted(scored) == scored and len(set(scored)) == len(scored)
    if stride < c or bos:  # every token is scored once (but the corpus' first, without BOS)
        assert scored == list(range(0 if bos else 1, n))
    else:  # disjoint windows without BOS: each window's first token has no context and is skipped
        assert set(range(n)) - set(scored) == {start for start, t0 in plan if t0 == 1}
    assert plan_windows(n, window, stride, bos, 2) == plan[:2]


def test_bucket_edges_are_powers_of_four():
    assert position_bucket_edges(64) == [0, 64]
    assert position_bucket_edges(1024) == [0, 128, 512, 1024]
    assert position_bucket_edges(8192) == [0, 128, 512, 2048, 8192]
    assert position_bucket_edges(8193) == [0, 128, 512, 2048, 8192, 8193]


def full_kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return (p.double().exp() * (p.double() - q.double())).sum(-1)


@pytest.mark.parametrize("vocab, spread", [(3000, 3.0), (50_000, 2.0), (50_000, 0.5)])
def test_summary_kl_unbiased_above_its_bound_and_zero_on_self(vocab, spread):
    """Peaked and flat distributions (tail mass from ~3 % to ~99 %), perturbed as a KV scheme does:
    the estimate is within 4 reported standard errors (and 1 %) of the full KL, never below the
    proven lower bound, which is never above the full KL; exactly 0 for Q = P."""
    g = torch.Generator().manual_seed(vocab)
    p = (torch.randn(400, vocab, generator=g) * spread).log_softmax(-1)
    q = (p + 0.15 * torch.randn(400, vocab, generator=g)).log_softmax(-1)
    summary = summarize(p, torch.Generator().manual_seed(0))
    assert summary["head"].shape == (400, TOP_K) and summary["tail"].shape == (400, TAIL_SAMPLES)
    assert summary["w"].dtype == torch.float16 and summary["tail_lp"].dtype == torch.float32
    kl, lower, var = kl_from_summary(summary, q)
    exact = full_kl(p, q)
    assert (kl >= 0).all() and (kl >= lower - 1e-6).all()
    assert (lower.double() <= exact * (1 + 1e-3) + 1e-6).all()  # proven, up to the float16 weights
    se = float(var.double().sum().sqrt()) / 400
    assert abs(float(kl.double().mean() - exact.mean())) <= max(4 * se, 1e-6) and se < 0.01 * float(exact.mean())
    assert torch.equal(kl_from_summary(summary, p.clone())[0], torch.zeros(400))
    assert torch.equal(kl_from_summary(summary, p.clone())[1], torch.zeros(400))


def test_summary_of_a_small_vocabulary_is_exact():
    """At most TOP_K tokens: the head is everything, no tail, KL exact up to the float16 weights."""
    g = torch.Generator().manual_seed(1)
    p = (torch.randn(50, TOP_K, generator=g) * 3).log_softmax(-1)
    q = (p + 0.2 * torch.randn(50, TOP_K, generator=g)).log_softmax(-1)
    summary = summarize(p, torch.Generator().manual_seed(0))
    kl, lower, var = kl_from_summary(summary, q)
    assert torch.equal(kl, lower.clamp_min(0)) and torch.equal(var, torch.zeros(50))
    assert torch.allclose(kl.double(), full_kl(p, q), rtol=3e-3, atol=1e-7)


def test_summary_fits_2_kb_per_token():
    assert BYTES_PER_POSITION == TOP_K * 6 + TAIL_SAMPLES * 8 + 24 <= 2048


def test_baseline_matches_plain_transformers(tiny, plain_model, tmp_path, prose):
    ev = PerplexityEval(dict(window=96, stride=40, max_windows=5, corpus=prose, batch_size=2))
    ev.prepare(tiny, tmp_path)
    _, ppl, _, _, n = reference(ev, tiny, None, plain_model)
    rows = rows_by(ev.evaluate(tiny, Scheme()))
    assert rows["kl_mean"].info["kl_lower_bound"] == 0.0 and rows["kl_mean"].info["kl_sampling_se"] == 0.0
    assert rows["n_tokens"].value == n == 95 + 4 * 40
    assert rows["ppl"].value == pytest.approx(ppl, rel=1e-5)
    assert rows["kl_mean"].value == 0.0 and rows["top1_agreement"].value == 1.0
    for metric in ("ppl_delta", "ppl_delta_rel", "kl_mean"):
        assert (rows[metric].value, rows[metric].ci_low, rows[metric].ci_high) == (0.0, 0.0, 0.0)
    assert rows["p_value"].value == 1.0
    info = rows["ppl"].info
    assert info["protocol"]["stride"] == 40 and info["n_windows"] == 5 and len(info["corpus_sha256"]) == 64
    assert info["bootstrap_samples"] == 2000 and info["seed"] == 0


def test_quantized_scheme_matches_plain_computation(tiny, plain_model, tmp_path, prose):
    ev = PerplexityEval(dict(window=200, stride=100, max_windows=4, bootstrap_samples=500, corpus=prose))
    ev.prepare(tiny, tmp_path)
    scheme = parse_scheme(QUANT)
    ppl, base_ppl, kl, agree, n = reference(ev, tiny, scheme, plain_model)
    rows = ev.evaluate(tiny, scheme)
    top = rows_by(rows)
    assert top["ppl"].value == pytest.approx(ppl, rel=1e-5)
    assert top["ppl_delta"].value == pytest.approx(ppl - base_ppl, rel=1e-3, abs=1e-4)
    assert top["ppl_delta_rel"].value == pytest.approx(ppl / base_ppl - 1, rel=1e-3, abs=1e-7)
    info = top["kl_mean"].info
    assert kl > 1e-6 and top["kl_mean"].value == pytest.approx(kl, rel=1e-2, abs=4 * info["kl_sampling_se"])
    assert (
        info["kl_lower_bound"] <= kl and info["kl_method"].startswith(f"top-{TOP_K}") and 0 < info["kl_tail_mass"] < 1
    )
    assert top["top1_agreement"].value == pytest.approx(agree, abs=1.5 / n)
    assert 0 <= top["kl_mean"].ci_low <= top["kl_mean"].value <= top["kl_mean"].ci_high
    assert top["ppl_delta"].ci_low <= top["ppl_delta"].value <= top["ppl_delta"].ci_high
    assert 0 <= top["p_value"].value <= 1 and top["p_value"].info["p_value_test"].startswith("paired t test")
    # position buckets: 0-127 and 128-199, counts add up to the total
    buckets = {r.labels["bucket"]: r.value for r in rows if r.metric == "n_tokens" and r.labels}
    assert buckets == {"0-127": 127 + 3 * 28, "128-199": 4 * 72}
    assert sum(buckets.values()) == top["n_tokens"].value == n


def test_identical_across_runs_and_baseline_cached(tiny, tmp_path, monkeypatch, prose):
    params = dict(window=64, max_windows=3, bootstrap_samples=300, seed=3, corpus=prose)
    ev = PerplexityEval(params)
    ev.prepare(tiny, tmp_path)
    first = [r.to_dict() for r in ev.evaluate(tiny, parse_scheme(QUANT))]
    assert [r.to_dict() for r in ev.evaluate(tiny, parse_scheme(QUANT))] == first
    monkeypatch.setattr(emulated_perplexity, "compute_baseline", lambda *a: pytest.fail("baseline recomputed"))
    again = PerplexityEval(params)
    again.prepare(tiny, tmp_path)
    assert [r.to_dict() for r in again.evaluate(tiny, parse_scheme(QUANT))] == first
    assert len(list((tmp_path / "perplexity").iterdir())) == 1


def test_stale_or_damaged_baseline_is_recomputed(tiny, tmp_path, prose):
    """A cached baseline from an older evalkit (a tensor missing) or a truncated log-prob file is a
    cache miss: recomputed, with the same numbers, never a KeyError mid-sweep."""
    from safetensors.torch import load_file, save_file

    params = dict(window=64, max_windows=2, bootstrap_samples=200, corpus=prose)
    ev = PerplexityEval(params)
    ev.prepare(tiny, tmp_path)
    first = [r.to_dict() for r in ev.evaluate(tiny, parse_scheme(QUANT))]
    (folder,) = list((tmp_path / "perplexity").iterdir())
    old = load_file(folder / "baseline.safetensors")
    save_file({k: v for k, v in old.items() if k != "log_tail"}, folder / "baseline.safetensors")  # as the v2 layout
    again = PerplexityEval(params)
    again.prepare(tiny, tmp_path)
    assert [r.to_dict() for r in again.evaluate(tiny, parse_scheme(QUANT))] == first
    head = folder / "head.npy"
    head.write_bytes(head.read_bytes()[:1000])
    third = PerplexityEval(params)
    third.prepare(tiny, tmp_path)
    assert [r.to_dict() for r in third.evaluate(tiny, parse_scheme(QUANT))] == first
    assert list((tmp_path / "perplexity").iterdir()) == [folder]


@pytest.mark.parametrize(
    "params, message",
    [
        (dict(corpus="nope", window=64), "unknown corpus"),
        (dict(window=600), "longer than the model's maximum 512"),
        (dict(stride=0), "stride 0 must be in 1..window"),
        (dict(window=64, stride=65), "stride 65 must be in 1..window"),
        (dict(window=64, max_tokens=30, corpus="PROSE"), "fewer than one window needs"),
        (dict(window=1), "too short"),
        (dict(bogus=1), "unknown perplexity parameter"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tiny, tmp_path, params, message, prose):
    params = {k: (prose if v == "PROSE" else v) for k, v in params.items()}
    with pytest.raises(EvalkitError, match=message) as err:
        PerplexityEval(params).prepare(tiny, tmp_path)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "perplexity").exists()


def test_empty_corpus_file(tiny, tmp_path):
    (tmp_path / "blank.txt").write_text("   \n")
    with pytest.raises(EvalkitError, match="is empty"):
        PerplexityEval(dict(corpus=f"file:{tmp_path / 'blank.txt'}", window=64)).prepare(tiny, tmp_path)


def test_cli_run_json_and_exit_code(tiny_llama_dir, tmp_path, capsys, prose):
    from evalkit.cli import main

    argv = [
        "run",
        "--model",
        str(tiny_llama_dir),
        "--schemes",
        "auto,fp8_e4m3/head/dynamic",
        "--eval",
        "perplexity",
        "--perplexity-corpus",
        prose,
        "--perplexity-window",
        "64",
        "--perplexity-stride",
        "32",
        "--perplexity-max-windows",
        "3",
        "--json",
        "--out",
        str(tmp_path / "out"),
        "--cache-dir",
        str(tmp_path),
        "--perplexity-bootstrap-samples",
        "200",
    ]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    plain = {(r["scheme"], r["metric"]): r for r in rows if not r["labels"]}
    assert plain[("auto", "kl_mean")]["value"] == 0.0
    assert plain[("fp8_e4m3/head/dynamic", "n_tokens")]["value"] == 63 + 2 * 32
    assert set(PerplexityEval.summary_metrics) <= {m for _, m in plain}
    from evalkit.sweep.store import ResultStore

    store = ResultStore(tmp_path / "out")  # the results store a sweep writes, artifacts under runs/<id16>/
    run_id = next(i for i, rec in store.read().complete.items() if rec["scheme"] == "fp8_e4m3/head/dynamic")
    windows = pd.read_csv(store.artifact_dir(run_id) / "perplexity_windows.csv")
    assert windows["n_tokens"].sum() == 63 + 2 * 32 and (windows["kl_sum"] > 0).all()
    assert main(argv[:-4] + ["--perplexity-stride", "0"]) == 2
    assert "stride 0" in capsys.readouterr().err


@pytest.mark.slow
def test_embedded_model_baseline_and_fp8(embedded, tmp_path):
    path = tmp_path / "prose.txt"
    path.write_text(load_corpus("embedded").text[:3000])
    ev = PerplexityEval(dict(window=96, max_windows=2, bootstrap_samples=200, corpus=f"file:{path}"))
    ev.prepare(embedded, tmp_path)
    scheme = parse_scheme("fp8_e4m3/head/dynamic")
    ppl, base_ppl, kl, agree, n = reference(ev, embedded, scheme, embedded.model)  # its own forward, no hooks
    base = rows_by(ev.evaluate(embedded, Scheme()))
    quant = rows_by(ev.evaluate(embedded, scheme))
    assert base["ppl"].value == pytest.approx(base_ppl, rel=1e-5)
    assert 3 < base["ppl"].value < 100  # documentation prose for a small instruct model
    assert base["kl_mean"].value == 0.0 and base["top1_agreement"].value == 1.0
    assert quant["ppl"].value == pytest.approx(ppl, rel=1e-5)
    assert kl > 0 and quant["kl_mean"].value == pytest.approx(kl, rel=0.01)  # against the full-vocabulary KL
    assert quant["kl_mean"].info["kl_lower_bound"] <= kl
    assert quant["top1_agreement"].value == pytest.approx(agree, abs=1.5 / n)
    assert np.isfinite(quant["ppl_delta"].ci_low)


@pytest.mark.slow
def test_llm_vocabulary_baseline_fits_2_kb_per_token(tiny_tokenizer_dir, tmp_path, prose):
    """A llama with a 131072-token vocabulary (hidden 64): the cached baseline takes at most 2 KB per
    scored token on disk (files and all), identity KL is exactly 0 and a scheme's KL matches the
    full-vocabulary KL."""
    from transformers import AutoTokenizer

    from evalkit.models.loading import load_model

    from tests.tiny_models import tiny_model

    folder = tmp_path / "llama128k"
    tiny_model("llama", vocab=131072).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_tokenizer_dir).save_pretrained(folder)
    lm = load_model(str(folder))
    ev = PerplexityEval(dict(window=128, max_windows=4, bootstrap_samples=200, corpus=prose))
    ev.prepare(lm, tmp_path / "work")
    n = int(ev.offsets[-1])
    on_disk = sum(f.stat().st_size for f in ev.backend.perplexity.dir.iterdir())
    assert n == 4 * 127 and on_disk / n <= 2048, on_disk / n
    assert rows_by(ev.evaluate(lm, Scheme()))["kl_mean"].value == 0.0
    scheme = parse_scheme("int4/tensor/dynamic")
    _, _, kl, _, _ = reference(ev, lm, scheme, lm.model)
    got = rows_by(ev.evaluate(lm, scheme))["kl_mean"]
    assert got.value == pytest.approx(kl, rel=0.01, abs=4 * got.info["kl_sampling_se"])
