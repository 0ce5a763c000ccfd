"""The retrieval grid: tasks x lengths x depths x samples, built once per model into token ids.

:func:`build_samples` loads each haystack source once (the filler, or a corpus through
:mod:`evalkit.data.corpus`, tokenized once and cached), draws each sample's needles from the seed
string ``"{seed}/{task}/{length}/{depth}/{index}"`` and builds its exact-length prompt. Every
scheme then reuses the same samples, so the schemes see identical prompts and the comparison with
the baseline is paired.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass

from evalkit.errors import EvalkitError
from evalkit.evals.retrieval.prompts import Haystack, build_prompt, build_template, encode, filler_haystack
from evalkit.evals.retrieval.tasks import TaskSpec

DEFAULT_LENGTHS = (1024, 2048, 4096, 8192)
DEFAULT_DEPTHS = (0.0, 25.0, 50.0, 75.0, 100.0)


@dataclass(frozen=True)
class Sample:
    task: str
    length: int
    depth: float
    index: int
    ids: tuple[int, ...]
    answers: tuple[str, ...]
    realised_depth: float
    max_new_tokens: int


def parse_length(value) -> int:
    """1024, "1024", "1k" (= 1024), "8K"."""
    if isinstance(value, bool):
        raise EvalkitError(f"bad context length {value!r}: write e.g. 1024 or 1k")
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"\s*(\d+)\s*([kK]?)\s*", str(value))
        if not m:
            raise EvalkitError(f"bad context length {value!r}: write e.g. 1024 or 1k")
        n = int(m.group(1)) * (1024 if m.group(2) else 1)
    if n < 1:
        raise EvalkitError(f"context length {value!r} must be positive")
    return n


def parse_depth(value) -> float:
    try:
        d = (
            float(str(value).strip().rstrip("%"))
            if not isinstance(value, (int, float)) or isinstance(value, bool)
            else float(value)
        )
    except ValueError:
        raise EvalkitError(f"bad needle depth {value!r}: write a percentage between 0 and 100, e.g. 50") from None
    if isinstance(value, bool) or not 0.0 <= d <= 100.0:
        raise EvalkitError(f"needle depth {value!r} is outside 0-100: depths are percentages of the haystack")
    return d


ANSWER_ROOM = 64  # tokens kept free for the answer when the default grid is capped at the model's maximum


def resolve_lengths(lengths, max_length: int | None) -> list[int]:
    """Explicit lengths must fit the model; the default grid is capped at its maximum less the
    answer room (prompt plus answer must fit in the model's context)."""
    if lengths is None:
        if max_length is None:
            return list(DEFAULT_LENGTHS)
        return sorted({min(n, max_length - ANSWER_ROOM) for n in DEFAULT_LENGTHS})
    too_long = [n for n in lengths if max_length is not None and n > max_length]
    if too_long:
        raise EvalkitError(
            f"context length {too_long[0]} is above the model's maximum of {max_length} tokens: "
            f"use --lengths up to {max_length}"
        )
    return list(lengths)


def load_haystack(kind: str, tokenizer, max_length: int, cache_dir) -> Haystack:
    """``filler`` or a corpus spec (see :mod:`evalkit.data.corpus`)."""
    if kind == "filler":
        return filler_haystack(tokenizer, max_length)
    from evalkit.data.corpus import load_corpus, tokenize_corpus

    corpus = load_corpus(kind)
    ids = tokenize_corpus(corpus, tokenizer, cache_dir)
    return Haystack.from_ids(ids, tokenizer, corpus.name)


def haystack_source(task: TaskSpec, haystack: str | None, corpus: str) -> str:
    """The haystack a task's prompts are cut from: ``haystack`` for every task when given, else the
    task's own kind (``corpus`` where the task asks for prose, the filler sentences otherwise)."""
    return haystack or (corpus if task.haystack == "corpus" else "filler")


def sample_needles(task: TaskSpec, seed: int, length: int, depth: float, index: int, count_tokens):
    """``(key, needles, max_new_tokens)`` of one sample: the needles drawn from the seed string
    ``"{seed}/{task}/{length}/{depth}/{index}"`` and the answer budget, the answers' tokens
    (``count_tokens(text)``) plus list markup ("1. ", newlines) around each and a few tokens. The one
    rule the run (:func:`build_samples`) and the dry run's sizing share."""
    from evalkit.evals.retrieval.tasks import draw_needles

    key = f"{seed}/{task.name}/{length}/{depth:g}/{index}"
    nd = draw_needles(task, key)
    return key, nd, count_tokens(" " + ", ".join(nd.answers)) + 4 * len(nd.answers) + 4


def build_samples(
    tasks: list[TaskSpec],
    tokenizer,
    lengths: list[int],
    depths: list[float],
    samples: int,
    seed: int,
    haystack: str | None,
    corpus: str,
    cache_dir,
    chat: bool | None = None,
    max_length: int | None = None,
) -> list[Sample]:
    sources: dict[str, Haystack] = {}
    out: list[Sample] = []
    for task in tasks:
        kind = haystack_source(task, haystack, corpus)
        if kind not in sources:
            sources[kind] = load_haystack(kind, tokenizer, max(lengths), cache_dir)
        for length in lengths:
            for depth in depths:
                for i in range(samples):
                    key, nd, max_new = sample_needles(
                        task, seed, length, depth, i, lambda text: len(encode(tokenizer, text))
                    )
                    template = build_template(tokenizer, task.intro, nd.question, nd.answer_prefix, chat)
                    ids, realised = build_prompt(
                        tokenizer,
                        template,
                        sources[kind],
                        nd.needles,
                        length,
                        depth,
                        random.Random(key + "/place"),
                        label=f"task {task.name}",
                    )
                    if max_length is not None and length + max_new > max_length:
                        raise EvalkitError(
                            f"task {task.name}: a {length}-token prompt plus its {max_new}-token answer "
                            f"exceeds the model's maximum of {max_length} tokens: use --lengths up to "
                            f"{max_length - max_new}"
                        )
                    out.append(Sample(task.name, length, depth, i, tuple(ids), nd.answers, realised, max_new))
    return out


def samples_digest(samples: list[Sample]) -> str:
    h = hashlib.sha256()
    for s in samples:
        h.update(
            json.dumps([s.task, s.length, s.depth, s.index, list(s.ids), list(s.answers), s.max_new_tokens]).encode()
        )
    return h.hexdigest()


def batches(samples: list[Sample], batch_size: int) -> list[list[int]]:
    """Sample indices grouped by (task, length), at most ``batch_size`` per group, in grid order."""
    groups: dict[tuple[str, int], list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault((s.task, s.length), []).append(i)
    return [idx[j : j + batch_size] for idx in groups.values() for j in range(0, len(idx), batch_size)]
