"""The backend seam, parsed: a backend never sees an evaluation, and no evaluation asks which backend
it runs on.

The protocol (:mod:`evalkit.evals.protocol`): evaluations emit plain requests (log-probs of given
tokens, decode, greedy generation, lm-eval requests) and consume plain answers; a backend's methods
take those requests, never the evaluation object, and the backend side (every ``*Backend`` class in
the package and the tests' engine, and the emulation's compute in ``evals/emulation/``) imports no
evaluation module. An evaluation decides what to do from its backend's declared
:class:`~evalkit.evals.protocol.Capabilities` only: it never compares a backend's name, tests its
type, or imports a concrete backend.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "evalkit"
EVALUATION_NAMES = ("ev", "evaluation", "eval_")  # what a parameter holding an evaluation is called
CONCRETE_BACKENDS = ("EmulationBackend", "VllmBackend", "LlamaCppBackend")


def package_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts and "_data" not in p.parts)


def backend_classes(tree: ast.Module) -> list[ast.ClassDef]:
    """The protocol's ``Backend`` and the classes of a module that subclass a backend (a base named ``...Backend``)."""
    return [
        c
        for c in ast.walk(tree)
        if isinstance(c, ast.ClassDef)
        and (c.name == "Backend" or any(ast.unparse(b).split(".")[-1].endswith("Backend") for b in c.bases))
    ]


def evaluation_reads(source: str) -> dict[str, set[str]]:
    """method -> what of an evaluation it takes, for every method of a backend class: a parameter
    named like an evaluation, or an annotation naming one (``*Eval``, ``Evaluation``)."""
    out: dict[str, set[str]] = {}
    for cls in backend_classes(ast.parse(source)):
        for node in cls.body:
            if not isinstance(node, ast.FunctionDef):
                continue
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            for a in args:
                note = ast.unparse(a.annotation) if a.annotation is not None else ""
                if a.arg in EVALUATION_NAMES or note.endswith(("Eval", "Evaluation")):
                    out.setdefault(node.name, set()).add(a.arg)
    return out


def evaluation_imports(source: str) -> set[str]:
    """The evaluation modules a module imports (``evalkit.evals.<eval>.evaluation``, ``evalkit.evals.base``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        found |= {n for n in names if n.startswith("evalkit.evals.") and n.endswith((".evaluation", ".base"))}
        found |= {n for n in names if n.startswith("evalkit.engines.vllm.serving_eval")}
    return found


def backend_branches(source: str) -> set[str]:
    """Where code asks which backend it has: a comparison involving a backend's name, a type test or
    ``type()`` of a backend, or a concrete backend named at all (by class, or by importing its module;
    ``evalkit.evals.backend``, the seam, is not one)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        text = ast.unparse(node) if isinstance(node, (ast.Compare, ast.Call, ast.Name, ast.Attribute)) else ""
        if isinstance(node, ast.Compare) and "backend" in text.lower() and ".name" in text:
            found.add(text)
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("isinstance", "type", "issubclass"):
            if "backend" in text.lower():
                found.add(text)
        if isinstance(node, ast.Name) and node.id in CONCRETE_BACKENDS:
            found.add(node.id)
        if isinstance(node, ast.ImportFrom) and node.module and node.module != "evalkit.evals.backend":
            if node.module.startswith("evalkit.evals.emulation") or node.module.endswith(("backend", "_backend")):
                found.add(f"from {node.module} import ...")  # a concrete backend's module
    return found


def backend_side_modules() -> list[Path]:
    """Every module defining a backend class, the emulation's compute, and the tests' engine."""
    out = [p for p in package_modules() if backend_classes(ast.parse(p.read_text()))]
    out += sorted((PACKAGE / "evals" / "emulation").glob("*.py"))
    return sorted(set(out + [ROOT / "tests" / "toy_engine.py"]))


def evaluation_modules() -> list[Path]:
    """The evaluations: every ``evals/<eval>/evaluation.py``, the base class, and the serving eval."""
    return sorted(PACKAGE.glob("evals/*/evaluation.py")) + [
        PACKAGE / "evals" / "base.py",
        PACKAGE / "engines" / "vllm" / "serving_eval.py",
    ]


def test_the_backends_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in backend_side_modules()}
    assert {
        "evalkit/evals/emulation/backend.py",
        "evalkit/evals/emulation/perplexity.py",
        "evalkit/evals/emulation/decode.py",
        "evalkit/engines/vllm/backend.py",
        "evalkit/engines/llamacpp/backend.py",
        "evalkit/evals/protocol.py",
        "tests/toy_engine.py",
    } <= names
    assert len(evaluation_modules()) >= 5 and all(p.is_file() for p in evaluation_modules())


@pytest.mark.parametrize("path", backend_side_modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_backend_receives_an_evaluation(path: Path):
    source = path.read_text()
    assert evaluation_reads(source) == {}, (
        f"{path.name}: a backend method takes an evaluation; take a plain request (evalkit.evals.protocol)"
    )
    assert evaluation_imports(source) == set(), f"{path.name}: the backend side imports an evaluation module"


@pytest.mark.parametrize("path", evaluation_modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_evaluation_names_a_backend(path: Path):
    assert backend_branches(path.read_text()) == set(), (
        f"{path.name} asks which backend it runs on: read its capabilities (evalkit.evals.protocol.Capabilities)"
    )


def test_the_parsers_see_a_leak():
    """The parsers find what they look for (so an empty result means none, not a blind parser)."""
    leak = "class B(Backend):\n    def prepare(self, ev, lm):\n        ev.inputs = ev.p\n"
    assert evaluation_reads(leak) == {"prepare": {"ev"}}
    typed = "class B(EmulationBackend):\n    def score(self, x: PerplexityEval, lm):\n        return x.plan\n"
    assert evaluation_reads(typed) == {"score": {"x"}}
    clean = "class B(Backend):\n    def prepare(self, request: LogprobsRequest, lm):\n        return request.plan\n"
    assert evaluation_reads(clean) == {}
    assert evaluation_reads("class Helper:\n    def f(self, ev):\n        return ev.p\n") == {}  # not a backend
    assert evaluation_imports("from evalkit.evals.decode.evaluation import DecodeEval\n") == {
        "evalkit.evals.decode.evaluation"
    }
    source = (
        "from evalkit.engines.vllm.backend import X\n"
        "def f(self, b):\n"
        "    if backend_of(self).name == 'vllm':\n"
        "        return isinstance(b, VllmBackend)\n"
    )
    assert backend_branches(source) == {
        "backend_of(self).name == 'vllm'",
        "isinstance(b, VllmBackend)",
        "VllmBackend",
        "from evalkit.engines.vllm.backend import ...",
    }
    assert backend_branches("def f(self):\n    return backend_of(self).capabilities.float_noise\n") == set()
    assert backend_branches("def f(b):\n    raise E(f'backend {b.name} cannot')\n") == set()  # a message is no branch
