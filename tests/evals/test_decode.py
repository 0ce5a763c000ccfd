"""The decode evaluation against independent computations, its consistency checks and bad input.

The reference is written here the plain way: the model without evalkit (transformers' own
``DynamicCache``) for the baseline, ``quantized_kv`` + ``model(...)`` one token per forward for a
scheme, full ``log_softmax`` in float64 for KL / NLL, ``argmax`` of the logits for top-1, and
``model.generate`` for greedy continuations.

The tiny model here is the tests' tiny llama with ``initializer_range = 0.2`` (ten times the
default): with the default, its random weights give near-uniform next-token distributions whose
KL under any scheme (~1e-5 nats) sits at the float32 noise floor of the KL estimate, so nothing
could be told apart. At 0.2 the KLs are 1e-2 .. 1e-1 nats.

KL estimate and tolerances. The decode eval stores the baseline as the 2 KB summary perplexity uses
(evalkit.evals.kl_topk: top-160 exact, tail mass, 128 stratified tail samples) and reports, per
position, an unbiased estimate K^ that never falls below a proven lower bound L. Against the exact
float64 KL: L <= KL per position (up to the float16 weights' rounding, 1e-3 relative), and
|K^ - KL| <= 6 of its own sampling standard deviations (+ 2e-3 KL for rounding), the mean within
4 standard errors of the mean (+ 1e-3 relative). Observed on the tiny model (vocabulary 512, tail
mass 14 %): at most 4.1 sd per position, means within 0.15-0.7 %.

Decode against one forward is compared like with like: the same stored summary and estimator
applied to the decode's and the forward's log-probs, so sampling noise cancels and what is left
is float order (decode attention runs other kernels than a full forward): per position
``|KL_decode - KL_forward| <= 1e-2 * KL + 1e-4`` nats and the means within 1 %.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from evalkit import quantized_kv
from evalkit.data.corpus import load_corpus
from evalkit.errors import EvalkitError
from evalkit.evals.decode.divergence import censored_median, first_divergence, identical_share, median_interval
from evalkit.evals.decode.evaluation import DecodeEval, DecodeParams, sequence_starts, step_bucket_edges
from evalkit.evals.decode.loop import decode_logits
from evalkit.evals.emulation.decode import DecodeEmulation
from evalkit.evals.output_head import OutputHead
from evalkit.integration.hf_compat import cache_inputs, output_cache
from evalkit.kv.scheme import Scheme, parse_scheme

P, T, N = 24, 24, 2
QUANT = "int4/tensor/dynamic"


@pytest.fixture(scope="module")
def sharp_dir(tmp_path_factory, tiny_tokenizer_dir):
    """The tiny llama (tokenizer included) with initializer_range 0.2: sharp distributions (module doc)."""
    import transformers as tf

    from tests.tiny_models import tiny_config

    tok = tf.AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    cfg = tiny_config("llama", vocab=len(tok))
    cfg.initializer_range = 0.2
    cfg.eos_token_id, cfg.bos_token_id, cfg.pad_token_id = tok.eos_token_id, tok.bos_token_id, tok.pad_token_id
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    folder = tmp_path_factory.mktemp("sharp_llama")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def sharp(sharp_dir):
    from evalkit.models.loading import load_model

    return load_model(str(sharp_dir))


@pytest.fixture(scope="module")
def prose(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "prose.txt"
    path.write_text(load_corpus("embedded").text[:40_000], encoding="utf-8")
    return f"file:{path}"


@pytest.fixture(scope="module")
def prepared(sharp, prose, tmp_path_factory):
    ev = DecodeEval(dict(prefill=P, decode=T, sequences=N, buckets=3, bootstrap_samples=200, corpus=prose))
    ev.prepare(sharp, tmp_path_factory.mktemp("work"))
    return ev


def by_metric(rows, labels=None):
    return {r.metric: r for r in rows if r.labels == (labels or {})}


# ---- parameters and small pieces ---------------------------------------------------------------
def test_params_defaults_flags_and_validation():
    assert DecodeEval.validate({}) == dict(
        corpus="embedded",
        prefill=512,
        decode=1536,
        sequences=4,
        batch_size=8,
        buckets=8,
        bos=None,
        interval="t",
        bootstrap_samples=2000,
        seed=0,
    )
    assert DecodeParams(prefill=3, decode=5).length == 8
    for params, message in [
        (dict(decode=0), "decode = 0 is too small: use --decode-tokens 1 or more"),
        (dict(prefill=0), "prefill = 0 is too small"),
        (dict(sequences="2"), "must be an integer"),
        (dict(buckets=True), "must be an integer"),
        (dict(bos="yes"), "bos must be"),
        (dict(corpus=""), "needs a corpus"),
        (dict(window=3), "unknown decode parameter"),
        (dict(interval="bca"), "interval method 'bca' is not known: use --decode-interval t or bootstrap"),
    ]:
        with pytest.raises(EvalkitError, match=message) as err:
            DecodeEval(params)
        assert "\n" not in str(err.value)
    import argparse

    parser = argparse.ArgumentParser()
    DecodeEval.add_arguments(parser)
    args = parser.parse_args(
        [
            "--decode-prefill",
            "64",
            "--decode-tokens",
            "32",
            "--decode-sequences",
            "3",
            "--no-decode-bos",
            "--decode-corpus",
            "wikitext2",
        ]
    )
    params = DecodeEval.params_from_args(args)
    assert DecodeEval.validate(params) == {
        **DecodeEval.validate({}),
        "prefill": 64,
        "decode": 32,
        "sequences": 3,
        "bos": False,
        "corpus": "wikitext2",
    }


def test_bucket_edges_and_sequence_starts():
    assert step_bucket_edges(256, 8) == [0, 32, 64, 96, 128, 160, 192, 224, 256]
    assert step_bucket_edges(10, 4) == [0, 2, 5, 7, 10]
    assert step_bucket_edges(3, 8) == [0, 1, 2, 3]  # never an empty bucket
    starts = sequence_starts(1000, 100, 4)
    assert starts[0] == 0 and starts[-1] == 900 and all(b - a >= 100 for a, b in zip(starts, starts[1:]))
    assert sequence_starts(400, 100, 4) == [0, 100, 200, 300]
    with pytest.raises(EvalkitError, match=r"fewer than 5 sequences x 100 tokens = 500"):
        sequence_starts(499, 100, 5)


def test_first_divergence_censored_median_and_share():
    agree = np.array([[1, 1, 0, 1], [1, 1, 1, 1], [0, 1, 1, 1]], dtype=bool)
    assert first_divergence(agree).tolist() == [2, 4, 0]
    # order-statistic interval: none below 6 sequences, [X(1), X(6)] at 6 (coverage 1 - 2/64)
    assert median_interval(5) is None
    assert median_interval(6) == (1, 6, pytest.approx(1 - 2 / 64))
    assert median_interval(20)[:2] == (6, 15)  # the textbook ranks for n = 20
    value, low, high, info = censored_median(np.array([3, 1, 7, 2, 9, 9]), horizon=9)
    assert (value, low, high) == (3.0, 1.0, 9.0) and not info["censored"] and info["upper_censored"]
    value, *_, info = censored_median(np.array([9, 9, 1]), horizon=9)
    assert value == 9.0 and info["censored"]  # half or more never diverged: "9 or later"
    assert censored_median(np.array([4, 2]), horizon=9)[:3] == (2.0, None, None)  # lower (Kaplan-Meier) median
    share, low, high, k = identical_share(np.array([9, 9, 1, 0]), 9)
    assert (share, k) == (0.5, 2) and 0 < low < 0.5 < high < 1


# ---- exactness -----------------------------------------------------------------------------------
def test_identity_scheme_is_exact(sharp, prepared):
    pos = prepared.positions(sharp, Scheme())
    assert (pos["kl"] == 0).all() and pos["agree"].all()
    assert np.array_equal(pos["nll"], pos["base_nll"])
    rows = by_metric(prepared.rows(pos))
    for metric in ("kl_mean", "nll_delta", "free_kl_mean"):
        assert (rows[metric].value, rows[metric].ci_low, rows[metric].ci_high) == (0.0, 0.0, 0.0)
    assert rows["top1_agreement"].value == 1.0
    assert rows["first_divergence"].value == T and rows["first_divergence"].info["censored"]
    assert rows["identical_share"].value == 1.0
    assert rows["n_tokens"].value == N * T


def plain_reference(lm, ids, scheme):
    """Per-position float64 log-probs (rows, T, vocab) of teacher-forced decoding the plain way:
    a prefill of P tokens, then one ``model(...)`` per token; no evalkit for the baseline."""
    from transformers import DynamicCache

    out = []
    with torch.inference_mode():
        if scheme is None:
            cache = DynamicCache(config=lm.model.config)
            logits = [lm.model(ids[:, :P], **cache_inputs(lm.model, cache)).logits[:, -1]]
            for t in range(P, P + T - 1):
                logits.append(lm.model(ids[:, t : t + 1], **cache_inputs(lm.model, cache)).logits[:, -1])
        else:
            with quantized_kv(lm.model, scheme):
                res = lm.model(ids[:, :P])
                logits, cache = [res.logits[:, -1]], output_cache(res)
                for t in range(P, P + T - 1):
                    logits.append(lm.model(ids[:, t : t + 1], **cache_inputs(lm.model, cache)).logits[:, -1])
    for lg in logits:
        out.append(lg.double().log_softmax(-1))
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("scheme", [QUANT, "fp8_e4m3/head/dynamic"])
def test_per_position_kl_top1_nll_match_a_plain_float64_computation(sharp, prepared, scheme):
    ids = prepared.inputs
    pos = prepared.positions(sharp, parse_scheme(scheme))
    base, quant = plain_reference(sharp, ids, None), plain_reference(sharp, ids, scheme)
    kl = (base.exp() * (base - quant)).sum(-1).numpy()
    assert kl.mean() > 1e-3  # a real difference to measure
    sd = np.sqrt(pos["kl_var"])
    assert np.all(pos["kl_lower"] <= kl * (1 + 1e-3) + 1e-6) and np.all(pos["kl"] >= pos["kl_lower"] - 1e-6)
    assert np.all(np.abs(pos["kl"] - kl) <= 6 * sd + 2e-3 * kl + 1e-6)
    se_mean = math.sqrt(pos["kl_var"].sum()) / kl.size
    assert abs(pos["kl"].mean() - kl.mean()) <= 4 * se_mean + 1e-3 * kl.mean()
    assert np.array_equal(pos["agree"], (base.argmax(-1) == quant.argmax(-1)).numpy())
    target = ids[:, P:, None]
    assert np.allclose(pos["nll"], -quant.gather(-1, target)[..., 0].numpy(), atol=1e-4)
    assert np.allclose(pos["base_nll"], -base.gather(-1, target)[..., 0].numpy(), atol=1e-4)
    # the rows aggregate exactly these numbers (the first row: teacher-forced on the corpus)
    rows = prepared.rows(pos)
    top = by_metric(rows)
    assert top["kl_mean"].value == pytest.approx(pos["kl"][:N].mean(), rel=1e-12)
    assert top["free_kl_mean"].value == pytest.approx(pos["kl"][N:].mean(), rel=1e-12)
    assert top["nll_delta"].value == pytest.approx((pos["nll"][:N] - pos["base_nll"][:N]).mean(), rel=1e-9, abs=1e-12)
    assert top["kl_mean"].ci_low <= top["kl_mean"].value <= top["kl_mean"].ci_high
    edges = step_bucket_edges(T, 3)
    last = by_metric(rows, {"bucket": f"{P + edges[-2]}-{P + T - 1}"})
    assert last["kl_mean"].value == pytest.approx(pos["kl"][:N, edges[-2] :].mean(), rel=1e-12)
    assert sum(r.value for r in rows if r.metric == "n_tokens" and r.labels) == N * T
    # kept in float64, as perplexity keeps them: not float32-rounded
    for key in ("kl", "kl_lower"):  # (nll is a float32 log-softmax value, as in perplexity)
        assert pos[key].dtype == np.float64 and (pos[key].astype(np.float32).astype(np.float64) != pos[key]).any(), key
    # every interval says it lacks float spread (perplexity's reruns have no decode counterpart)
    assert all(
        r.info["ci"].endswith(", without float spread (not measured for decode)") for r in rows if r.ci_low is not None
    )
    assert top["first_divergence"].info["ci"].startswith("exact order-statistic interval")


def test_greedy_rows_and_first_divergence_match_generate(sharp, prepared):
    """The baseline's greedy rows are what ``generate`` produces, and the first divergence read off
    the teacher-forced pass is where the scheme's own ``generate`` first differs."""
    from transformers import GenerationConfig

    prompts = prepared.inputs[N:, :P]
    greedy = GenerationConfig(
        do_sample=False, max_new_tokens=T, eos_token_id=None, pad_token_id=sharp.tokenizer.pad_token_id
    )
    with torch.inference_mode():
        plain = sharp.model.generate(prompts, generation_config=greedy)[:, P:]
        with quantized_kv(sharp.model, QUANT):
            quant = sharp.model.generate(prompts, generation_config=greedy)[:, P:]
    assert torch.equal(prepared.inputs[N:, P:], plain)
    expected = [int((a != b).int().argmax()) if (a != b).any() else T for a, b in zip(plain, quant)]
    assert expected != [T] * N  # the scheme does diverge here
    rows = by_metric(prepared.rows(prepared.positions(sharp, parse_scheme(QUANT))))
    assert rows["first_divergence"].info["steps"] == expected
    assert rows["first_divergence"].value == sorted(expected)[math.ceil(N / 2) - 1]


# ---- consistency: decode vs one forward ----------------------------------------------------------
def single_forward_kl(lm, ev, scheme, caches: list | None = None):
    """KL of one forward over the corpus rows' first P + T - 1 tokens at the T decode positions, by the
    eval's own estimator against its stored baseline summaries (so sampling noise is the same).
    ``caches``: the forward's storage cache is appended to it."""
    from evalkit.evals.emulation.decode import ARRAYS
    from evalkit.evals.kl_topk import kl_from_summary

    n, prefill, steps = ev.p.sequences, ev.p.prefill, ev.p.decode
    with torch.inference_mode(), quantized_kv(lm.model, scheme):
        out = lm.model(ev.inputs[:n, : prefill + steps - 1])
        lq = out.logits[:, prefill - 1 :].float().log_softmax(-1)
    if caches is not None:
        caches.append(output_cache(out))
    base = ev.backend.decode.base
    summary = {
        k: torch.from_numpy(np.array(base[k][:n])) if k in ARRAYS else base[k][:n] for k in (*ARRAYS, "t", "log_tail")
    }
    summary = {k: v.reshape(n * steps, *v.shape[2:]) for k, v in summary.items()}
    return kl_from_summary(summary, lq.reshape(n * steps, -1))[0].double().reshape(n, steps).numpy()


@pytest.fixture(scope="module")
def static_table(sharp, tmp_path_factory):
    from evalkit.kv.scale_table import ScaleTable, save_scale_table
    from evalkit.models.info import config_hash

    path = tmp_path_factory.mktemp("scales") / "tensor.safetensors"
    save_scale_table(
        path,
        ScaleTable(
            torch.tensor([0.01, 0.02]),
            torch.tensor([0.005, 0.01]),
            {"config_hash": config_hash(sharp.model.config), "format": "fp8_e4m3"},
        ),
    )
    return path


@pytest.mark.parametrize(
    "scheme",
    [
        "fp8_e4m3/token/dynamic",
        "int4/group8/dynamic",
        "int4_asym/token/dynamic",
        "fp8_e4m3/tensor/unit",
        "fp8_e5m2/head/unit",
        "STATIC",
    ],
)
def test_per_token_and_fixed_scales_decode_equals_one_forward(sharp, prepared, static_table, scheme):
    """A token's codes do not depend on later tokens, so decoding changes nothing but float order."""
    scheme = f"fp8_e4m3/tensor/static+scales={static_table}" if scheme == "STATIC" else scheme
    decoded = prepared.positions(sharp, parse_scheme(scheme))["kl"][:N]
    forward = single_forward_kl(sharp, prepared, scheme)
    assert forward.mean() > 1e-3
    assert np.all(np.abs(decoded - forward) <= 1e-2 * forward + 1e-4)
    assert decoded.mean() == pytest.approx(forward.mean(), rel=1e-2)


@pytest.mark.parametrize("scheme", ["int4/tensor/dynamic", "int4/head/dynamic"])
def test_frozen_dynamic_scales_make_decode_differ_from_one_forward(sharp, prepared, scheme):
    """Dynamic tensor/head scales come from the prefill only in decode, from all tokens in one forward."""
    decoded = prepared.positions(sharp, parse_scheme(scheme))["kl"][:N]
    forward = single_forward_kl(sharp, prepared, scheme)
    assert np.abs(decoded - forward).max() > 0.1 * forward.mean()
    assert not np.all(np.abs(decoded - forward) <= 1e-2 * forward + 1e-4)


# ---- the loop itself -----------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["fp8_e4m3/tensor/dynamic", "fp8_e4m3/block4/dynamic"])
def test_left_padded_batch_gives_each_sequence_its_own_numbers(sharp, scheme):
    """A sequence decoded in a left-padded batch gets the logits it gets alone (scales per sequence)."""
    g = torch.Generator().manual_seed(1)
    long, short = torch.randint(3, 500, (1, 30), generator=g), torch.randint(3, 500, (1, 25), generator=g)
    pad = 5
    ids = torch.cat([long, torch.cat([torch.zeros(1, pad, dtype=torch.long), short], dim=1)])
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    head = OutputHead(sharp.model, "decode")

    def run(x, m, prefill, free=None):
        with quantized_kv(sharp.model, scheme) as session, torch.inference_mode():
            return torch.stack(list(decode_logits(sharp.model, head, session, x, m, prefill, free)), dim=1)

    both = run(ids.clone(), mask, 20)
    alone_long = run(long.clone(), torch.ones_like(long), 20)
    alone_short = run(short.clone(), torch.ones_like(short), 20 - pad)
    assert torch.allclose(both[0], alone_long[0], atol=1e-4, rtol=1e-4)
    assert torch.allclose(both[1], alone_short[0], atol=1e-4, rtol=1e-4)
    # free rows: greedy tokens written in place, as generate() would
    free_ids = ids.clone()
    logits = run(free_ids, mask, 20, torch.tensor([False, True]))
    assert torch.equal(free_ids[1, 20:], logits[1].argmax(-1)) and torch.equal(free_ids[0], ids[0])


def test_baseline_cached_and_damaged_cache_recomputed(sharp, prose, tmp_path, monkeypatch):
    params = dict(prefill=16, decode=8, sequences=2, bootstrap_samples=200, corpus=prose)
    ev = DecodeEval(params)
    ev.prepare(sharp, tmp_path)
    first = [r.to_dict() for r in ev.evaluate(sharp, parse_scheme(QUANT))]
    (folder,) = list((tmp_path / "decode").iterdir())
    assert json.loads((folder / "meta.json").read_text())["protocol"]["decode"] == 8
    real = DecodeEmulation.compute_baseline
    monkeypatch.setattr(DecodeEmulation, "compute_baseline", lambda *a: pytest.fail("baseline recomputed"))
    again = DecodeEval(params)
    again.prepare(sharp, tmp_path)
    assert [r.to_dict() for r in again.evaluate(sharp, parse_scheme(QUANT))] == first
    head = folder / "head.npy"  # a summary file cut short (an interrupted copy, a full disk)
    head.write_bytes(head.read_bytes()[:1000])
    monkeypatch.setattr(DecodeEmulation, "compute_baseline", real)
    third = DecodeEval(params)
    third.prepare(sharp, tmp_path)
    assert [r.to_dict() for r in third.evaluate(sharp, parse_scheme(QUANT))] == first
    assert list((tmp_path / "decode").iterdir()) == [folder]


# ---- command line and grids ----------------------------------------------------------------------
def test_cli_run_writes_rows_and_positions(sharp_dir, tmp_path, capsys, prose):
    from evalkit.cli import main

    argv = [
        "run",
        "--model",
        str(sharp_dir),
        "--schemes",
        f"auto,{QUANT}",
        "--eval",
        "decode",
        "--decode-corpus",
        prose,
        "--decode-prefill",
        "16",
        "--decode-tokens",
        "8",
        "--decode-sequences",
        "2",
        "--decode-bootstrap-samples",
        "200",
        "--json",
        "--out",
        str(tmp_path / "out"),
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    plain = {(r["scheme"], r["metric"]): r for r in rows if not r["labels"]}
    assert plain[("auto", "kl_mean")]["value"] == 0.0 and plain[("auto", "identical_share")]["value"] == 1.0
    assert plain[(QUANT, "kl_mean")]["value"] > 0 and plain[(QUANT, "n_tokens")]["value"] == 16
    assert set(DecodeEval.summary_metrics) <= {m for _, m in plain}
    import pandas as pd

    from evalkit.sweep.store import ResultStore

    store = ResultStore(tmp_path / "out")  # the results store a sweep writes, artifacts under runs/<id16>/
    run_id = next(i for i, rec in store.read().complete.items() if rec["scheme"] == QUANT)
    table = pd.read_csv(store.artifact_dir(run_id) / "decode_positions.csv")
    assert len(table) == 2 * 2 * 8 and set(table["kind"]) == {"corpus", "greedy"}
    assert table["position"].min() == 16 and table["position"].max() == 23


def test_grid_accepts_decode(tmp_path):
    from evalkit.sweep.grid import parse_grid

    text = "name: g\nmodels: [embedded]\nschemes: [auto]\nevals:\n  decode: {prefill: 64, decode: 32, sequences: 2}\n"
    grid = parse_grid(tmp_path / "g.yaml", text)
    (run,) = grid.runs
    assert run.eval == "decode" and run.params["decode"] == 32
    with pytest.raises(EvalkitError, match="decode"):
        parse_grid(tmp_path / "g.yaml", text.replace("decode: 32", "decode: 0"))


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--decode-prefill", "500", "--decode-tokens", "13"], "513 tokens is longer than the model's maximum 512"),
        (
            [
                "--decode-sequences",
                "40",
                "--decode-prefill",
                "200",
                "--decode-tokens",
                "200",
                "--decode-corpus",
                "SMALL",
            ],
            "fewer than 40 sequences",
        ),
        (["--decode-tokens", "0"], "decode = 0 is too small"),
        (["--schemes", "auto,fp8_e4m3/group48/dynamic"], "group48 does not divide head_dim 16"),
        (["--schemes", "fp8_e4m3/head/dynamic+rope=bf16"], "multi-head latent attention"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(sharp_dir, tmp_path, capsys, prose, extra, message):
    from evalkit.cli import main

    small = tmp_path / "small.txt"
    small.write_text(load_corpus("embedded").text[:3000])
    extra = [f"file:{small}" if e == "SMALL" else e for e in extra]
    argv = [
        "run",
        "--model",
        str(sharp_dir),
        "--eval",
        "decode",
        "--decode-corpus",
        prose,
        "--decode-prefill",
        "16",
        "--decode-tokens",
        "8",
        "--decode-sequences",
        "2",
        "--out",
        str(tmp_path / "out"),
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    if "--schemes" not in extra:
        argv += ["--schemes", QUANT]
    assert main(argv + extra) == 2
    (line,) = [
        line for line in capsys.readouterr().err.splitlines() if "error" in line
    ]  # one line (progress bars aside)
    assert line.startswith("evalkit: error: ") and message in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache" / "decode").exists()


# ---- report --------------------------------------------------------------------------------------
def decode_store(folder):
    """SYNTHETIC results store (hand-chosen values) with decode runs, written by the store's own writer."""
    from evalkit.sweep.store import ResultStore, RunOutcome

    from tests.report.test_report import CODE, LAYOUT, _row

    store = ResultStore(folder)
    info = {"kv_layout": LAYOUT, "dtype": "float32", "versions": {"evalkit_code": CODE}}
    kls = {"auto": 0.0, "fp8_e4m3/tensor/dynamic": 0.002, "fp8_e5m2/head/unit": 0.03}
    for n, (scheme, kl) in enumerate(kls.items()):
        rows = [_row("kl_mean", kl, kl * 0.8, kl * 1.2)]
        for i, bucket in enumerate(["16-19", "20-23", "24-27"]):  # KL grows with the position
            v = kl * (1 + i)
            rows.append(_row("kl_mean", v, v * 0.8 if kl else None, v * 1.2 if kl else None, {"bucket": bucket}))
        spec = {"model": {"name": "tiny"}, "scheme": scheme, "eval": "decode", "params": {}}
        store.append(RunOutcome(f"tiny-{n}", spec, True, rows, info=info))
    return folder


def test_report_column_and_plot(tmp_path):
    pytest.importorskip("tabulate", reason="the report prints with tabulate (not in the GPU-image environment)")
    from PIL import Image

    from evalkit.report import format_table, load_store, summary_frame
    from evalkit.report.plots import all_plots, decode

    results = load_store(decode_store(tmp_path / "store"))
    frame = summary_frame(results).set_index("scheme")
    assert frame.loc["fp8_e5m2/head/unit", "decode_kl_last"] == pytest.approx(0.09)
    assert frame.loc["fp8_e5m2/head/unit", "decode_kl_last_lo"] == pytest.approx(0.072)
    assert frame.loc["fp8_e4m3/tensor/dynamic", "decode_kl_last_bucket"] == "24-27"
    text = format_table(summary_frame(results))
    assert "decode KL (last bucket)" in text and "0.09 [0.072, 0.108]" in text and "0.006 [0.0048, 0.0072]" in text
    assert "positions 24-27 of teacher-forced decoding" in text
    paths = decode(results, tmp_path / "plots")
    assert [p.name for p in paths] == ["decode_kl_tiny.png", "decode_kl_tiny.svg"]
    assert Image.open(paths[0]).size[0] > 1000
    assert any(p.name == "decode_kl_tiny.png" for p in all_plots(results, summary_frame(results), tmp_path / "all"))


# ---- the embedded model: frozen prefill scales in decode -----------------------------------------
def capture_caches(monkeypatch) -> list:
    """Every storage cache the decode loop makes from now on is also appended to the returned list."""
    from evalkit.integration.install import KVSession

    made, original = [], KVSession.new_cache
    monkeypatch.setattr(KVSession, "new_cache", lambda self, mask=None: made.append(original(self, mask)) or made[-1])
    return made


def beyond_prefill_range(raw_cache, prefill: int, rows: int, per_head: bool) -> tuple[float, float]:
    """Over all layers' raw K and V (an identity cache): the share of decode-token values whose
    magnitude exceeds the prefill's amax (per sequence and layer, or per KV head), and the largest
    ratio |value| / prefill amax. Those values saturate under scales frozen at the prefill."""
    beyond, total, worst = 0, 0, 0.0
    for layer in raw_cache.layers:
        for st in (layer.k, layer.v):
            x = st.values[:rows].abs().float()
            dims = (2, 3) if per_head else (1, 2, 3)
            amax = x[:, :, :prefill].amax(dim=dims, keepdim=True)
            ratio = x[:, :, prefill:] / amax
            beyond += int((ratio > 1).sum())
            total += ratio.numel()
            worst = max(worst, float(ratio.max()))
    return beyond / total, worst


def consistency_figures(lm, ev, scheme, monkeypatch):
    """Decode vs one forward for ``scheme`` on the corpus rows: KL means (all, first and second half
    of the decode), the mean per-position |KL_decode - KL_forward| relative to the mean KL
    (``spread``), and the share of stored codes that are the same in both caches."""
    from evalkit.kv.quantize import decode as decode_codes

    p, n = ev.p, ev.p.sequences
    made = capture_caches(monkeypatch)
    kl_dec = ev.positions(lm, parse_scheme(scheme))["kl"][:n]
    dec_cache, forward = made[-1], []
    kl_fwd = single_forward_kl(lm, ev, scheme, forward)
    same = {"layer0": [0, 0], "all": [0, 0]}
    for i, (a, b) in enumerate(zip(dec_cache.layers, forward[0].layers)):
        for st_dec, st_fwd in ((a.k, b.k), (a.v, b.v)):
            equal = decode_codes(st_dec.codes, st_dec.fmt)[:n] == decode_codes(st_fwd.codes, st_fwd.fmt)
            for key in ["layer0", "all"] if i == 0 else ["all"]:
                same[key][0] += int(equal.sum())
                same[key][1] += equal.numel()
    half = p.decode // 2
    return dict(
        kl_decode=kl_dec.mean(),
        kl_forward=kl_fwd.mean(),
        ratio=kl_dec.mean() / kl_fwd.mean(),
        ratio_first_half=kl_dec[:, :half].mean() / kl_fwd[:, :half].mean(),
        ratio_second_half=kl_dec[:, half:].mean() / kl_fwd[:, half:].mean(),
        spread=np.abs(kl_dec - kl_fwd).mean() / kl_fwd.mean(),
        same_codes_layer0=same["layer0"][0] / same["layer0"][1],
        same_codes=same["all"][0] / same["all"][1],
    )


@pytest.mark.slow
def test_embedded_decode_vs_one_forward(embedded, tmp_path, monkeypatch):
    """Per-token scales store the same codes in decode as in one forward, except codes that
    float-order noise flips and deeper layers amplify (so per-position KLs scatter a little, their
    mean agrees); dynamic tensor/head scales frozen at the prefill saturate the decode tokens that
    exceed the prefill's range (one forward takes its scales from all tokens), so other codes are
    stored and the per-position KLs differ several times more. Prints the figures (run with -s)."""
    path = tmp_path / "prose.txt"
    path.write_text(load_corpus("embedded").text[:20_000])
    ev = DecodeEval(dict(prefill=64, decode=64, sequences=2, bootstrap_samples=200, corpus=f"file:{path}"))
    made = capture_caches(monkeypatch)
    ev.prepare(embedded, tmp_path)  # the baseline pass: raw K/V in an identity cache
    raw = made[-1]
    for name, per_head in (("tensor", False), ("head", True)):
        share, worst = beyond_prefill_range(raw, ev.p.prefill, ev.p.sequences, per_head)
        print(f"decode K/V values beyond the prefill's {name} amax: {share:.3%}, up to {worst:.2f} x the amax")
        assert share > 0 and worst > 1
    figures = {
        s: consistency_figures(embedded, ev, s, monkeypatch)
        for s in ("fp8_e4m3/token/dynamic", "fp8_e4m3/tensor/dynamic", "fp8_e4m3/head/dynamic")
    }
    for scheme, f in figures.items():
        print(scheme, " ".join(f"{k}={v:.4g}" for k, v in f.items()))
    token, tensor, head = figures.values()
    assert token["same_codes_layer0"] > 0.999 and token["same_codes"] > 0.9
    assert token["ratio"] == pytest.approx(1, abs=0.1)
    for frozen in (tensor, head):
        assert frozen["same_codes"] < 0.8
        assert frozen["spread"] > 2 * token["spread"]
