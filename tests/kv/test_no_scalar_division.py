"""No value evalkit/kv stores comes from dividing a tensor by a Python number (issue 39, item 4).

torch on CUDA computes ``tensor / c``, for a Python number ``c``, as ``tensor * fl(1/c)``; on CPU it
divides. The two differ in the last bit for about half of all values, which is how the per-token-head
scales and INT4's bytes came out differently on an H200 than on the CPU. So evalkit/kv divides a
tensor only by a tensor on its own device (``evalkit.kv.device_exact.divide``) or multiplies by a
float32 reciprocal (``times_reciprocal``).

The check reads the source (``ast``): a division whose divisor is a Python number and whose dividend
is not. What counts as a Python number: a numeric literal; a module constant bound to one; a local
bound to one or a parameter annotated ``int``/``float``; a call of ``float``/``int``/``len``/``math.*``
or of a function annotated ``-> int``/``-> float``; an attribute that evalkit/kv's classes annotate
``int``/``float`` (``fmt.max``); and arithmetic of those. ``1.0 / b`` between two Python numbers is
plain Python arithmetic (float64, the same everywhere) and passes. The runtime check of the same rule
on every ``vllm:`` dtype is tests/kv/test_same_bytes.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

KV = Path(__file__).resolve().parents[2] / "evalkit" / "kv"
NUMBER_CALLS = {"float", "int", "len", "abs", "round"}
NUMBER_TYPES = {"int", "float"}

# Divisions by a Python number whose result is the same bits on every device, or never stored, each with why.
ALLOWED: dict[str, dict[str, str]] = {
    "codecs/llamacpp/ggml_blocks.py": {
        "_signed_max(xb) / nmax": "nmax is -8 (q4_0) or -16 (q5_0): a power of two, so x / c and x * fl(1/c) are equal",
        "(1 - 2 * (pop % 2)).double() / math.sqrt(n)": "hadamard_matrix: a float64 reference matrix for tests, never "
        "stored",
    },
}

# Stored values that still come from a division by a Python number (none left: the dynamic FP8/INT scales
# of quantize.py, llama.cpp's block scales and the NVFP4/SGLang scales divide by a device tensor too).
OUTSTANDING: dict[str, dict[str, str]] = {}


def annotated_numbers(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(functions annotated to return a number or a tuple of numbers, class attributes and properties
    annotated ``int``/``float``)."""
    functions, fields = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_number_type(node.returns):
            functions.add(node.name)
            if any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list):
                fields.add(node.name)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    if _is_number_type(item.annotation):
                        fields.add(item.target.id)
    return functions, fields


def _is_number_type(annotation) -> bool:
    """``int``, ``float``, or ``tuple[int | float, ...]``."""
    if isinstance(annotation, ast.Name):
        return annotation.id in NUMBER_TYPES
    if isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name):
        inner = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        return annotation.value.id == "tuple" and all(
            _is_number_type(e) or (isinstance(e, ast.Constant) and e.value is Ellipsis) for e in inner
        )
    return False


class Numbers:
    """Decides whether an expression is a Python number (or a container of them: a literal tuple, list or
    dict of numbers, a comprehension of numbers, an item of one), given the names known to be either."""

    def __init__(self, functions: set[str], fields: set[str]):
        self.functions, self.fields = functions, fields

    def __call__(self, node, names: set[str]) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, (int, float))  # bools too: flags in a tuple of numbers
        if isinstance(node, ast.Name):
            return node.id in names
        if isinstance(node, ast.Attribute):
            return node.attr in self.fields or (isinstance(node.value, ast.Name) and node.value.id == "math")
        if isinstance(node, ast.UnaryOp):
            return self(node.operand, names)
        if isinstance(node, ast.BinOp):
            return self(node.left, names) and self(node.right, names)
        if isinstance(node, ast.IfExp):
            return self(node.body, names) and self(node.orelse, names)
        if isinstance(node, (ast.Tuple, ast.List)):
            return all(self(e, names) for e in node.elts)
        if isinstance(node, ast.Dict):
            return all(self(v, names) for v in node.values)
        if isinstance(node, ast.Subscript):
            return self(node.value, names)
        if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
            return self(node.elt, names | comprehension_numbers(node, self, names))
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name):
                return f.id in NUMBER_CALLS or f.id in self.functions
            if isinstance(f, ast.Attribute):
                return (isinstance(f.value, ast.Name) and f.value.id == "math") or f.attr in self.functions
        return False


def comprehension_numbers(node, numbers: Numbers, names: set[str]) -> set[str]:
    """The loop variables of a comprehension that run over ``range(...)`` or over numbers."""
    out = set()
    for gen in node.generators:
        over_range = isinstance(gen.iter, ast.Call) and isinstance(gen.iter.func, ast.Name)
        over_range = over_range and gen.iter.func.id == "range"
        if (over_range or numbers(gen.iter, names | out)) and isinstance(gen.target, ast.Name):
            out.add(gen.target.id)
    return out


def _bound(targets, value, numbers: Numbers, names: set[str]) -> set[str]:
    if not numbers(value, names):
        return set()
    out = set()
    for t in targets:
        for leaf in t.elts if isinstance(t, ast.Tuple) else [t]:  # a, b = NUMBERS[k] unpacks numbers
            if isinstance(leaf, ast.Name):
                out.add(leaf.id)
    return out


def module_numbers(tree: ast.Module, numbers: Numbers) -> set[str]:
    names: set[str] = set()
    for _ in range(3):  # constants defined from constants
        for node in tree.body:
            if isinstance(node, ast.Assign):
                names |= _bound(node.targets, node.value, numbers, names)
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                names |= _bound([node.target], node.value, numbers, names)
    return names


def scalar_divisions(path: Path, functions: set[str], fields: set[str]) -> list[str]:
    """The source text of every ``tensor / number`` in ``path`` (see the module docstring)."""
    source = path.read_text()
    tree = ast.parse(source)
    numbers = Numbers(functions | annotated_numbers(tree)[0], fields)
    constants = module_numbers(tree, numbers)
    found = []

    def visit(node, names: set[str]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            names = set(names)
            for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
                if getattr(a, "annotation", None) is not None and _is_number_type(a.annotation):
                    names.add(a.arg)
            body = node.body if isinstance(node.body, list) else [node.body]
            for _ in range(2):  # locals bound from locals
                for sub in (n for stmt in body for n in ast.walk(stmt)):
                    if isinstance(sub, ast.Assign):
                        names |= _bound(sub.targets, sub.value, numbers, names)
                    elif isinstance(sub, ast.AnnAssign) and sub.value is not None:
                        names |= _bound([sub.target], sub.value, numbers, names)
                    elif isinstance(sub, ast.For) and isinstance(sub.target, ast.Name):
                        names |= comprehension_numbers(ast.ListComp(ast.Name("_"), [sub]), numbers, names)
        if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp, ast.DictComp)):
            names = names | comprehension_numbers(node, numbers, names)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            if numbers(node.right, names) and not numbers(node.left, names):
                found.append(ast.get_source_segment(source, node))
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Div):
            if numbers(node.value, names) and not numbers(node.target, names):
                found.append(ast.get_source_segment(source, node))
        for child in ast.iter_child_nodes(node):
            visit(child, names)

    visit(tree, constants)
    return found


def kv_annotations() -> tuple[set[str], set[str]]:
    functions, fields = set(), set()
    for path in KV.rglob("*.py"):
        f, a = annotated_numbers(ast.parse(path.read_text()))
        functions |= f
        fields |= a
    return functions, fields


MODULES = sorted(p.relative_to(KV).as_posix() for p in KV.rglob("*.py"))  # the codec families' modules too


@pytest.mark.parametrize("module", MODULES)
def test_no_stored_value_comes_from_a_division_by_a_python_number(module):
    found = set(scalar_divisions(KV / module, *kv_annotations()))
    allowed = set(ALLOWED.get(module, {})) | set(OUTSTANDING.get(module, {}))
    assert found - allowed == set(), f"{module}: divide by a tensor on the data's device (device_exact.divide)"
    assert set(OUTSTANDING.get(module, {})) <= found, f"{module}: fixed: drop it from OUTSTANDING"


def test_the_scan_finds_what_it_forbids_and_passes_what_it_allows(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import math\nQ = 127.0\nR = Q * 2\n\n"
        "def qmax(fmt) -> float:\n    return 1.0\n\n"
        "def f(x, fmt, n: int):\n    top = float(n)\n"
        "    a = x / Q\n    b = x / qmax(fmt)\n    c = x / fmt.max\n    d = x / top\n    e = x / math.sqrt(n)\n"
        "    f = x / R\n    g = x / 2\n    x /= 3.0\n"
        "    ok = 1.0 / Q + n / top + x / x.sum() + x / fmt.scale\n    return (x / n, ok)\n"
    )
    found = scalar_divisions(probe, set(), {"max"})
    assert found == [
        "x / Q", "x / qmax(fmt)", "x / fmt.max", "x / top", "x / math.sqrt(n)", "x / R", "x / 2", "x /= 3.0", "x / n"
    ]  # fmt: skip
