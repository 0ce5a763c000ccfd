"""Exact-length retrieval prompts, built as token ids with the model's tokenizer and chat template.

A prompt is the concatenation of token-id segments::

    [template head + instruction]  [haystack ... needle ... haystack ...]  [question + template tail + answer prefix]

The head and tail come from rendering the chat template (when the tokenizer has one) around a
placeholder and splitting there; without a template, plain text with a BOS token when the
tokenizer adds one. The answer prefix ("The pass key is") is appended after the generation prompt
so the model's first generated word is the answer. Every segment is tokenized once, the haystack
budget is ``length - len(head) - len(tail) - len(needles)``, and so the full prompt is exactly
``length`` tokens by construction (asserted), which is what the model is fed.

The haystack is a window of a token stream (the filler sentences repeated, or the corpus, cycled
when shorter than the window) ending at a sentence boundary, chosen so that it also starts at one
when such a window exists (with the corpus it nearly always does; with filler sentences the first
sentence may be cut). Needles are inserted at sentence boundaries only (after a token ending
in ``.``/``!``/``?``/newline that is followed by whitespace): needle 0 at the boundary nearest
``depth`` percent of the haystack, the others at seeded random boundaries. The realised depth (the
fraction of haystack tokens before needle 0) is kept with each sample.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass

import torch

from evalkit.errors import EvalkitError

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
_PLACEHOLDER = "\x00HAYSTACK\x00"


@dataclass
class Haystack:
    """A token stream with its sentence boundaries (positions where a needle may be inserted)."""

    ids: torch.LongTensor
    boundaries: torch.LongTensor  # sorted positions p: a needle may go between ids[p-1] and ids[p]
    name: str

    @classmethod
    def from_ids(cls, ids: torch.LongTensor, tokenizer, name: str) -> Haystack:
        ids = torch.as_tensor(ids, dtype=torch.long).flatten()
        if ids.numel() < 2:
            raise EvalkitError(f"haystack source {name!r} is empty: give a corpus (or 'filler') with text in it")
        uniq = torch.unique(ids).tolist()
        text = dict(zip(uniq, tokenizer.batch_decode([[i] for i in uniq])))
        ends = {i for i, t in text.items() if t.rstrip(" ").endswith((".", "!", "?", "\n"))}
        starts = {i for i, t in text.items() if t[:1].isspace()}
        seq = ids.tolist()
        bounds = [p for p in range(1, len(seq)) if seq[p - 1] in ends and seq[p] in starts]
        if not bounds:
            raise EvalkitError(
                f"haystack source {name!r} has no sentence boundary to hide a needle at: use prose or 'filler'"
            )
        return cls(ids, torch.tensor(bounds, dtype=torch.long), name)


def filler_haystack(tokenizer, min_tokens: int) -> Haystack:
    """RULER's repeated filler sentences, at least ``min_tokens`` long."""
    unit = len(tokenizer(" " + FILLER, add_special_tokens=False)["input_ids"])
    text = " " + " ".join([FILLER] * (min_tokens // max(unit, 1) + 2))  # every sentence starts with a space
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return Haystack.from_ids(torch.tensor(ids), tokenizer, "filler")


@dataclass(frozen=True)
class Template:
    """Token ids around the haystack: ``head + haystack + tail`` is the whole prompt."""

    head: tuple[int, ...]
    tail: tuple[int, ...]
    chat: bool


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def build_template(tokenizer, intro: str, question: str, answer_prefix: str, chat: bool | None = None) -> Template:
    """Head and tail ids; ``chat=None`` uses the chat template when the tokenizer has one."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    chat = has_template if chat is None else chat
    if chat and not has_template:
        raise EvalkitError("this tokenizer has no chat template: build plain prompts (chat=False)")
    content = f"{intro}\n\n{_PLACEHOLDER}\n\n{question}"
    if chat:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
        text = text + answer_prefix
        head, tail = text.split(_PLACEHOLDER)
        return Template(tuple(encode(tokenizer, head)), tuple(encode(tokenizer, tail)), True)
    head, tail = content.split(_PLACEHOLDER)
    head_ids = encode(tokenizer, head)
    bos = tokenizer.bos_token_id
    if bos is not None and tokenizer("a")["input_ids"][:1] == [bos]:
        head_ids = [bos] + head_ids
    return Template(tuple(head_ids), tuple(encode(tokenizer, tail + "\nAnswer: " + answer_prefix)), False)


def _nearest(bounds: list[int], target: float) -> int:
    i = bisect.bisect_left(bounds, target)
    cands = [bounds[j] for j in (i - 1, i) if 0 <= j < len(bounds)]
    return min(cands, key=lambda b: (abs(b - target), b))


def build_prompt(
    tokenizer,
    template: Template,
    haystack: Haystack,
    needles: tuple[str, ...],
    length: int,
    depth: float,
    rng: random.Random,
    label: str = "",
) -> tuple[list[int], float]:
    """One prompt of exactly ``length`` ids with needles[0] at ``depth`` percent; (ids, realised depth)."""
    needle_ids = [encode(tokenizer, " " + n) for n in needles]
    fixed = len(template.head) + len(template.tail) + sum(len(n) for n in needle_ids)
    budget = length - fixed
    if budget < 1:
        raise EvalkitError(
            f"{label or 'retrieval'}: the needle does not fit in {length} tokens (instruction, question "
            f"and needles take {fixed} tokens under this tokenizer): use a length above {fixed}"
        )
    stream, bounds_all = haystack.ids, haystack.boundaries
    n = stream.numel()
    # the window ends at a sentence boundary, and starts at one too when some boundary allows it
    ends = bounds_all.tolist()
    bset = {0, *ends}
    rng.shuffle(ends)
    end = next((e for e in ends[:4096] if (e - budget) % n in bset), ends[0])
    start = (end - budget) % n
    idx = (torch.arange(budget) + start) % n
    window = stream[idx]
    # insertion points: boundaries inside the window, its end, and its start when that is a boundary
    rel = (bounds_all - start) % n
    inside = sorted({budget, *rel[(rel > 0) & (rel < budget)].tolist(), *([0] if start in bset else [])})
    pos0 = _nearest(inside, depth / 100.0 * budget)
    others = [rng.choice(inside) for _ in needle_ids[1:]]
    inserts = sorted(zip([pos0, *others], range(len(needle_ids))), key=lambda t: (t[0], t[1]))
    ids: list[int] = list(template.head)
    prev = 0
    for pos, k in inserts:
        ids.extend(window[prev:pos].tolist())
        ids.extend(needle_ids[k])
        prev = pos
    ids.extend(window[prev:].tolist())
    ids.extend(template.tail)
    assert len(ids) == length, (len(ids), length)
    return ids, pos0 / budget
