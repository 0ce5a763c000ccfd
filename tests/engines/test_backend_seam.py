"""The backend seam, parsed: what a backend reads of an evaluation, and where an evaluation asks which
backend it runs on.

The goal is a request/response protocol: evaluations emit plain requests (log-probs of given tokens,
teacher-forced decode, greedy generation, lm-eval requests) and consume plain responses; a backend never
receives the evaluation object, and no evaluation branches on a backend's identity. That protocol is not
built yet. Until it is, this test pins the leaks as they are, so that none is added: a new ``ev.X`` in a
backend, or a new test of a backend's name or type in an evaluation, fails here. When the protocol
removes one, the test fails too, asking to drop it from the list; both lists end empty.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "evalkit"

# backend module -> {method: attributes of the evaluation ``ev`` it reads or writes}
KNOWN_READS = {
    "engines/vllm_backend.py": {
        "prepare": {"window_inputs"},
        "prepare_decode": {"inputs", "p"},
        "decode_positions": {"inputs", "p"},
        "lmeval_model": {"params"},
    },
    "engines/llamacpp/backend.py": {"prepare": {"window_inputs"}},
    "evals/backend.py": {  # the emulation backend forwards to the evaluations' own compute
        "prepare": {"_prepare_baseline"},
        "score": {"_score_emulation"},
        "prepare_decode": {"_prepare_emulation"},
        "decode_positions": {"_positions_emulation"},
        "prepare_lmeval": {"_hflm", "params"},
        "lmeval_model": {"_hflm"},
    },
}
# evaluation module -> the expressions in it that ask which backend runs it
KNOWN_BRANCHES = {
    "evals/lmeval/evaluation.py": {"backend.name"},
    "evals/perplexity/evaluation.py": {"backend_of(self).name", "isinstance(backend_of(self), EmulationBackend)"},
    "evals/retrieval/evaluation.py": {"backend_of(self).name"},
}
BACKEND_MODULES = ("engines/vllm_backend.py", "engines/llamacpp/backend.py", "evals/backend.py")


def evaluation_reads(source: str) -> dict[str, set[str]]:
    """method -> the attributes of its ``ev`` parameter it touches, for every backend method (a function
    in a class) taking ``ev``; module-level helpers such as ``use_backend``, which attaches a backend to
    an evaluation, are not backends."""
    tree = ast.parse(source)
    out: dict[str, set[str]] = {}
    methods = [f for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body]
    for node in methods:
        if isinstance(node, ast.FunctionDef) and "ev" in [a.arg for a in node.args.args]:
            attrs = {
                n.attr
                for n in ast.walk(node)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "ev"
            }
            if attrs:
                out.setdefault(node.name, set()).update(attrs)
    return out


def backend_branches(source: str) -> set[str]:
    """Expressions that read a backend's name or test its type."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "name" and "backend" in ast.unparse(node.value):
            found.add(ast.unparse(node))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "isinstance":
            text = ast.unparse(node)
            if "Backend" in text:
                found.add(text)
    return found


def test_no_backend_reads_more_of_an_evaluation_than_it_did():
    found = {rel: evaluation_reads((PACKAGE / rel).read_text()) for rel in BACKEND_MODULES}
    found = {rel: reads for rel, reads in found.items() if reads}
    assert found == KNOWN_READS, (
        "a backend reads an evaluation's attributes: send a plain request instead (or, where the protocol "
        "removed a read, drop it from KNOWN_READS)"
    )


def test_no_evaluation_asks_for_more_of_its_backend_than_it_did():
    found = {}
    for path in sorted((PACKAGE / "evals").rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel == "evals/backend.py":  # the protocol module itself
            continue
        branches = backend_branches(path.read_text())
        if branches:
            found[rel] = branches
    assert found == KNOWN_BRANCHES, (
        "an evaluation branches on its backend's name or type: ask its capabilities instead (or, where the "
        "protocol removed a branch, drop it from KNOWN_BRANCHES)"
    )


def test_the_parsers_see_a_leak():
    """The two parsers find what they look for (so an empty result means none, not a blind parser)."""
    assert evaluation_reads("class B:\n    def prepare(self, ev, lm):\n        ev.inputs = ev.p\n") == {
        "prepare": {"inputs", "p"}
    }
    assert evaluation_reads("class B:\n    def prepare(self, request, lm):\n        return request.tokens\n") == {}
    source = "def f(self, b):\n    if backend_of(self).name == 'vllm':\n        return isinstance(b, VllmBackend)\n"
    assert backend_branches(source) == {"backend_of(self).name", "isinstance(b, VllmBackend)"}
    assert backend_branches("def f(self):\n    return self.capabilities.kl\n") == set()
