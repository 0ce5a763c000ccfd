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


# two-file import cycles that predate the rule (inside the KV formats and the report); none may be added
KNOWN_CYCLES = {
    ("evalkit.engines.triton_ds_mla", "evalkit.engines.triton_store"),
    ("evalkit.engines.triton_rotations", "evalkit.engines.triton_store"),
    ("evalkit.kv.ds_mla", "evalkit.kv.vllm_codecs"),
    ("evalkit.kv.engine_dtypes", "evalkit.kv.scheme"),
    ("evalkit.kv.formats", "evalkit.kv.rounding"),
    ("evalkit.kv.int4_per_token_head", "evalkit.kv.vllm_codecs"),
    ("evalkit.kv.llamacpp_codecs", "evalkit.kv.scheme"),
    ("evalkit.kv.llamacpp_codecs", "evalkit.kv.vllm_codecs"),
    ("evalkit.kv.nvfp4_kv", "evalkit.kv.vllm_codecs"),
    ("evalkit.kv.per_token_head", "evalkit.kv.quantize"),
    ("evalkit.kv.quantize", "evalkit.kv.vllm_codecs"),
    ("evalkit.kv.scheme", "evalkit.kv.vllm_codecs"),
    ("evalkit.kv.turboquant", "evalkit.kv.vllm_codecs"),
    ("evalkit.kv.ultraquant", "evalkit.kv.vllm_codecs"),
    ("evalkit.report", "evalkit.report.recommend"),
    ("evalkit.report", "evalkit.report.tables"),
}


def module_imports() -> dict[str, set[str]]:
    """module -> the package modules it imports, function-local imports included."""
    names = {}
    for p in modules():
        name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
        names[name.removesuffix(".__init__")] = p
    out = {}
    for name, p in names.items():
        found = set()
        for _, imported in evalkit_imports(p):
            found.add(imported)
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module == imported:
                    found |= {f"{imported}.{a.name}" for a in node.names}
        out[name] = {m for m in found if m in names and m != name}
    return out


def test_no_two_modules_import_each_other():
    """A cycle a function-local import hides is still a cycle: two modules that need each other are one idea
    split wrong (the engine backends and their decode paths, the evaluations and their sizing)."""
    edges = module_imports()
    cycles = {tuple(sorted((a, b))) for a in edges for b in edges[a] if a in edges.get(b, ())}
    cycles = {c for c in cycles if "evalkit" not in c}  # the package's lazy names reach every module
    assert cycles == KNOWN_CYCLES, (
        f"new two-module import cycles: {sorted(cycles - KNOWN_CYCLES)}; gone (drop them here): {sorted(KNOWN_CYCLES - cycles)}"
    )
    assert (
        not {
            ("evalkit.engines.vllm_backend", "evalkit.engines.vllm_decode"),
            ("evalkit.evals.decode.evaluation", "evalkit.evals.decode.workload"),
            ("evalkit.evals.perplexity.evaluation", "evalkit.evals.perplexity.workload"),
        }
        & cycles
    )
