"""LongBench v2 as its authors run it (the "published" protocol), beside lm-eval's log-likelihood ``longbench2``.

lm-eval's ``longbench2`` scores the log-likelihood of each letter after "Answer:", the context cut to its
**last** tokens by the model's maximum length. The authors' own runner (THUDM/LongBench, ``pred.py`` and
``prompts/``, commit 2e00731 of 2025-01-15) does something else, and this module states it as data and
plain functions:

* **prompt**: ``prompts/0shot.txt`` (direct answer) or ``prompts/0shot_cot.txt`` (chain of thought), with
  ``$DOC$``, ``$Q$``, ``$C_A$`` ... ``$C_D$`` replaced in that order by the stripped context, question and
  choices (``pred.py`` line 93);
* **middle truncation**: the whole filled prompt is tokenized (``tokenizer.encode``, special tokens as the
  tokenizer adds them) and, when longer than ``max_len`` tokens, cut to its first ``max_len // 2`` and last
  ``ceil(max_len / 2)`` tokens (Python's ``ids[-max_len//2:]``), decoded without special tokens
  (``pred.py`` lines 27-30); ``max_len`` is 120,000 for every open model of ``config/model2maxlen.json``;
* **served**: the prompt is one user turn of an OpenAI chat completion to a vLLM server, so the server
  applies the model's chat template (lines 42-47); at most 128 new tokens, 1,024 for the chain of
  thought (lines 94-97);
* **chain of thought**: a second request, ``prompts/0shot_cot_ans.txt``, with the context omitted and
  ``$COT$`` the first reply stripped, truncated the same way, 128 new tokens (lines 100-106);
* **answer**: ``*`` removed, then the first "The correct answer is (X)", else "The correct answer is X",
  X in A-D (``extract_answer``, lines 58-68); right when it equals the gold letter (line 110), so a reply
  with no answer is wrong (``result.py`` counts it 0).

Two departures, both so that a scheme pairs item by item with the baseline: decoding is greedy where the
authors sample at temperature 0.1 (a scheme and the baseline then differ only by the cache), and an empty
reply is kept and scored wrong where ``pred.py`` skips it (line 98; there it means the API call failed).

The task YAMLs (``tasks/longcontext/*longbench2_published*.yaml``) carry the protocol in their metadata
(``longbench2_protocol``: ``direct`` or ``cot``; ``answer_max_gen_toks`` for the CoT's second request);
their loader builds each item's truncated ``prompt`` with :func:`published_docs` (the tokenizer comes from
lm-eval's ``pretrained`` metadata, as RULER's does) and lm-eval generates and applies the chat template.
The CoT's second request needs the first reply, which one lm-eval task cannot chain: :func:`answer_step`
sends it through the same lm-eval model (same scheme, same chat template) and writes its score into the
task's samples, where lm-eval's first pass left ``acc`` undefined (NaN).
"""

from __future__ import annotations

import math
import re
from typing import Any

PUBLISHED_MAX_LEN = 120_000  # config/model2maxlen.json: every open model of the published table
PROTOCOLS = ("direct", "cot")
ANSWER_MAX_GEN_TOKS = 128  # the CoT's second request (pred.py line 104)

_HEAD = "Please read the following text and answer the {q} below.\n\n"
_CHOICES = "What is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\n"
TEMPLATES = {  # prompts/0shot.txt, 0shot_cot.txt, 0shot_cot_ans.txt (no trailing newline in any)
    "direct": _HEAD.format(q="question")
    + "<text>\n$DOC$\n</text>\n\n"
    + _CHOICES
    + 'Format your response as follows: "The correct answer is (insert answer here)".',
    "cot": _HEAD.format(q="questions") + "<text>\n$DOC$\n</text>\n\n" + _CHOICES + "Let\u2019s think step by step:",
    "cot_answer": _HEAD.format(q="questions")
    + "The text is too long and omitted here.\n\n"
    + _CHOICES
    + "Let\u2019s think step by step: $COT$\n\nBased on the above, what is the single, most likely answer choice? "
    + 'Format your response as follows: "The correct answer is (insert answer here)".',
}

_PARENS = re.compile(r"The correct answer is \(([A-D])\)")
_BARE = re.compile(r"The correct answer is ([A-D])")


def choices_of(doc: dict) -> list[str]:
    """The four choices: LongBench v2's ``choice_A`` ... ``choice_D`` or lm-eval's ``choices`` list."""
    if "choices" in doc and doc["choices"] is not None:
        return list(doc["choices"])
    return [doc[f"choice_{x}"] for x in "ABCD"]


def fill(template: str, doc: dict, cot: str | None = None) -> str:
    """``template`` with the item's stripped context, question and choices, in ``pred.py``'s order."""
    a, b, c, d = (x.strip() for x in choices_of(doc))
    text = template.replace("$DOC$", doc.get("context", "").strip()).replace("$Q$", doc["question"].strip())
    text = text.replace("$C_A$", a).replace("$C_B$", b).replace("$C_C$", c).replace("$C_D$", d)
    return text if cot is None else text.replace("$COT$", cot)


def middle_truncate(ids: list[int], max_len: int) -> list[int]:
    """The first ``max_len // 2`` and last ``ceil(max_len / 2)`` of ``ids`` when it is longer than ``max_len``."""
    if max_len < 1:
        raise ValueError(f"max_len must be at least 1, got {max_len}")
    if len(ids) <= max_len:
        return list(ids)
    return list(ids[: max_len // 2]) + list(ids[len(ids) - (max_len - max_len // 2) :])


def truncate(prompt: str, tokenizer, max_len: int) -> tuple[str, int, bool]:
    """(the prompt as sent, its length in tokens before truncation, whether it was cut in the middle)."""
    ids = tokenizer.encode(prompt)
    if len(ids) <= max_len:
        return prompt, len(ids), False
    return tokenizer.decode(middle_truncate(ids, max_len), skip_special_tokens=True), len(ids), True


def extract_answer(response: str) -> str | None:
    """The letter of the first "The correct answer is (X)" (else "... is X") once ``*`` is removed; None if neither."""
    text = response.replace("*", "")
    match = _PARENS.search(text) or _BARE.search(text)
    return match.group(1) if match else None


def judge(doc: dict, response: str) -> float:
    """1.0 when the reply's extracted letter is the gold one, else 0.0 (no answer is wrong)."""
    return float(extract_answer(response.strip()) == str(doc["answer"]).strip())


def published_docs(items: list[dict], protocol: str, pretrained: str | None, max_len: int) -> list[dict]:
    """The items with ``prompt`` (the filled template, cut in the middle to ``max_len`` tokens of the
    tokenizer at ``pretrained``), ``prompt_tokens`` (before the cut) and ``truncated``."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"LongBench v2 protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    if not pretrained:
        raise ValueError(
            "LongBench v2's published protocol truncates with the model's tokenizer: pass the model's path as "
            "lm-eval metadata 'pretrained' (evalkit's longcontext evaluation does)"
        )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(pretrained))
    out = []
    for item in items:
        prompt, n, cut = truncate(fill(TEMPLATES[protocol], item), tokenizer, int(max_len))
        out.append({**item, "prompt": prompt, "prompt_tokens": n, "truncated": cut})
    return out


def protocol_of(task) -> str | None:
    """``direct`` or ``cot`` for a published-protocol lm-eval task (its YAML metadata), else None."""
    meta = getattr(getattr(task, "config", None), "metadata", None) or {}
    value = meta.get("longbench2_protocol")
    return value if value in PROTOCOLS else None


def answer_step(model, task_name: str, task, results: dict, tokenizer, chat: bool, max_len: int) -> None:
    """The CoT's second request for every sample of ``task_name`` in lm-eval's ``results`` (in place): the
    answer prompt with the first reply as ``$COT$``, truncated as the first, through ``model``'s chat
    template when ``chat``, greedy, ``answer_max_gen_toks`` new tokens; its judged letter becomes the
    sample's ``acc`` and the task's mean ``acc``. The first reply stays in the sample as ``cot``, the second
    request's text as sent as ``answer_arguments``."""
    from lm_eval.api.instance import Instance

    samples = results.get("samples", {}).get(task_name, [])
    if not samples:
        return
    meta = task.config.metadata or {}
    kwargs = dict(task.config.generation_kwargs or {})
    kwargs["max_gen_toks"] = int(meta.get("answer_max_gen_toks", ANSWER_MAX_GEN_TOKS))
    requests = []
    for s in samples:
        cot = _reply(s).strip()
        prompt, _, _ = truncate(fill(TEMPLATES["cot_answer"], s["doc"], cot), tokenizer, max_len)
        context = model.apply_chat_template([{"role": "user", "content": prompt}]) if chat else prompt
        requests.append(
            Instance("generate_until", s["doc"], (context, dict(kwargs)), 0, (task_name, int(s["doc_id"]), 1))
        )
    replies = model.generate_until(requests)
    for s, request, reply in zip(samples, requests, replies):
        s["cot"], s["answer_arguments"] = _reply(s), request.args[0]
        s["resps"], s["filtered_resps"] = [[reply]], [reply]
        s["acc"] = judge(s["doc"], reply)
    task_results = results.setdefault("results", {}).setdefault(task_name, {})
    task_results["acc,none"] = sum(s["acc"] for s in samples) / len(samples)


def _reply(sample: dict) -> str:
    resps = sample.get("filtered_resps")
    reply: Any = resps[0] if isinstance(resps, list) and resps else resps
    return "" if reply is None or (isinstance(reply, float) and math.isnan(reply)) else str(reply)
