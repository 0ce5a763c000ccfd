"""Writes the long-context fixture's JSONL items (a maintainer's tool: the items are shipped, CI never runs this).

    pip install wonderwords            # lm-eval's RULER generators need it (lm_eval[ruler]); nltk is installed
    python tasks/longcontext/make_fixture.py

* ``ruler_niah_single_1.jsonl`` and ``ruler_vt.jsonl``: RULER items made by lm-eval's own generators
  (``lm_eval.tasks.ruler.prepare_niah.generate_samples`` with niah_single_1's settings and template;
  ``lm_eval.tasks.ruler.vt_utils.sys_vartrack_w_noise_random``), sized with the embedded model's
  tokenizer, :data:`PER_LENGTH` items at each of :data:`NIAH_LENGTHS` / :data:`VT_LENGTHS` tokens. The
  only departure from the real tasks' data: variable tracking's in-context example is built at 350
  tokens instead of 500, so that a 768-token item has room for it. Seeded: the same lm-eval and
  tokenizer give the same items.
* ``longbench2.jsonl``: items in LongBench v2's fields (``context``, ``question``, ``choices``, ``answer``
  as a letter, ``length`` as short/medium, ``difficulty``, ``domain``), their contexts the frozen Python
  documentation topics evalkit ships (``evalkit.data.frozen.pydoc_topics``): "which sentence appears in
  the text?" with the right sentence and three from other topics. Real LongBench v2 contexts run from 8k
  to 2M words; these run ~170 (short) and ~420 (medium) tokens.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
NIAH_LENGTHS = (256, 512)
VT_LENGTHS = (768, 1024)  # its in-context example and 5-hop chain need ~700 tokens
PER_LENGTH = 4
LONGBENCH_ITEMS = {"short": 4, "medium": 4}
LONGBENCH_WORDS = {"short": 120, "medium": 300}
SEED = 20240406


def _tokenizer():
    from transformers import AutoTokenizer

    from evalkit.models.loading import ensure_embedded

    return AutoTokenizer.from_pretrained(str(ensure_embedded("smollm2-135m")))


def ruler_niah_single_1(tokenizer) -> list[dict]:
    from lm_eval.tasks.ruler.niah_utils import TEMPLATE
    from lm_eval.tasks.ruler.prepare_niah import generate_samples, get_haystack

    items = []
    for length in NIAH_LENGTHS:
        random.seed(SEED + length)
        items += generate_samples(
            get_haystack(type_haystack="repeat"),
            max_seq_length=length,
            template=TEMPLATE,
            type_haystack="repeat",
            type_needle_k="words",
            type_needle_v="numbers",
            num_samples=PER_LENGTH,
            TOKENIZER=tokenizer,
        )
    return items


def ruler_vt(tokenizer) -> list[dict]:
    import numpy as np
    from lm_eval.tasks.ruler.vt_utils import sys_vartrack_w_noise_random

    items = []
    for length in VT_LENGTHS:
        random.seed(SEED + length)
        np.random.seed(SEED + length)
        icl = sys_vartrack_w_noise_random(tokenizer=tokenizer, num_samples=1, max_seq_length=350, incremental=5)[0]
        items += sys_vartrack_w_noise_random(
            tokenizer=tokenizer, num_samples=PER_LENGTH, max_seq_length=length, icl_example=icl, incremental=5
        )
    return items


def _sentences(text: str) -> list[str]:
    flat = " ".join(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("   "))
    return [s for s in re.split(r"(?<=[.!?])\s+", flat) if 40 <= len(s) <= 160 and not set(s) <= set("*=-")]


def longbench2(seed: int = SEED) -> list[dict]:
    from evalkit.data.frozen import pydoc_topics

    rng = random.Random(seed)
    topics = pydoc_topics()
    names = [n for n, t in topics.items() if len(t.split()) >= 700 and len(_sentences(t)) >= 8]
    items = []
    for length, count in LONGBENCH_ITEMS.items():
        i = 0
        while i < count:
            name = rng.choice(names)
            words = topics[name].split()
            start = rng.randrange(0, max(1, len(words) - LONGBENCH_WORDS[length]))
            context = " ".join(words[start : start + LONGBENCH_WORDS[length]])
            inside = [s for s in _sentences(topics[name]) if s in context]
            others = [s for n in names if n != name for s in _sentences(topics[n]) if s not in context]
            if not inside:
                continue
            i += 1
            right = rng.choice(inside)
            choices = rng.sample(others, 3)
            answer = rng.randrange(4)
            choices.insert(answer, right)
            items.append(
                {
                    "_id": f"fixture-{length}-{i - 1}",
                    "domain": "Single-Document QA",
                    "sub_domain": f"python docs: {name}",
                    "difficulty": "easy",
                    "length": length,
                    "question": "Which of the following sentences appears, word for word, in the text?",
                    "choices": choices,
                    "answer": "ABCD"[answer],
                    "context": context,
                }
            )
    return items


def write(name: str, items: list[dict]) -> None:
    with open(HERE / name, "w") as f:
        for item in items:
            f.write(json.dumps(item, sort_keys=True) + "\n")
    print(f"{name}: {len(items)} items")


def main() -> None:
    tokenizer = _tokenizer()
    write("ruler_niah_single_1.jsonl", ruler_niah_single_1(tokenizer))
    write("ruler_vt.jsonl", ruler_vt(tokenizer))
    write("longbench2.jsonl", longbench2())


if __name__ == "__main__":
    main()
