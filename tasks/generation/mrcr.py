"""OpenAI MRCR (multi-round co-reference) as lm-eval generate-until tasks: ``mrcr_2needle`` and
``mrcr_4needle`` (the hub set ``openai/mrcr``) and the offline stand-in ``mrcr_standin``
(``mrcr_standin.json``, written by ``make_mrcr_standin.py``).

An item is a chat: many user requests ("write a poem about tapirs") with the assistant's replies, some
of them the same request; the last user turn asks for the k-th reply to that request with a random
string prepended. The conversation is sent as the chat it is (:class:`MRCRTask`: every turn through
the model's chat template; without the template, "User: ..." / "Assistant: ..." paragraphs), not as one
user message holding a transcript.

Grading, as ``openai/mrcr``'s dataset card gives it (:func:`grade`): a response that does not start
with the item's ``random_string_to_prepend`` scores 0; otherwise the prefix is removed from the response
and from the answer and the score is ``difflib.SequenceMatcher(None, response, answer).ratio()``, in
[0, 1]. The per-item score is lm-eval's metric ``mrcr_score``; evalkit's generation evaluation buckets
it by prompt length and computes the AUC and recovery (``evalkit.evals.generation.mrcr``).

The hub items run from 4k to 1M tokens; :func:`load_openai` keeps those whose prompt, in the served
model's own tokens, leaves room for the output budget within ``max_seq_length`` (task metadata, 131,072
by default), so lm-eval never cuts a conversation from the left, and the first ``items_per_bucket`` (task
metadata, 25: of the set's 100 per bucket, as the GPU preset takes 25 of RULER's items per length) of each
power-of-two length bucket.
"""

from __future__ import annotations

import json
from difflib import SequenceMatcher
from pathlib import Path

import datasets
from lm_eval.api.task import ConfigurableTask

STANDIN = Path(__file__).resolve().parent / "mrcr_standin.json"
TEMPLATE_TOKENS_PER_MESSAGE = 8  # room for a chat template's role markers per message when counting


def grade(response: str, answer: str, random_string_to_prepend: str) -> float:
    """openai/mrcr's grade: 0 unless the response starts with the prefix, else the SequenceMatcher ratio
    of response and answer, each without the prefix."""
    if not response.startswith(random_string_to_prepend):
        return 0.0
    response = response.removeprefix(random_string_to_prepend)
    answer = answer.removeprefix(random_string_to_prepend)
    return float(SequenceMatcher(None, response, answer).ratio())


def messages(doc: dict) -> list[dict]:
    return json.loads(doc["prompt"])


def doc_to_text(doc: dict) -> str:
    """The conversation as plain text (no chat template): one paragraph per turn."""
    turns = [f"{m['role'].capitalize()}: {m['content']}" for m in messages(doc)]
    return "\n\n".join(turns) + "\n\nAssistant:"


def process_results(doc: dict, results: list) -> dict:
    response = results[0] if results else ""
    return {"mrcr_score": grade(str(response), doc["answer"], doc["random_string_to_prepend"])}


class MRCRTask(ConfigurableTask):
    """A generate-until task whose document is a whole chat: the prompt is the conversation itself."""

    def __init__(self, config: dict | None = None):
        super().__init__(config={k: v for k, v in (config or {}).items() if k != "class"})

    def fewshot_context(
        self,
        doc,
        num_fewshot,
        system_instruction=None,
        apply_chat_template=False,
        fewshot_as_multiturn=False,
        chat_template=None,
        gen_prefix=None,
    ):
        if num_fewshot:
            raise ValueError("MRCR is zero-shot: its items are whole conversations (drop --num-fewshot)")
        chat = messages(doc)
        if system_instruction:
            chat = [{"role": "system", "content": system_instruction}, *chat]
        if apply_chat_template and chat_template is not None:
            return chat_template(chat, add_generation_prompt=True)
        text = doc_to_text(doc)
        return f"{system_instruction}\n\n{text}" if system_instruction else text


def load_standin(**kwargs) -> dict[str, datasets.Dataset]:
    data = json.loads(STANDIN.read_text())
    return {split: datasets.Dataset.from_list(docs) for split, docs in data.items()}


def _fitting(docs: list[dict], pretrained: str, limit: int) -> list[tuple[dict, int]]:
    """(doc, its prompt tokens) for the docs whose messages, in ``pretrained``'s tokens plus a chat
    template's markers, fit ``limit``."""
    from transformers import AutoTokenizer

    cheap = [d for d in docs if d["n_chars"] <= 8 * limit]  # no tokenizer packs more than 8 characters a token
    tok = AutoTokenizer.from_pretrained(pretrained)
    out = []
    for d in cheap:
        chat = messages(d)
        count = sum(len(tok(m["content"], add_special_tokens=False)["input_ids"]) for m in chat)
        count += TEMPLATE_TOKENS_PER_MESSAGE * len(chat)
        if count <= limit:
            out.append((d, count))
    return out


def _per_bucket(docs: list[tuple[dict, int]], cap: int | None) -> list[dict]:
    """The first ``cap`` docs (dataset order) of each power-of-two length bucket (all with no cap)."""
    seen: dict[int, int] = {}
    out = []
    for d, count in docs:
        edge = 1 << max(count - 1, 1).bit_length()
        seen[edge] = seen.get(edge, 0) + 1
        if cap is None or seen[edge] <= cap:
            out.append(d)
    return out


def load_openai(
    needles: int,
    max_seq_length: int = 131072,
    max_gen_toks: int = 0,
    items_per_bucket: int | None = None,
    pretrained=None,
    **kwargs,
):
    """openai/mrcr's ``<needles>needle.parquet`` (from the hub or its local cache): the items that fit,
    at most ``items_per_bucket`` of each length bucket (the first ones in the set's order)."""
    if pretrained is None:
        raise ValueError("mrcr needs the served model (metadata 'pretrained') to count its prompts' tokens")
    from huggingface_hub import hf_hub_download

    path = hf_hub_download("openai/mrcr", f"{needles}needle.parquet", repo_type="dataset")
    docs = datasets.load_dataset("parquet", data_files={"test": path})["test"].to_list()
    fitting = _fitting(docs, str(pretrained), int(max_seq_length) - int(max_gen_toks))
    kept = _per_bucket(fitting, None if items_per_bucket is None else int(items_per_bucket))
    return {"test": datasets.Dataset.from_list(kept)}


def load_2needle(**kwargs):
    return load_openai(2, **kwargs)


def load_4needle(**kwargs):
    return load_openai(4, **kwargs)
