"""The package's layout is its architecture: each folder is one floor, and no module imports from a
floor above its own (docs/layout.md). The test tree mirrors the package.

Floors, low to high: the foundations (errors, units, runtime) -> what is evaluated (models, data) ->
the KV formats (kv) -> the storage path in a model (integration) -> the evaluations (evals) -> what is
planned from them (scales, planning) -> the real engines (engines) -> sweeps -> the report -> the
command line. Imports inside a function count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "evalkit"
FLOORS = (
    ("errors", "units", "runtime"),
    ("models", "data"),
    ("kv",),
    ("integration",),
    ("evals",),
    ("scales", "planning"),
    ("engines",),
    ("sweep",),
    ("report",),
    ("cli",),
)
ENTRY_POINTS = ("__init__", "__main__")  # the package's lazy public names and `python -m evalkit`


def floor_of(part: str) -> int:
    for level, names in enumerate(FLOORS):
        if part in names:
            return level
    raise AssertionError(f"evalkit/{part} is on no floor: add it to FLOORS here and to docs/layout.md")


def evalkit_imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "evalkit":
            names = [f"evalkit.{a.name}" for a in node.names] if node.module == "evalkit" else [node.module]
            found += [(node.lineno, name) for name in names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "evalkit"]
    return found


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_data" not in p.parts and "__pycache__" not in p.parts)


def test_every_top_level_name_is_a_floor_or_an_entry_point():
    for p in PACKAGE.iterdir():
        name = p.name.removesuffix(".py")
        if p.name.startswith(("_data", "__pycache__")) or name in ENTRY_POINTS:
            continue
        if p.is_dir() or p.suffix == ".py":
            floor_of(name)


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_no_module_imports_from_a_floor_above_its_own(path: Path):
    top = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
    if top in ENTRY_POINTS:
        return
    mine = floor_of(top)
    above = [
        f"line {line}: {name}"
        for line, name in evalkit_imports(path)
        if len(name.split(".")) > 1 and name.split(".")[1] not in ENTRY_POINTS and floor_of(name.split(".")[1]) > mine
    ]
    assert not above, f"{path.relative_to(ROOT)} (floor {top}) imports from above: {above}"


def test_the_test_tree_mirrors_the_package():
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders - {"benchmarks"} <= packages, f"test folders without a package folder: {folders - packages}"
    loose = sorted(p.name for p in (ROOT / "tests").glob("test_*.py") if p.name != "test_layout.py")
    assert not loose, f"test files outside the mirrored tree: {loose}"
