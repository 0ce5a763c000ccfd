"""LongBench v2 in its authors' protocol (evalkit.evals.longcontext.longbench2): the prompts as published, the
middle truncation against a plain computation, the answer extraction on real-shaped replies, the chat template
as lm-eval renders it against ``tokenizer.apply_chat_template`` by hand, and a tiny-model run of the published
variants (direct and chain of thought) beside the log-likelihood stand-in; the chat template option of
``longcontext`` and ``lmeval`` leaving the runs made before it under their ids."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

from evalkit.errors import EvalkitError
from evalkit.evals.longcontext import longbench2 as lb

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tasks" / "longcontext"
TEMPLATE = (  # a chat template of the tiny tokenizer's own (it ships none)
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# SHA-256 of THUDM/LongBench's prompts/0shot.txt, 0shot_cot.txt, 0shot_cot_ans.txt (commit 2e00731, 2025-01-15)
PUBLISHED_SHA256 = {
    "direct": "68a162252bc9ff71d5d7abca3d69bb31aac3c35f832d657a2866f2018b8a6950",
    "cot": "6cc33d92fd8f611662b756c1f10f302c541ca005b58c46d5f3188ac3a939bfe8",
    "cot_answer": "85ec59df4ac0e27aabbc619a7ca5cf3ae1787dd5a76cf51a18944eb52c91955f",
}


def _task_module():
    """tasks/longcontext/longbench2_published.py, loaded from its file as lm-eval's ``!function`` does."""
    spec = importlib.util.spec_from_file_location("evalkit_test_lb2_published", TASKS / "longbench2_published.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- the protocol's pieces ---------------------------------------------------------------------


def test_templates_are_the_published_files_byte_for_byte():
    for name, digest in PUBLISHED_SHA256.items():
        assert hashlib.sha256(lb.TEMPLATES[name].encode("utf-8")).hexdigest() == digest, name


def test_fill_replaces_stripped_fields_in_order():
    doc = {
        "context": "  the text \n",
        "question": " Q? ",
        "choice_A": " a",
        "choice_B": "b ",
        "choice_C": "c",
        "choice_D": "d",
    }
    want = (
        "Please read the following text and answer the question below.\n\n<text>\nthe text\n</text>\n\n"
        "What is the correct answer to this question: Q?\nChoices:\n(A) a\n(B) b\n(C) c\n(D) d\n\n"
        'Format your response as follows: "The correct answer is (insert answer here)".'
    )
    assert lb.fill(lb.TEMPLATES["direct"], doc) == want
    listed = {"context": "x", "question": "Q?", "choices": ["a", "b", "c", "d"]}  # lm-eval's field shape
    assert lb.fill(lb.TEMPLATES["cot_answer"], listed, "I reason.").endswith(
        "(D) d\n\nLet\u2019s think step by step: I reason.\n\nBased on the above, what is the single, most likely "
        'answer choice? Format your response as follows: "The correct answer is (insert answer here)".'
    )
    assert "The text is too long and omitted here." in lb.fill(lb.TEMPLATES["cot_answer"], listed, "")


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 100])
@pytest.mark.parametrize("max_len", [1, 2, 7, 8, 50])
def test_middle_truncation_keeps_the_first_and_last_halves(n, max_len):
    ids = list(range(1000, 1000 + n))
    got = lb.middle_truncate(ids, max_len)
    if n <= max_len:
        assert got == ids
        return
    # pred.py lines 28-29, as written there: Python's -max_len//2 is -ceil(max_len / 2)
    assert got == ids[: max_len // 2] + ids[-max_len // 2 :]
    head, tail = max_len // 2, (max_len + 1) // 2
    assert len(got) == max_len and got[:head] == ids[:head] and got[head:] == ids[n - tail :]


def test_truncation_decodes_the_kept_tokens(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    text = " ".join(f"word{i}" for i in range(300))
    ids = tok.encode(text)
    assert len(ids) > 101
    sent, n, cut = lb.truncate(text, tok, 101)
    assert (n, cut) == (len(ids), True)
    assert sent == tok.decode(ids[:50] + ids[len(ids) - 51 :], skip_special_tokens=True)
    assert sent.startswith("word0 word1") and sent.endswith("word298 word299")
    assert lb.truncate(text, tok, len(ids)) == (text, len(ids), False)
    with pytest.raises(ValueError):
        lb.middle_truncate(ids, 0)


@pytest.mark.parametrize(
    "reply, letter",
    [
        ("The correct answer is (B)", "B"),
        ("The correct answer is (B) Functions may have annotations.", "B"),
        ("**The correct answer is (C)**", "C"),
        ("The correct answer is **(D)**.", "D"),  # '*' removed first
        ("Let me think. The passage says X.\n\nThe correct answer is A.", "A"),  # no parentheses: the second pattern
        ("The correct answer is B, then again The correct answer is (C)", "C"),  # parentheses win wherever they are
        ("The correct answer is (A). On reflection, the correct answer is (B).", "A"),  # the first match
        ("the correct answer is (B)", None),  # case matters, as published
        ("The correct answer is: (B)", None),  # so does the exact wording
        ("The correct answer is (E)", None),
        ("(B)", None),
        ("", None),
    ],
)
def test_answer_extraction_on_real_shaped_replies(reply, letter):
    assert lb.extract_answer(reply) == letter
    assert lb.judge({"answer": "B"}, reply) == float(letter == "B")


def test_stand_in_loader_truncates_with_the_models_tokenizer(tiny_tokenizer_dir):
    mod = _task_module()
    full = mod.load_standin(longbench2_protocol="direct", pretrained=str(tiny_tokenizer_dir))["test"]
    cut = mod.load_standin(longbench2_protocol="cot", pretrained=str(tiny_tokenizer_dir), longbench2_max_len=64)["test"]
    items = [json.loads(line) for line in (TASKS / "longbench2.jsonl").read_text().splitlines()]
    assert len(full) == len(cut) == len(items)
    for doc, item, short in zip(full, items, cut):
        assert doc["prompt"] == lb.fill(lb.TEMPLATES["direct"], item) and not doc["truncated"]
        assert short["truncated"] and short["prompt_tokens"] > 64
        assert short["prompt"].startswith("Please read") and short["prompt"].endswith("step by step:")
    with pytest.raises(ValueError, match="pretrained"):
        mod.load_standin(longbench2_protocol="direct")


def test_published_loader_reads_the_authors_fields(tiny_tokenizer_dir, monkeypatch):
    """``THUDM/LongBench-v2`` rows (``choice_A`` ... ``choice_D``) through the hub loader, the hub replaced by a
    local dataset of that shape (no network here)."""
    import datasets

    mod = _task_module()
    row = {
        "_id": "x1",
        "domain": "Single-Document QA",
        "sub_domain": "Legal",
        "difficulty": "hard",
        "length": "long",
        "question": "Which?",
        "choice_A": "one",
        "choice_B": "two",
        "choice_C": "three",
        "choice_D": "four",
        "answer": "C",
        "context": "text " * 50,
    }
    asked = []

    def fake(path, split=None, **kwargs):
        asked.append((path, split))
        return datasets.Dataset.from_list([row])

    monkeypatch.setattr(mod.datasets, "load_dataset", fake)
    doc = mod.load_published(longbench2_protocol="direct", pretrained=str(tiny_tokenizer_dir))["test"][0]
    assert asked == [("THUDM/LongBench-v2", "train")]
    assert "(C) three\n(D) four" in doc["prompt"] and doc["length"] == "long"
    assert mod.process_results(doc, ["The correct answer is (C)"]) == {"acc": 1.0}


# ---- through lm-eval and the evaluation, on the tiny llama ------------------------------------------


@pytest.fixture(scope="module")
def chat_dir(tiny_llama_dir, tmp_path_factory):
    """The tiny llama's folder with a chat template in its tokenizer (what a served instruct model has)."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("chat_llama")
    shutil.copytree(tiny_llama_dir, folder, dirs_exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.chat_template = TEMPLATE
    tok.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def short_cot(tmp_path_factory):
    """The published CoT stand-in with budgets that fit the tiny llama's 512 positions (lm-eval's ``include``)."""
    folder = tmp_path_factory.mktemp("lb2_tasks")
    (folder / "tiny_lb2_cot.yaml").write_text(
        f"include: {TASKS / 'longctx_longbench2_published_cot.yaml'}\n"
        "task: tiny_lb2_cot\n"
        "generation_kwargs: {until: [], do_sample: false, temperature: 0.0, max_gen_toks: 24}\n"
        "metadata: {version: 1.0, longbench2_protocol: cot, answer_max_gen_toks: 12}\n"
    )
    return folder


@pytest.fixture(scope="module")
def published_run(chat_dir, short_cot, tmp_path_factory):
    from evalkit.evals.registry import get_eval
    from evalkit.kv.scheme import parse_scheme
    from evalkit.models.loading import load_model

    lm = load_model(str(chat_dir))
    params = {
        "tasks": ["longctx_longbench2", "longctx_longbench2_published", "tiny_lb2_cot"],
        "limit": 1,
        "include": [str(short_cot)],
        "longbench2_max_len": 200,
    }
    ev = get_eval("longcontext")(params)
    ev.prepare(lm, tmp_path_factory.mktemp("work"))
    out = {}
    for scheme in ("auto", "int4/tensor/dynamic"):
        folder = tmp_path_factory.mktemp(scheme.replace("/", "_"))
        rows = ev.evaluate(lm, parse_scheme(scheme), folder)
        out[scheme] = (rows, json.loads((folder / "longcontext_items.json").read_text()))
    return lm, ev, out


@pytest.mark.slow
def test_chat_template_renders_as_apply_chat_template_by_hand(published_run):
    lm, ev, _ = published_run
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(lm.path))
    assert ev._chat == {"longctx_longbench2_published", "tiny_lb2_cot"}  # unset: the published tasks only
    results = ev._run(lm, None)
    for task in ("longctx_longbench2_published", "tiny_lb2_cot"):
        for s in results["samples"][task]:
            sent = s["arguments"][0][0]
            by_hand = tok.apply_chat_template(
                [{"role": "user", "content": s["doc"]["prompt"]}], add_generation_prompt=True, tokenize=False
            )
            assert sent == by_hand == f"<|user|>{s['doc']['prompt']}\n<|assistant|>"
            assert s["doc"]["truncated"] and len(tok.encode(s["doc"]["prompt"])) <= 200 + 2  # re-tokenized text
    for s in results["samples"]["tiny_lb2_cot"]:  # the second request: the answer prompt with the first reply
        answer = lb.fill(lb.TEMPLATES["cot_answer"], s["doc"], s["cot"].strip())
        answer = lb.truncate(answer, tok, 200)[0]
        assert s["answer_arguments"] == f"<|user|>{answer}\n<|assistant|>"
    loglik = results["samples"]["longctx_longbench2"][0]["arguments"][0][0]
    assert not loglik.startswith("<|user|>") and loglik.endswith("Answer:")  # the log-likelihood rows as before


@pytest.mark.slow
def test_published_variants_run_beside_the_loglik_one(published_run):
    _, ev, out = published_run
    pattern = re.compile(r"The correct answer is \(([A-D])\)|The correct answer is ([A-D])")
    for scheme, (rows, art) in out.items():
        by = {(r.metric, r.labels["length"]): r for r in rows}
        for task in ("longctx_longbench2", "longctx_longbench2_published", "tiny_lb2_cot"):
            items = [i for i in art["items"] if i["task"] == task]
            assert {i["length"] for i in items} == {"short", "medium"}
            for i in items:
                if task != "longctx_longbench2":  # generated: the score is the judged reply
                    m = pattern.search(i["prediction"].strip().replace("*", ""))
                    gold = json.loads((TASKS / "longbench2.jsonl").read_text().splitlines()[i["doc_id"]])["answer"]
                    assert i["score"] == float(bool(m) and (m.group(1) or m.group(2)) == gold)
            score = by[(f"{task}/score", "all")]
            assert score.value == pytest.approx(sum(i["score"] for i in items) / len(items))
            assert by[(f"{task}/score_diff", "all")].info["test"] == "mcnemar_exact"
            assert score.info["chat_template"] == ["longctx_longbench2_published", "tiny_lb2_cot"]
        if scheme == "auto":  # the identity scheme: every item as the baseline's, reply and score
            assert [(i["score"], i["prediction"]) for i in art["items"]] == [
                (b["score"], b["prediction"]) for b in art["baseline"]
            ]
    cot = {i["doc_id"]: i for i in out["int4/tensor/dynamic"][1]["items"] if i["task"] == "tiny_lb2_cot"}
    assert all(isinstance(i["prediction"], str) for i in cot.values())


@pytest.mark.slow
def test_a_budget_over_the_context_is_refused_in_one_line(chat_dir):
    from evalkit.evals.registry import get_eval
    from evalkit.models.loading import load_model

    lm = load_model(str(chat_dir))
    ev = get_eval("longcontext")({"tasks": ["longctx_longbench2_published_cot"], "limit": 1})
    with pytest.raises(EvalkitError, match="--longcontext-longbench2-max-len") as err:
        ev.prepare(lm, chat_dir / "work")
    assert "\n" not in str(err.value) and "1024" in str(err.value)


@pytest.mark.slow
def test_chat_template_asked_of_a_model_without_one_is_refused(tiny_llama_dir, tmp_path):
    from evalkit.evals.registry import get_eval
    from evalkit.models.loading import load_model

    lm = load_model(str(tiny_llama_dir))
    for name, params in (
        ("longcontext", {"tasks": ["longctx_longbench2"], "limit": 1, "chat_template": True}),
        ("lmeval", {"tasks": ["evalkit_mmlu4"], "limit": 1, "chat_template": True}),
    ):
        with pytest.raises(EvalkitError, match=f"no chat template: pass --no-{name}-chat-template"):
            get_eval(name)(params).prepare(lm, tmp_path)


@pytest.mark.slow
def test_lmeval_chat_template_is_lm_evals_own(chat_dir, tmp_path):
    from transformers import AutoTokenizer

    from evalkit.evals.registry import get_eval
    from evalkit.models.loading import load_model

    lm = load_model(str(chat_dir))
    tok = AutoTokenizer.from_pretrained(str(chat_dir))
    for chat in (False, True):
        ev = get_eval("lmeval")({"tasks": ["evalkit_mmlu4"], "limit": 2, "chat_template": chat})
        ev.prepare(lm, tmp_path / str(chat))
        results = ev._run(lm, None)
        for s in results["samples"]["evalkit_mmlu4"]:
            context = s["arguments"][0][0]
            question = results["samples"]["evalkit_mmlu4"][0]["doc"]
            if chat:
                assert context.startswith("<|user|>") and context.endswith("<|assistant|>")
                user = context[len("<|user|>") : -len("\n<|assistant|>")]
                messages = [{"role": "user", "content": user}]
                assert context == tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            else:
                assert not context.startswith("<|user|>")
            assert question


# ---- the runs made before the option keep their ids ----------------------------------------------


def test_new_options_at_their_defaults_leave_run_ids_unchanged():
    from evalkit.evals.registry import get_eval

    lc = get_eval("longcontext")({})
    assert set(lc.canonical_params()) == {"tasks", "lengths", "limit", "limits", "batch_size", "include"}
    assert lc.params["chat_template"] is None and lc.params["longbench2_max_len"] == 120_000
    lc_on = get_eval("longcontext")({"chat_template": True, "longbench2_max_len": 4000})
    assert lc_on.canonical_params()["chat_template"] is True and lc_on.canonical_params()["longbench2_max_len"] == 4000
    lm = get_eval("lmeval")({})
    assert "chat_template" not in lm.canonical_params() and lm.params["chat_template"] is False
    assert get_eval("lmeval")({"chat_template": True}).canonical_params()["chat_template"] is True
