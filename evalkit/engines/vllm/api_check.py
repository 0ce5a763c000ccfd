"""Hold what evalkit uses of vLLM (:mod:`evalkit.engines.vllm.api_uses`) against a vLLM source tree, with :mod:`ast`.

:class:`SourceTree` reads a folder holding ``vllm/`` (an installed vLLM, or a wheel's ``vllm/**/*.py``)
without importing anything, and :func:`check` answers, for every :class:`~evalkit.engines.vllm.api_uses.Use`,
whether it is there and, for a call, whether its signature takes the call: the positional count, every
keyword (a ``**kwargs`` that vLLM forwards to another class, as ``LLM.__init__`` forwards to
``EngineArgs``, is held against that class: :data:`KWARGS_TARGETS`) and every required parameter given.

Names are resolved as Python would find them (:mod:`evalkit.engines.vllm.api_tree`). A class without
``__init__`` takes its annotated fields (dataclasses, pydantic and msgspec structs). What resolves to
something outside vLLM (torch, a value computed at run time) is present but not inspectable:
:attr:`Report.unverified`, never a pass on a signature.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.engines.vllm.api_tree import Ref, SourceTree, decorator_name
from evalkit.engines.vllm.api_uses import Use

# functions whose **kwargs vLLM hands on to a class (checked against that class's fields)
KWARGS_TARGETS = {"vllm.entrypoints.llm.LLM.__init__": "vllm.engine.arg_utils.EngineArgs"}


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    checked: int = 0


# -- the check ---------------------------------------------------------------------------------------------
def check(root: str | Path, uses: list[Use], forwarder_params: dict[str, set[str]] | None = None) -> Report:
    """Every use against the vLLM source under ``root`` (see the module docstring). ``forwarder_params``:
    for a ``forward`` use (lm-eval's ``VLLM``), the parameters the forwarder takes itself; the rest of its
    keywords are checked as keywords of ``vllm.LLM``."""
    tree, report = SourceTree(root), Report()
    for use in uses:
        report.checked += 1
        where = f"{use.target} ({use.where})"
        if use.kind == "file":
            if not (tree.root / use.target).is_file():
                report.problems.append(f"{where}: no such file")
            continue
        if use.kind == "forward":
            own = (forwarder_params or {}).get(use.target)
            if own is None:
                report.unverified.append(f"{where}: the forwarder's own parameters are not known here")
                continue
            # the forwarder passes the model and its own arguments itself: only the keywords it hands on are checked
            use = Use("call", "vllm.LLM", tuple(k for k in use.keywords if k not in own), None, use.where)
        ref = tree.resolve(use.target) if use.kind != "method" else _method(tree, use.target)
        if ref is None:
            report.problems.append(f"{where}: not found")
        elif use.kind == "module" and ref.kind != "module":
            report.problems.append(f"{where}: not a module")
        elif use.kind in ("call", "method"):
            problem = _call_problem(tree, ref, use)
            if problem == "unverified":
                report.unverified.append(f"{where}: resolves to {ref.kind} {ref.name}, its signature is not readable")
            elif problem:
                report.problems.append(f"{where}: {problem}")
        elif ref.kind == "external":
            report.unverified.append(f"{where}: outside vLLM ({ref.name})")
    return report


def _method(tree: SourceTree, target: str) -> Ref | None:
    owner, _, name = target.rpartition(".")
    cls = tree.resolve(owner)
    if cls is None or cls.kind != "class":
        return None
    return tree.class_member(cls.module, cls.node, name, "instance")


def _call_problem(tree: SourceTree, ref: Ref, use: Use) -> str | None:
    if ref.kind == "function":
        drop = _bound(ref, use)
        return _signature_problem(tree, ref.node, drop, use, KWARGS_TARGETS.get(ref.name))
    if ref.kind == "class":
        init = tree.init(ref.module, ref.node)
        if init is not None:
            module, fn = init
            forward = KWARGS_TARGETS.get(f"{module}.{_owner(tree, module, fn)}.__init__")
            return _signature_problem(tree, fn, True, use, forward)
        fields = tree.fields(ref.module, ref.node)
        return _fields_problem(fields, use)
    return "unverified"


def _owner(tree: SourceTree, module: str, fn: ast.FunctionDef) -> str:
    for node in ast.walk(tree.tree(module)):
        if isinstance(node, ast.ClassDef) and fn in node.body:
            return node.name
    return "?"


def _bound(ref: Ref, use: Use) -> bool:
    """Whether the call does not pass the function's first parameter itself (self/cls)."""
    if ref.cls is None:
        return False
    decorators = {decorator_name(d) for d in ref.node.decorator_list}
    if "staticmethod" in decorators:
        return False
    if "classmethod" in decorators:
        return True
    return use.kind == "method" or ref.via == "instance"


def _signature_problem(tree: SourceTree, fn: ast.FunctionDef, drop_first: bool, use: Use, forward: str | None):
    a = fn.args
    positional = [*a.posonlyargs, *a.args][1 if drop_first else 0 :]
    n_defaults = len(a.defaults)
    required_pos = [p.arg for p in positional[: len(positional) - n_defaults]]
    named = {p.arg for p in a.args[1 if drop_first and not a.posonlyargs else 0 :]} | {p.arg for p in a.kwonlyargs}
    given = use.positional
    if given is not None and given > len(positional) and a.vararg is None:
        return f"takes {len(positional)} positional arguments, evalkit passes {given}"
    unknown = [k for k in use.keywords if k not in named]
    if unknown and a.kwarg is None:
        return f"has no parameter {', '.join(unknown)} (it takes {', '.join(sorted(named)) or 'none'})"
    if unknown and forward is not None:
        target = tree.resolve(forward)
        fields = {f for f, _ in tree.fields(target.module, target.node)} if target and target.kind == "class" else None
        if fields is None:
            return f"forwards **kwargs to {forward}, which is not found"
        missing = [k for k in unknown if k not in fields]
        if missing:
            return f"has no parameter {', '.join(missing)}, and {forward} (where its **kwargs go) has no such field"
    if given is not None:
        missing = [p for p in required_pos[given:] if p not in use.keywords]
        required_kw = [p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
        missing += [p for p in required_kw if p not in use.keywords]
        if missing:
            return f"requires {', '.join(missing)}, which evalkit does not pass"
    return None


def _fields_problem(fields: list[tuple[str, bool]], use: Use) -> str | None:
    names = [f for f, _ in fields]
    if use.positional is not None and use.positional > len(names):
        return f"takes {len(names)} fields, evalkit passes {use.positional} positionally"
    unknown = [k for k in use.keywords if k not in names]
    if unknown:
        return f"has no field {', '.join(unknown)}"
    start = use.positional or 0
    missing = [f for f, has_default in fields[start:] if not has_default and f not in use.keywords]
    return f"requires {', '.join(missing)}, which evalkit does not pass" if missing else None


def forwarder_params() -> dict[str, set[str]]:
    """The parameters lm-eval's ``VLLM`` model takes itself (read from the installed lm-eval's source;
    empty without lm-eval): its other keywords go to ``vllm.LLM``."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("lm_eval")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(list(spec.submodule_search_locations)[0]) / "models" / "vllm_causallms.py"
    if not path.is_file():
        return {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "VLLM":
            init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
            if init is not None:
                a = init.args
                return {"lm_eval.models.vllm_causallms.VLLM": {p.arg for p in [*a.args, *a.kwonlyargs]}}
    return {}
