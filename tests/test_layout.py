"""The package's layout is its architecture: each folder is one floor, and no module imports from a
floor above its own (docs/layout.md). The test tree mirrors the package.

Floors, low to high: the foundations (errors, units, runtime) -> what is evaluated (models, data) ->
the KV formats (kv) -> the storage path in a model (integration) -> the evaluations (evals) -> what is
planned from them (scales, planning) -> the real engines (engines) -> sweeps -> the report -> the
command line. Imports inside a function count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import re
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
    cross = {"benchmarks", "numerics"}  # the benchmarks' tests; the numerics fingerprints across the package
    assert folders - cross <= packages, f"test folders without a package folder: {folders - packages - cross}"
    loose = sorted(p.name for p in (ROOT / "tests").glob("test_*.py") if p.name != "test_layout.py")
    assert not loose, f"test files outside the mirrored tree: {loose}"


def module_names(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` (a package is its ``__init__``)."""
    out = {}
    for p in sorted(q for q in package.rglob("*.py") if "_data" not in q.parts and "__pycache__" not in q.parts):
        name = ".".join(p.relative_to(package.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def module_imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the package modules it imports, function-local (and TYPE_CHECKING) imports included.

    ``import evalkit.a.b`` imports ``evalkit.a.b``; ``from evalkit.a import b`` imports ``evalkit.a.b`` where
    ``b`` is a submodule, and ``evalkit.a`` (the names it defines) where it is not. The parent packages that
    Python initialises on the way are not counted: a package's ``__init__`` that hands on its modules' names
    is not in a circle with them."""
    names = module_names(package)
    out = {}
    for name, p in names.items():
        found = set()
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    found.add(sub if sub in names else node.module)
        out[name] = {m for m in found if m in names and m != name}
    return out


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of a directed graph, iteratively (each component sorted)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            child = next(successors, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(sorted(component))
    return out


def import_circles(package: Path = PACKAGE) -> set[tuple[str, ...]]:
    """Every set of two or more modules that import each other, directly or around a longer loop."""
    return {tuple(c) for c in strongly_connected(module_imports(package)) if len(c) > 1}


def test_the_circle_finder_finds_loops_of_every_length():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}, "f": {"g"}, "g": {"f"}}
    assert sorted(c for c in strongly_connected(edges) if len(c) > 1) == [["a", "b", "c"], ["f", "g"]]
    assert sorted(map(tuple, strongly_connected(edges))) == [("a", "b", "c"), ("d",), ("e",), ("f", "g")]


def test_a_loop_through_a_function_local_import_and_a_submodule_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from pkg.a import A\n",  # a package face handing on a name: no circle with pkg.a
        "a.py": "A = 1\n\ndef f():\n    from pkg.sub import b  # b is a module: imports pkg.sub.b\n",
        "sub/__init__.py": "",
        "sub/b.py": "import pkg.c\n",
        "c.py": "from pkg.a import A  # a name: imports pkg.a\n",
        "d.py": "from pkg import a\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    edges = module_imports(pkg)
    assert edges["pkg.a"] == {"pkg.sub.b"} and edges["pkg.d"] == {"pkg.a"} and edges["pkg"] == {"pkg.a"}
    assert import_circles(pkg) == {("pkg.a", "pkg.c", "pkg.sub.b")}


def test_the_scheme_grammar_reaches_no_codec_family():
    """kv/scheme.py hands a prefixed name to the family registered for it (evalkit.kv.codec): neither it nor
    anything it imports, however indirectly, imports a codec family (evalkit.kv.codecs)."""
    edges = module_imports()
    seen, todo = set(), ["evalkit.kv.scheme"]
    while todo:
        for m in edges[todo.pop()] - seen:
            seen.add(m)
            todo.append(m)
    assert "evalkit.kv.codec" in seen
    assert not sorted(m for m in seen if m.startswith("evalkit.kv.codecs")), sorted(seen)


def test_no_modules_import_each_other_around_a_loop():
    """A cycle a function-local import hides is still a cycle, and so is one that runs through three modules
    or eleven: modules that need each other are one idea split wrong (the engine backends and their decode
    paths, the scheme parser and the engine codecs). There is no allow-list."""
    circles = sorted(import_circles())
    assert not circles, "modules importing each other around a loop (open one import of each): " + "; ".join(
        " <-> ".join(c) for c in circles
    )


HOOK = re.compile(r"^(evalkit(?:\.\w+)+):[\w.]+$")  # "module:function", resolved when used


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_no_hook_string_reaches_a_floor_above(path: Path):
    """A ``"module:function"`` string (an engine's hooks, an evaluation's report hooks) is an import made
    later: it names nothing above its module's floor. What a lower floor needs from a higher one is
    registered from above (the report's figures by name: evalkit.report.evals.FIGURES)."""
    top = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
    if top in ENTRY_POINTS:
        return
    above = [
        f"line {node.lineno}: {node.value}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and HOOK.match(node.value)
        if floor_of(HOOK.match(node.value).group(1).split(".")[1]) > floor_of(top)
    ]
    assert not above, f"{path.relative_to(ROOT)} (floor {top}) names hooks above it: {above}"


# the module the `evalkit.evals` entry point of environments installed before the serving evaluation moved
# to engines/vllm/ names; pyproject.toml names the new module, so it goes once no such environment is left
ENTRY_POINT_STUBS = {"evalkit.engines.serving_eval"}


def names_vllm(name: str) -> bool:
    return "vllm" in name.split(".")[-1] or any(part == "vllm" or part.startswith("vllm_") for part in name.split("."))


def test_only_vllms_folder_names_vllm():
    """vLLM has one home, evalkit/engines/vllm/ (as llama.cpp has engines/llamacpp/). No other module under
    evalkit/engines/ *names* vLLM: its own module name contains no ``vllm``, and none of its imports
    (function-local ones included) names a module whose dotted path does (``import vllm...``, ``from vllm...``,
    ``from evalkit.engines.vllm... import``). Strings are data, not names: a profile called ``vllm-cuda``, a
    vLLM source file a profile cites."""
    assert names_vllm("vllm.v1.attention") and names_vllm("evalkit.engines.vllm.kernel")
    assert names_vllm("evalkit.engines.vllm_kernel") and not names_vllm("evalkit.engines.llamacpp.runtime")
    names = module_names()
    outside = [n for n in names if n.startswith("evalkit.engines") and not n.startswith("evalkit.engines.vllm")]
    assert "evalkit.engines.profiles" in outside and "evalkit.engines.llamacpp.engine" in outside
    found = []
    for name in outside:
        if name in ENTRY_POINT_STUBS:
            continue
        if names_vllm(name):
            found.append(f"{name}: its name")
        for node in ast.walk(ast.parse(names[name].read_text())):
            imported = []
            if isinstance(node, ast.Import):
                imported = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found += [f"{name} line {node.lineno}: imports {m}" for m in imported if names_vllm(m)]
    assert not found, f"vLLM named outside evalkit/engines/vllm/: {found}"
