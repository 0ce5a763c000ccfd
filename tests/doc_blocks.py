"""The marked blocks of the documentation: ``<!-- NAME:begin -->`` ... ``<!-- NAME:end -->``.

A block is a command's output pasted into README.md or a page of docs/ (the results table, the engine
table, the conformance section); a test holds it to that output. The tests find a block by its name,
not by its page, so a block can move between pages without its test changing. Each marker must
occur exactly once across all pages, so a test never compares against a stale copy.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def doc_pages() -> list[Path]:
    """README.md and every Markdown page under docs/, in a fixed order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def doc_block_page(name: str) -> Path:
    """The one page holding block ``name``: AssertionError naming the pages when it is on none or several."""
    begin, end = markers(name)
    pages = [p for p in doc_pages() if begin in p.read_text()]
    where = ", ".join(str(p.relative_to(ROOT)) for p in pages) or "no page"
    assert len(pages) == 1, f"block {name!r} ({begin}) must be on exactly one of README.md, docs/*.md: found on {where}"
    text = pages[0].read_text()
    assert text.count(begin) == 1 and text.count(end) == 1 and text.index(begin) < text.index(end), (
        f"{pages[0].relative_to(ROOT)}: block {name!r} needs one {begin} followed by one {end}"
    )
    return pages[0]


def doc_block(name: str) -> str:
    """The text between block ``name``'s markers, exactly as on its page (callers strip as they compare)."""
    begin, end = markers(name)
    text = doc_block_page(name).read_text()
    return text[text.index(begin) + len(begin) : text.index(end)]
