"""generation on the tiny random llama: the task and the traces file under the identity scheme reproduce the
baseline bit for bit (no flip, no divergence, KL 0); the served prompt and settings reach lm-eval; every
row of a quantized scheme equals a plain re-computation from the stored per-item answers; the traces'
decode KL matches the full-vocabulary KL along the baseline's continuation.

The tiny tokenizer has no chat template: the test gives it a small explicit one (:data:`TEMPLATE`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from evalkit.errors import EvalkitError
from evalkit.evals.base import get_eval
from evalkit.kv.scheme import Scheme, parse_scheme

from tests.evals import generation_checks as C

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
PARAMS = {
    "tasks": "evalkit_arith",
    "limit": 3,
    "max_gen_toks": 12,
    "temperature": 0.8,
    "top_p": 0.95,
    "samples": 2,
    "seed": 5,
    "traces": "example_traces.jsonl",
    "system_prompt": "Be brief.",
    "batch_size": 4,
}
QUANTIZED = "int4/tensor/dynamic"
IDENTITY = str(Scheme())  # the unquantized scheme, whatever its name


@pytest.fixture(scope="module")
def chat_tiny(tiny_llama_dir):
    from evalkit.models.loading import load_model

    lm = load_model(str(tiny_llama_dir))
    lm.tokenizer.chat_template = TEMPLATE
    return lm


@pytest.fixture(scope="module")
def runs(chat_tiny, tmp_path_factory):
    ev = get_eval("generation")(PARAMS)
    ev.prepare(chat_tiny, tmp_path_factory.mktemp("work"))
    out = {}
    for scheme in (IDENTITY, QUANTIZED):
        folder = tmp_path_factory.mktemp(scheme.replace("/", "_"))
        rows = ev.evaluate(chat_tiny, parse_scheme(scheme), folder)
        out[scheme] = (rows, json.loads((folder / "generation_items.json").read_text()))
    return ev, out


def test_identity_scheme_reproduces_the_baseline_bit_for_bit(runs):
    ev, out = runs
    rows, items = out[IDENTITY]
    base = ev.baseline
    for task, records in items["tasks"].items():
        assert [[s["text"] for s in r["samples"]] for r in records] == [
            [s["text"] for s in r["samples"]] for r in base["tasks"][task]
        ]
    assert [[s["ids"] for s in r["samples"]] for r in items["traces"]] == [
        [s["ids"] for s in r["samples"]] for r in base["traces"]
    ]
    values = {r.metric.split("[")[0]: r.value for r in rows if "bucket" not in r.labels}
    for prefix in ("evalkit_arith", "traces"):
        for stat in ("flip_rate", "divergence_share", "accuracy_delta", "flip_right_to_wrong", "flip_wrong_to_right"):
            assert values[f"{prefix}/{stat}"] == 0.0, (prefix, stat)
        assert values[f"{prefix}/mcnemar_p"] == 1.0
        assert f"{prefix}/first_divergence" not in values
        for gate in ("repeated_token", "repeated_ngram", "first_token_eos", "collapse", "runaway", "invalid_utf8"):
            assert values[f"{prefix}/fail_{gate}"] == 0.0, (prefix, gate)  # no failure the baseline did not have
        assert values[f"{prefix}/fail_any"] == 0.0
    assert values["traces/kl_mean"] == 0.0 and values["traces/top1_agreement"] == 1.0


def test_the_prompt_and_settings_are_the_served_ones(runs, chat_tiny):
    ev, out = runs
    rows, items = out[QUANTIZED]
    records = items["tasks"]["evalkit_arith"]
    assert len(records) == 3 and all([s["seed"] for s in r["samples"]] == [5, 6] for r in records)
    for r in records:  # lm-eval's own prompt: through the chat template, the system prompt first
        assert r["prompt"].startswith("<|system|>Be brief.\n<|user|>Solve the problem. Think step by step")
        assert r["prompt"].endswith("<|assistant|>")
        req = r["request"]
        assert req["do_sample"] is True and req["temperature"] == 0.8 and req["top_p"] == 0.95
        assert req["max_gen_toks"] == 12 and req["top_k"] == 0
    info = next(r.info for r in rows if r.metric.startswith("evalkit_arith/accuracy"))
    assert info["chat_template"] is True and info["system_prompt"] == "Be brief." and info["seeds"] == [5, 6]
    assert info["gen_kwargs"] == {"do_sample": True, "temperature": 0.8, "top_p": 0.95, "max_gen_toks": 12}
    assert info["generation_kwargs"]["top_p"] == 0.95 and info["backend"] == "emulation"
    # the traces: each line through the same template, the chat's own system turn kept
    from evalkit.evals.generation.traces import prompt_ids, read_traces

    traces = read_traces(ev.params["traces"])
    text = chat_tiny.tokenizer.decode(prompt_ids(traces[1], chat_tiny.tokenizer, True, "Be brief."))
    assert text.startswith("<|system|>You answer in one short sentence.\n<|user|>What is the capital of France?")


def test_quantized_rows_equal_a_plain_recomputation(runs, chat_tiny):
    ev, out = runs
    rows, items = out[QUANTIZED]
    C.check_task(
        rows,
        "evalkit_arith",
        "last-number",
        ev.baseline["tasks"]["evalkit_arith"],
        items["tasks"]["evalkit_arith"],
        chat_tiny.tokenizer,
    )
    C.check_traces(rows, ev.baseline["traces"], items["traces"], lambda r: r["reference"])
    tok, task = chat_tiny.tokenizer, "evalkit_arith"
    gens = C.task_generations(ev.baseline["tasks"][task], tok), C.task_generations(items["tasks"][task], tok)
    C.check_gates(rows, f"{task}/", *gens)
    C.check_gates(
        rows, "traces/", C.trace_generations(ev.baseline["traces"], tok), C.trace_generations(items["traces"], tok)
    )
    # sampling with seeds 5, 6 on a random model: the int4 cache changes some generations
    assert next(r.value for r in rows if r.metric == "traces/divergence_share") > 0


def test_traces_kl_is_the_full_vocabulary_kl_along_the_baseline_continuation(runs, chat_tiny):
    """kl_topk's estimate against the exact KL of full distributions, from the same decode loop."""
    from evalkit.evals.decode.loop import decode_logits
    from evalkit.evals.output_head import OutputHead
    from evalkit.integration.install import quantized_kv

    ev, out = runs
    rows, items = out[QUANTIZED]
    head = OutputHead(chat_tiny.model, "test")
    per_line = []
    for prompt, record in zip(ev._prompts, ev.baseline["traces"]):
        ids = torch.tensor([prompt + record["samples"][0]["ids"]])
        logp = {}
        for scheme in (IDENTITY, QUANTIZED):
            with quantized_kv(chat_tiny.model, scheme) as session, torch.inference_mode():
                steps = decode_logits(chat_tiny.model, head, session, ids, torch.ones_like(ids), len(prompt))
                logp[scheme] = torch.stack([torch.log_softmax(s[0].double(), -1) for s in steps])
        p, q = logp[IDENTITY], logp[QUANTIZED]
        per_line.append(float((p.exp() * (p - q)).sum(-1).mean()))
    kl = next(r for r in rows if r.metric == "traces/kl_mean")
    assert kl.value == pytest.approx(np.mean(per_line), rel=0.05) and kl.value > 0
    assert kl.info["n_tokens"] == sum(len(r["samples"][0]["ids"]) for r in ev.baseline["traces"])


def test_traces_need_full_distributions(chat_tiny, tmp_path):
    """A backend that returns only a top-k (an engine) is refused for traces in one line."""
    from evalkit.evals.backend import use_backend
    from evalkit.evals.protocol import Backend, Capabilities

    class TopK(Backend):
        capabilities = Capabilities("engine 1.0", kl="bound")

    ev = use_backend(get_eval("generation")({"tasks": "none", "traces": "example_traces.jsonl"}), TopK())
    with pytest.raises(
        EvalkitError, match="backend engine 1.0 does not return: run the traces with --engine emulation"
    ):
        ev.prepare(chat_tiny, tmp_path)


def test_a_reasoning_task_without_its_data_names_the_dataset(chat_tiny, monkeypatch):
    """lm-eval's gsm8k_cot_zeroshot while the hub is unreachable and its data is not cached: one line naming
    the task, its dataset and how to fetch it (offline mode cleared first, as tests/evals/test_lmeval.py does)."""
    from pathlib import Path

    import datasets
    import lm_eval
    from huggingface_hub import constants

    from evalkit.evals.generation.params import gen_kwargs, tasks_dir
    from evalkit.evals.generation.serving import run_samples
    from evalkit.evals.lmeval.adapter import hub_reachable, make_hflm, resolve_tasks

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "https://hub.invalid")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    assert not hub_reachable()
    gsm8k = Path(lm_eval.__file__).parent / "tasks" / "gsm8k"
    tasks = resolve_tasks(["gsm8k_cot_zeroshot"], (str(tasks_dir()), str(gsm8k)))
    p = get_eval("generation")({"tasks": "gsm8k_cot_zeroshot", "include": [str(gsm8k)], "limit": 2}).params
    with pytest.raises(EvalkitError) as err:
        run_samples(make_hflm(chat_tiny.model, chat_tiny.tokenizer), tasks, p, gen_kwargs(p), chat_tiny.tokenizer)
    message = str(err.value)
    assert message.startswith(
        "lm-eval task gsm8k_cot_zeroshot has no local data (gsm8k_cot_zeroshot reads openai/gsm8k (main))"
    )
    assert "fetch it once online" in message and "\n" not in message


def test_an_engine_backend_gets_the_same_settings_and_a_seed_per_request(chat_tiny, tmp_path):
    """Through a backend whose lm-eval model is not the transformers one (as vLLM's: lm-eval's VLLM, not
    installed here), the tasks run with the same chat template, system prompt and sampling settings, each
    sample's seed in the request (vLLM's SamplingParams.seed), and the backend's own baseline run."""
    import contextlib

    from lm_eval.api.model import LM

    from evalkit.evals.backend import use_backend
    from evalkit.evals.protocol import Backend, Capabilities

    seen = []

    class RecordingLM(LM):  # answers every request "The answer is 7", recording what it was asked
        batch_size, max_gen_toks, tokenizer_name = 1, 256, "recording"

        def apply_chat_template(self, chat_history, add_generation_prompt=True):
            return "".join(f"[{m['role']}]{m['content']}" for m in chat_history) + "[assistant]"

        def generate_until(self, requests, disable_tqdm=False):
            seen.extend(r.args for r in requests)
            return ["The answer is 7"] * len(requests)

        def loglikelihood(self, requests, disable_tqdm=False):
            raise AssertionError("generation asks for generations only")

        loglikelihood_rolling = loglikelihood

    class Engine(Backend):
        capabilities = Capabilities("engine 1.0", kl="bound", requests=frozenset({"lmeval"}))
        runs: list = []

        def prepare_lmeval(self, request, lm):
            pass

        @contextlib.contextmanager
        def lmeval_model(self, request, lm, scheme):
            self.runs.append(scheme)
            yield RecordingLM()

    params = {"limit": 2, "temperature": 0.6, "top_p": 0.9, "samples": 2, "seed": 3, "system_prompt": "Be brief."}
    ev = use_backend(get_eval("generation")(params), Engine())
    ev.prepare(chat_tiny, tmp_path)
    rows = ev.evaluate(chat_tiny, parse_scheme("fp8_e4m3/tensor/dynamic"))
    assert [str(s) if s else None for s in ev.backend.runs] == [None, "fp8_e4m3/tensor/dynamic"]  # baseline, scheme
    assert len(seen) == 2 * 2 * 2  # 2 items x 2 samples, baseline and scheme
    seeds = sorted({kwargs["seed"] for _, kwargs in seen})
    assert seeds == [3, 4] and all("top_k" not in kwargs for _, kwargs in seen)
    for context, kwargs in seen:
        assert context.startswith("[system]Be brief.[user]Solve the problem.") and context.endswith("[assistant]")
        assert kwargs["do_sample"] is True and kwargs["temperature"] == 0.6 and kwargs["top_p"] == 0.9
    values = {r.metric: r.value for r in rows if "bucket" not in r.labels}
    assert values["evalkit_arith/flip_rate[last-number]"] == 0.0 and rows[0].info["backend"] == "engine 1.0"


def test_sampling_runs_on_a_static_decode_path(chat_tiny, tmp_path):
    """Sampled generations decode on the static path too (the tokens per seed equal the eager path's:
    tests/integration/test_static_decode.py); what it cannot reproduce is refused there in one line."""
    import dataclasses

    static = dataclasses.replace(chat_tiny, decode_path="static")
    ev = get_eval("generation")({"limit": 1, "max_gen_toks": 4, "temperature": 0.7})
    ev.prepare(static, tmp_path)
