"""The prose readings of the published tables write order claims only where the data make them.

A reading that says "E4M3 below E5M2" must say it as the paired claim the store resolves
(``evalkit.report.order.CLAIM_PATTERN``: the pair, its paired interval, the float realisations behind
it), so a re-made store that no longer orders the pair fails here instead of leaving a stale sentence.
"""

from __future__ import annotations

import re
from functools import cache

import pytest

from evalkit.report import load_store, order, summary_frame

from tests.doc_blocks import ROOT, doc_pages

STORES = ("default", "vllm-dtypes", "llamacpp", "engine")


@cache
def frame(store: str):
    return summary_frame(load_store(ROOT / "published" / store))


def made_claims() -> dict[str, str]:
    """Every claim a published store's data make -> the store that makes it."""
    return {c.text(): store for store in STORES for c in order.claims(frame(store))}


def test_the_readme_reading_writes_the_default_stores_order_claims():
    text = (ROOT / "README.md").read_text()
    written = order.claims_in(text)
    assert written, "the README's reading of the default table should state at least one paired order claim"
    assert order.disagreements(text, frame("default")) == []


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_written_claim_is_one_a_published_store_makes(page):
    made = made_claims()
    stale = [written for _, _, written in order.claims_in(page.read_text()) if written not in made]
    assert stale == [], f"{page.relative_to(ROOT)}: claims no published store makes (re-read them): {stale}"


def test_a_claim_the_data_do_not_make_is_caught():
    """The check bites: the README's claim with its pair reversed, and with its interval changed."""
    text = (ROOT / "README.md").read_text()
    lower, higher, written = order.claims_in(text)[0]
    reversed_claim = written.replace(f"{lower} < {higher}", f"{higher} < {lower}")
    assert order.disagreements(reversed_claim, frame("default")), reversed_claim
    moved = re.sub(r"\[[^\]]*\]", "[+0.01, +9.99]", written, count=1)
    assert moved != written and order.disagreements(moved, frame("default")), moved
