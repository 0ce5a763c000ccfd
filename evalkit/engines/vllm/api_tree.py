"""A vLLM source tree read with :mod:`ast`, nothing imported: names resolved as Python would find them.

:class:`SourceTree` takes a folder holding ``vllm/`` (an installed vLLM, or a wheel's ``vllm/**/*.py``) and
resolves dotted names to a :class:`Ref`: module files and packages, ``from ... import`` re-exports
(relative ones too), aliases (``LLMEngine = V1LLMEngine``), the lazy ``MODULE_ATTRS`` table of
``vllm/__init__.py``, module attributes declared by annotation or by calling a class
(``current_platform: Platform``, ``ModelRegistry = _ModelRegistry(...)``: an instance of that class),
class members through the bases vLLM defines, attributes set as ``self.x = ...`` in a method (or
``layer.x = ...`` / ``register_buffer("x", ...)`` in the class's module), a class's ``__init__`` (its own or
inherited) and its annotated fields (dataclasses, pydantic and msgspec structs). What resolves outside
vLLM (torch, msgspec) is ``external``; what is present but not inspectable is ``value``. The checks
themselves are :mod:`evalkit.engines.vllm.api_check`'s.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Ref:
    """What a dotted name resolves to: ``kind`` is module, class, function, instance (of ``cls``), value
    (present, not inspectable) or external (outside vLLM); ``via`` how a function was reached (class or
    instance: whether its first parameter is bound)."""

    kind: str
    module: str = ""
    node: object = None
    cls: object = None
    via: str = ""
    name: str = ""


class SourceTree:
    """A folder holding ``vllm/``: module files parsed on demand (nothing is imported)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._trees: dict[str, ast.Module | None] = {}

    def module_file(self, dotted: str) -> Path | None:
        base = self.root / dotted.replace(".", "/")
        for p in (base / "__init__.py", base.with_suffix(".py")):
            if p.is_file():
                return p
        return None

    def tree(self, dotted: str) -> ast.Module | None:
        if dotted not in self._trees:
            path = self.module_file(dotted)
            self._trees[dotted] = ast.parse(path.read_text(), filename=str(path)) if path else None
        return self._trees[dotted]

    def is_package(self, dotted: str) -> bool:
        path = self.module_file(dotted)
        return path is not None and path.name == "__init__.py"

    # -- names in a module -----------------------------------------------------------------------------
    def resolve(self, dotted: str, depth: int = 0) -> Ref | None:
        if depth > 20:
            return Ref("value", name=dotted)
        if dotted.split(".")[0] != "vllm":
            return Ref("external", name=dotted)
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):
            module = ".".join(parts[:i])
            if self.module_file(module) is not None:
                ref = Ref("module", module, name=module)
                for part in parts[i:]:
                    ref = self.member(ref, part, depth + 1)
                    if ref is None:
                        return None
                return ref
        return None

    def member(self, ref: Ref, name: str, depth: int = 0) -> Ref | None:
        if ref.kind == "module":
            return self.lookup(ref.module, name, depth)
        if ref.kind in ("class", "instance"):
            return self.class_member(ref.module, ref.node, name, ref.kind, depth)
        return Ref("value" if ref.kind != "external" else "external", name=f"{ref.name}.{name}")

    def lookup(self, module: str, name: str, depth: int = 0) -> Ref | None:
        tree = self.tree(module)
        for node in _top_level(tree.body):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                return Ref(kind, module, node, name=f"{module}.{name}")
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    if (a.asname or a.name) == name:
                        source = self._absolute(module, node)
                        return self.resolve(f"{source}.{a.name}", depth + 1)
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname == name:
                        return self.resolve(a.name, depth + 1)
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in _targets(node):
                return self._assigned(module, node, name, depth)
        submodule = f"{module}.{name}"
        if self.module_file(submodule) is not None:
            return Ref("module", submodule, name=submodule)
        lazy = _lazy_table(tree).get(name)
        if lazy is not None:
            return self.resolve(lazy, depth + 1)
        return None

    def _assigned(self, module: str, node, name: str, depth: int) -> Ref:
        value = node.value
        if isinstance(value, (ast.Name, ast.Attribute)):
            target = self._expr(module, value, depth)
            if target is not None:
                return target
        if isinstance(value, ast.Call) and isinstance(value.func, (ast.Name, ast.Attribute)):
            made = self._expr(module, value.func, depth)
            if made is not None and made.kind == "class":
                return Ref("instance", made.module, made.node, name=f"{module}.{name}")
        if isinstance(node, ast.AnnAssign) and isinstance(node.annotation, (ast.Name, ast.Attribute)):
            made = self._expr(module, node.annotation, depth)
            if made is not None and made.kind == "class":
                return Ref("instance", made.module, made.node, name=f"{module}.{name}")
        return Ref("value", module, name=f"{module}.{name}")

    def _expr(self, module: str, node, depth: int) -> Ref | None:
        """A Name or Attribute chain read in ``module``'s namespace."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Subscript):  # Generic[T], Base[...]
            return self._expr(module, node.value, depth)
        if not isinstance(node, ast.Name):
            return None
        ref = self.lookup(module, node.id, depth + 1)
        for part in reversed(parts):
            if ref is None:
                return None
            ref = self.member(ref, part, depth + 1)
        return ref

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module
        package = module if self.is_package(module) else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        return f"{package}.{node.module}" if node.module else package

    # -- class members -----------------------------------------------------------------------------------
    def class_member(self, module: str, cls: ast.ClassDef, name: str, via: str, depth: int = 0) -> Ref | None:
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                if any(decorator_name(d) in ("property", "cached_property") for d in node.decorator_list):
                    return Ref("value", module, name=f"{cls.name}.{name}")
                return Ref("function", module, node, cls, via, name=f"{module}.{cls.name}.{name}")
            if isinstance(node, ast.ClassDef) and node.name == name:
                return Ref("class", module, node, name=f"{module}.{cls.name}.{name}")
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in _targets(node):
                return Ref("value", module, name=f"{cls.name}.{name}")
        for node in ast.walk(cls):
            if _sets_attribute(node, name, ("self", "cls")):
                return Ref("value", module, name=f"{cls.name}.{name}")
        for base in cls.bases:
            found = self._expr(module, base, depth)
            if found is not None and found.kind == "class" and depth < 20:
                ref = self.class_member(found.module, found.node, name, via, depth + 1)
                if ref is not None:
                    return ref
        for node in ast.walk(self.tree(module)):  # set from outside the class, in its module (a helper's layer.x = ...)
            if _sets_attribute(node, name, None):
                return Ref("value", module, name=f"{cls.name}.{name}")
        return None

    def fields(self, module: str, cls: ast.ClassDef, depth: int = 0) -> list[tuple[str, bool]]:
        """(name, has default) of a class's annotated fields, bases first."""
        out: list[tuple[str, bool]] = []
        for base in cls.bases:
            found = self._expr(module, base, depth)
            if found is not None and found.kind == "class" and depth < 20:
                out += self.fields(found.module, found.node, depth + 1)
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if "ClassVar" in ast.unparse(node.annotation):
                    continue
                out = [f for f in out if f[0] != node.target.id] + [(node.target.id, node.value is not None)]
        return out

    def init(self, module: str, cls: ast.ClassDef, depth: int = 0) -> tuple[str, ast.FunctionDef] | None:
        """(module, ``__init__``) of a class, inherited from a vLLM base if it defines none."""
        for node in cls.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                return module, node
        for base in cls.bases:
            found = self._expr(module, base, depth)
            if found is not None and found.kind == "class" and depth < 20:
                got = self.init(found.module, found.node, depth + 1)
                if got is not None:
                    return got
        return None


# -- reading the syntax -------------------------------------------------------------------------------------------------
def _top_level(body):
    """Module-level statements, descending into if/try/with blocks (TYPE_CHECKING imports), not into defs."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, block, None) or []
                for item in inner:
                    yield from _top_level(item.body if isinstance(item, ast.ExceptHandler) else [item])


def _targets(node) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    out = set()
    for t in targets:
        for n in ast.walk(t):
            if isinstance(n, ast.Name):
                out.add(n.id)
    return out


def _lazy_table(tree: ast.Module) -> dict[str, str]:
    """``MODULE_ATTRS = {"LLM": ".entrypoints.llm:LLM"}`` (vllm/__init__.py's lazy names) -> absolute dotted."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and _targets(node) == {"MODULE_ATTRS"} and isinstance(node.value, ast.Dict):
            out = {}
            for k, v in zip(node.value.keys, node.value.values):
                if isinstance(k, ast.Constant) and isinstance(v, ast.Constant) and ":" in str(v.value):
                    mod, _, attr = str(v.value).partition(":")
                    out[str(k.value)] = f"vllm{mod}.{attr}" if mod.startswith(".") else f"{mod}.{attr}"
            return out
    return {}


def decorator_name(node) -> str:
    while isinstance(node, ast.Call):
        node = node.func
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _sets_attribute(node, name: str, owners: tuple[str, ...] | None) -> bool:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    for t in targets:
        if isinstance(t, ast.Attribute) and t.attr == name:
            if owners is None or (isinstance(t.value, ast.Name) and t.value.id in owners):
                return True
    if isinstance(node, ast.Call) and node.args:  # setattr(obj, "x", v); layer.register_buffer("x", t)
        what = decorator_name(node.func)
        key = node.args[1] if what == "setattr" and len(node.args) > 1 else node.args[0]
        if what in ("setattr", "register_buffer", "register_parameter"):
            return isinstance(key, ast.Constant) and key.value == name
    return False
