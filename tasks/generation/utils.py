"""Data of evalkit's offline generate-until task ``evalkit_arith`` (``evalkit_arith.yaml``): short arithmetic
word problems with whole-number answers, read from ``arith.json`` beside this file (``train``: three solved
examples for few-shot prompts; ``test``: the items)."""

from __future__ import annotations

import json
from pathlib import Path

import datasets


def load_arith(**kwargs) -> dict[str, datasets.Dataset]:
    data = json.loads((Path(__file__).parent / "arith.json").read_text())
    return {split: datasets.Dataset.from_list(docs) for split, docs in data.items()}
