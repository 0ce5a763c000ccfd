"""Data builders and scorers for evalkit's offline lm-eval tasks (used through ``!function``).

Every task here runs without the network. The data is built at run time from what is installed on
every machine that has lm-eval and evalkit:

* ``evalkit_mmlu4``: the 281 four-choice MMLU questions (57 subjects) that lm-eval ships as
  chain-of-thought few-shot prompts in ``lm_eval/tasks/mmlu/flan_cot_fewshot/_cot_prompts.json``.
  Each prompt holds ~5 questions as ``Q: ...\\n(A) .. (B) .. (C) .. (D) ..\\nA: ... The answer
  is (X).``; we parse question, options and gold letter. The first question of every subject is
  the few-shot ("dev") split, the remaining 224 are the test split.
* ``evalkit_topics_ppl``: documents of ~200 words of prose from Python's ``pydoc_data/topics.py``
  (code blocks and heading rules dropped), scored with rolling log-likelihood. The topics are the
  frozen copy evalkit ships (CPython 3.11.7's, ``evalkit.data.frozen``), the same on every Python.
* ``evalkit_passkey``: a short pass-key retrieval (the "grass is green" haystack of Mohtashami &
  Jaggi, 2023) scored by greedy generation, so ``generate_until`` goes through the KV scheme too.
* ``evalkit_recall``: a ~120-word prose passage from the same topics, then the first words of one
  of its sentences again; the model completes the sentence by copying it from the passage (greedy
  generation attending back to the stored K/V), scored on the next four words.

lm-eval calls a ``custom_dataset`` function with the task's ``metadata`` as keyword arguments and
expects a dict of split name -> ``datasets.Dataset``.
"""

from __future__ import annotations

import importlib.resources
import json
import random
import re

import datasets

MMLU_PROMPTS = "mmlu/flan_cot_fewshot/_cot_prompts.json"
_QUESTION = re.compile(r"^(.*?)\n\(A\)\s*(.*?)\s*\(B\)\s*(.*?)\s*\(C\)\s*(.*?)\s*\(D\)\s*(.*?)\s*$", re.S)
_ANSWER = re.compile(r"The answer is \(([A-J])\)")


def parse_mmlu_prompts(prompts: dict[str, str]) -> list[dict]:
    """Four-choice questions from lm-eval's flan CoT MMLU prompts: subject, question, choices, answer.

    Blocks that are not four-choice (a few college chemistry questions have five options) are skipped.
    """
    rows = []
    for subject in sorted(prompts):
        body = prompts[subject].split("\n\nQ: ", 1)[1]  # drop the "The following are ..." header
        for block in body.split("\n\nQ: "):
            question_part, _, reasoning = block.partition("\nA: ")
            match = _QUESTION.match(question_part.strip())
            gold = _ANSWER.findall(reasoning)
            if not match or not gold or "(E)" in match.group(5) or gold[-1] not in "ABCD":
                continue  # a question with five options (a few exist) is not a four-choice item
            rows.append({
                "subject": subject,
                "question": match.group(1).strip(),
                "choices": [c.strip() for c in match.groups()[1:]],
                "answer": "ABCD".index(gold[-1]),
            })
    return rows


def load_mmlu4(**kwargs) -> dict[str, datasets.Dataset]:
    path = importlib.resources.files("lm_eval.tasks").joinpath(MMLU_PROMPTS)
    rows = parse_mmlu_prompts(json.loads(path.read_text(encoding="utf-8")))
    seen, dev, test = set(), [], []
    for row in rows:
        (test if row["subject"] in seen else dev).append(row)
        seen.add(row["subject"])
    return {"dev": datasets.Dataset.from_list(dev), "test": datasets.Dataset.from_list(test)}


def topic_documents(words_per_doc: int = 200) -> list[dict]:
    """Prose paragraphs of pydoc's topics (sorted by topic), packed into ~words_per_doc-word documents.

    The topics are evalkit's frozen copy (CPython 3.11.7's, :mod:`evalkit.data.frozen`), never the
    running interpreter's, whose topics differ by Python version."""
    from evalkit.data.frozen import pydoc_topics

    topics = pydoc_topics()

    docs = []
    for topic in sorted(topics):
        paragraphs = [p.strip() for p in re.split(r"\n\s*\n", topics[topic])]
        prose = [p for p in paragraphs if p
                 and not re.search(r"^\s|^[*=\-~^]{3,}\s*$", p, flags=re.M) and len(p.split()) >= 8]
        chunk: list[str] = []
        for paragraph in prose:
            chunk.append(paragraph)
            if sum(len(c.split()) for c in chunk) >= words_per_doc:
                docs.append({"topic": topic, "text": "\n\n".join(chunk)})
                chunk = []
        if chunk:
            docs.append({"topic": topic, "text": "\n\n".join(chunk)})
    return docs


def load_topics(**kwargs) -> dict[str, datasets.Dataset]:
    return {"test": datasets.Dataset.from_list(topic_documents(int(kwargs.get("words_per_doc", 200))))}


def topics_results(doc: dict, results) -> dict:
    """Same bookkeeping as lm-eval's wikitext task: (log-likelihood, units) pairs per document."""
    (loglikelihood,) = results
    text = doc["text"]
    words = len(re.split(r"\s+", text))
    n_bytes = len(text.encode("utf-8"))
    return {"word_perplexity": (loglikelihood, words), "byte_perplexity": (loglikelihood, n_bytes),
            "bits_per_byte": (loglikelihood, n_bytes)}


FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
                 "I will quiz you about the important information there.")


def passkey_documents(num_items: int = 40, filler_repeats: int = 12, seed: int = 1234) -> list[dict]:
    """Pass keys (5 digits) hidden at depths spread evenly from start to end of the filler."""
    rng = random.Random(seed)
    docs = []
    for i in range(num_items):
        key = str(rng.randint(10000, 99999))
        depth = i / max(1, num_items - 1)
        before = round(depth * filler_repeats)
        needle = f"The pass key is {key}. Remember it. {key} is the pass key."
        parts = [FILLER] * before + [needle] + [FILLER] * (filler_repeats - before)
        docs.append({"input": PASSKEY_INTRO + " " + " ".join(parts) + "\nWhat is the pass key? The pass key is",
                     "passkey": key, "depth": round(depth, 4)})
    return docs


def load_passkey(**kwargs) -> dict[str, datasets.Dataset]:
    docs = passkey_documents(int(kwargs.get("num_items", 40)), int(kwargs.get("filler_repeats", 12)),
                             int(kwargs.get("seed", 1234)))
    return {"test": datasets.Dataset.from_list(docs)}


def passkey_results(doc: dict, results) -> dict:
    """exact_match: the first run of digits in the generated answer is the pass key."""
    digits = re.findall(r"\d+", results[0])
    return {"exact_match": float(bool(digits) and digits[0] == doc["passkey"])}


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _words(text: str) -> list[str]:
    """Lower-case words with punctuation and markup stripped (empty ones dropped), for comparison."""
    return [w for w in (re.sub(r"\W", "", t).lower() for t in text.split()) if w]


def recall_documents(num_items: int = 100, words_per_doc: int = 120, prefix_words: int = 6, target_words: int = 4,
                     seed: int = 1234) -> list[dict]:
    """Passages with one sentence to complete: the middle sentence of at least prefix + target + 2
    words whose first ``prefix_words`` words occur once in the passage; shuffled (seeded) so that the
    first items of a ``--limit`` come from many topics."""
    docs = []
    for doc in topic_documents(words_per_doc):
        text = doc["text"]
        sentences = [s for s in _SENTENCE_END.split(text) if len(s.split()) >= prefix_words + target_words + 2]
        if not sentences:
            continue
        words = sentences[len(sentences) // 2].split()
        prefix, target = " ".join(words[:prefix_words]), " ".join(words[prefix_words:prefix_words + target_words])
        if text.count(prefix) == 1 and len(_words(target)) == target_words:
            docs.append({"topic": doc["topic"], "passage": text, "prefix": prefix, "target": target})
    random.Random(seed).shuffle(docs)
    return docs[:num_items]


def load_recall(**kwargs) -> dict[str, datasets.Dataset]:
    docs = recall_documents(int(kwargs.get("num_items", 100)), int(kwargs.get("words_per_doc", 120)),
                            int(kwargs.get("prefix_words", 6)), int(kwargs.get("target_words", 4)),
                            int(kwargs.get("seed", 1234)))
    return {"test": datasets.Dataset.from_list(docs)}


def recall_results(doc: dict, results) -> dict:
    """exact_match: the generation's first words are the sentence's next words (case and punctuation ignored)."""
    target = _words(doc["target"])
    return {"exact_match": float(_words(results[0])[:len(target)] == target)}
