"""Writes ``mrcr_standin.json``, the offline stand-in for ``openai/mrcr`` (a maintainer's tool: the items
are shipped; a test checks that this script reproduces them byte for byte).

    python tasks/generation/make_mrcr_standin.py

Each item has ``openai/mrcr``'s fields: ``prompt`` (a JSON list of chat messages), ``answer``,
``random_string_to_prepend``, ``n_needles``, ``desired_msg_index``, ``total_messages`` and ``n_chars``.
As in the real set, a conversation is a run of user requests ("write a poem about tapirs") and the
assistant's replies; ``n_needles`` of the requests are the same request (format and topic), the others
are distractors of other formats and topics; the last user turn asks the model to begin with a random
string and repeat the k-th (1-indexed) reply to the repeated request. The answer is that string followed
by that reply, graded as the real set is (:func:`mrcr.grade`). Two departures from the real set, so that
the embedded 135M-parameter model scores above 0 and an AUC and a recovery are defined: the request reads
"Begin your reply with X, then repeat the k-th ... word for word" (the real set: "Prepend X to the k-th
..."; the embedded model repeats the instruction back to that), and X starts with a capital letter (it
capitalises a reply's first letter).

The replies are short sentences drawn from the fixed word lists below with a seeded ``random.Random``
(no corpus: Python's own documentation text differs between interpreter versions), so the items are the
same on every machine. The set holds :data:`PER_CELL` items per needle count (2 and 4) and target length
(:data:`TARGET_CHARS`, about 0.7k, 1.5k, 3k and 6k tokens of a 4-characters-per-token tokenizer), so
that each of the power-of-two buckets 1k, 2k, 4k and 8k holds items with room left for the answer in an
8k-context model. The real set runs from 4k to 1M tokens with 8 needles as well.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "mrcr_standin.json"
SEED = 20250411
PER_CELL = 2
NEEDLES = (2, 4)
TARGET_CHARS = (2400, 5200, 10800, 22000)
FORMATS = ("poem", "riddle", "short story", "limerick", "letter", "song")
TOPICS = (
    "tapirs",
    "lighthouses",
    "glaciers",
    "bicycles",
    "owls",
    "volcanoes",
    "libraries",
    "bees",
    "trains",
    "deserts",
    "violins",
    "comets",
)
WORDS = {
    "adj": "quiet bright old gentle wild silver hidden golden patient distant small heavy warm cold".split(),
    "noun": "river morning stone window garden shadow song field harbor lantern road cloud bridge forest".split(),
    "verb": "carries remembers follows greets watches gathers answers crosses keeps holds".split(),
}


def _sentence(rng: random.Random, topic: str) -> str:
    a, b = rng.choice(WORDS["adj"]), rng.choice(WORDS["adj"])
    n, m = rng.choice(WORDS["noun"]), rng.choice(WORDS["noun"])
    v = rng.choice(WORDS["verb"])
    return f"The {a} {n} of the {topic} {v} a {b} {m}."


def _reply(rng: random.Random, fmt: str, topic: str) -> str:
    lines = [_sentence(rng, topic) for _ in range(rng.randint(2, 4))]
    return f"{fmt.capitalize()} about {topic}:\n" + "\n".join(lines)


def _request(fmt: str, topic: str) -> str:
    return f"write a {fmt} about {topic}"


def _ordinal(k: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(k, f"{k}th")


def make_item(rng: random.Random, n_needles: int, target_chars: int) -> dict:
    """One conversation of about ``target_chars`` characters with ``n_needles`` repeated requests."""
    fmt, topic = rng.choice(FORMATS), rng.choice(TOPICS)
    others = [(f, t) for f in FORMATS for t in TOPICS if (f, t) != (fmt, topic)]
    turns: list[tuple[str, str]] = []
    size = 0
    while size < target_chars:
        f, t = rng.choice(others)
        turns.append((_request(f, t), _reply(rng, f, t)))
        size += len(turns[-1][0]) + len(turns[-1][1])
    slots = sorted(rng.sample(range(len(turns) + n_needles), n_needles))
    needles = []
    for slot in slots:
        pair = (_request(fmt, topic), _reply(rng, fmt, topic))
        turns.insert(slot, pair)
        needles.append(pair[1])
    k = rng.randint(1, n_needles)
    prefix = rng.choice(string.ascii_uppercase) + "".join(
        rng.choice(string.ascii_letters + string.digits) for _ in range(9)
    )
    messages = []
    for user, assistant in turns:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    messages.append(
        {
            "role": "user",
            "content": f"Begin your reply with {prefix}, then repeat the {_ordinal(k)} (1 indexed) {fmt} about "
            f"{topic} word for word. Do not include any other text in your response.",
        }
    )
    return {
        "prompt": json.dumps(messages),
        "answer": prefix + needles[k - 1],
        "random_string_to_prepend": prefix,
        "n_needles": n_needles,
        "desired_msg_index": 2 * slots[k - 1] + 1,
        "total_messages": len(messages),
        "n_chars": sum(len(m["content"]) for m in messages),
    }


def make_items() -> list[dict]:
    rng = random.Random(SEED)
    return [make_item(rng, n, chars) for n in NEEDLES for chars in TARGET_CHARS for _ in range(PER_CELL)]


def render(items: list[dict]) -> str:
    return json.dumps({"test": items}, indent=0, sort_keys=True) + "\n"


if __name__ == "__main__":
    OUT.write_text(render(make_items()))
    print(f"wrote {OUT} ({len(make_items())} items)")
