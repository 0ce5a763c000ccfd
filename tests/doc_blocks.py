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


# ---- re-writing the store-backed blocks (maintainers, after re-making a store) ----------------------------
STORE_BLOCKS = {  # block -> the command whose output it is (docs/reproducibility.md, "Re-making the published stores")
    "results": ["report", "published/default", "--format", "md"],
    "engine": ["report", "published/engine", "--format", "md"],
    "vllm-dtypes": ["report", "published/vllm-dtypes", "--format", "md"],
    "llamacpp": ["report", "published/llamacpp", "--format", "md"],
    "conformance": ["conformance", "--from", "published/conformance", "--format", "md"],
    "conformance-bf16": ["conformance", "--from", "published/conformance-bf16", "--format", "md"],
}


def write_block(name: str, body: str) -> None:
    """Replace block ``name``'s text on its page with ``body`` (one newline after the begin marker)."""
    page = doc_block_page(name)
    begin, end = markers(name)
    text = page.read_text()
    head, tail = text[: text.index(begin) + len(begin)], text[text.index(end) :]
    page.write_text(f"{head}\n{body.strip(chr(10))}\n{tail}")


def main(argv=None) -> None:
    """``python -m tests.doc_blocks [NAME ...]``: re-write the named store-backed blocks (default: all) from
    their commands' output, run as the tests run them."""
    import subprocess
    import sys

    names = (argv if argv is not None else sys.argv[1:]) or list(STORE_BLOCKS)
    for name in names:
        cmd = [sys.executable, "-m", "evalkit", *STORE_BLOCKS[name]]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout
        write_block(name, out)
        print(f"{name}: {doc_block_page(name).relative_to(ROOT)} <- {' '.join(cmd[2:])}")


if __name__ == "__main__":
    main()
