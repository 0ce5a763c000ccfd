"""The identity of the code that decides the numbers: part of every run id.

A run id must change when the numbers a run would give can change, and only then. The identity is
a SHA-256 over three things:

* :data:`NUMERICS_VERSION`, an integer bumped by hand in the commit that means to change numbers
  (the fingerprint test, ``tests/sweep/test_numerics_fingerprint.py``, fails until it is bumped when
  a fixed computation's output changes), so a change is declared, not only detected;
* the **number-deciding modules** of the ``evalkit`` package, each as its *normalised* source
  (:func:`normalised_source`): parsed with :mod:`ast`, docstrings and other bare string statements
  dropped, the messages of ``raise`` statements emptied, evalkit-internal import paths reduced to
  the names they import, then ``ast.unparse``: comments, formatting, a reworded error and a moved
  module leave it unchanged; any change to the code itself changes it. Modules enter by their
  normalised text only, not by file path (a sorted multiset of digests), so a pure move, a rename or
  a split of the docs keeps every run valid;
* the **data files** that decide numbers, by their name inside their data folder (the name a grid,
  a scheme or a task refers to them by) and their bytes: the shipped ``tasks/`` (lm-eval YAMLs and
  their ``utils.py``, normalised like a module, retrieval task YAMLs), the scale tables of
  ``calibration/`` (``*.safetensors``) and the frozen texts ``evalkit/data/texts/*.json`` (the
  embedded corpus and the calibration text, :mod:`evalkit.data.frozen`): the checkout's folders or
  the installed package's copies, so a checkout and a wheel of the same source hash the same.

Which modules decide numbers. Every ``.py`` file under ``evalkit/`` counts (a new module counts by
default), except those in :data:`NOT_NUMERICS`, which can only read, print or size results, never
change a value a run stores:

* ``report/`` and ``cli/``: the report reads stores; the command line parses arguments and hands
  them to the sweep, the evaluations and the engines, which are hashed;
* ``planning/``: capacity plans and the per-layer sensitivity recommendation, printed by their own
  commands and never written into a sweep's store;
* the dry-run sizing (``sweep/estimate.py``, ``sweep/throughput.py``, ``sweep/workload.py``,
  ``evals/sizing.py``, ``evals/*/workload.py``, ``models/facts.py``, ``models/presets.py``): what
  ``sweep --dry-run`` prices before anything runs;
* what the report shows of an evaluation (``evals/*/report.py``) and its figures
  (``evals/*/plots.py``);
* the commands' defaults and checks that engine hooks share with the command line:
  ``runtime/folders.py`` (whether an output folder can be written) and ``engines/vllm/defaults.py``
  (which schemes ``conformance --engine vllm`` holds against vLLM when ``--schemes`` is not given; the
  schemes a conformance run measured are in its report);
* ``data/freeze.py`` (the maintainer's tool that wrote the frozen texts, which are hashed as data),
  this module itself, and the package's ``__init__.py`` and ``__main__.py`` (lazy names, ``-m``).

Hashed, so: ``kv/`` (formats, rounding, quantize/dequantize, scale tables), ``integration/`` (the
storage cache and the hooks that install it), ``evals/`` (the evaluations, statistics and
intervals, float noise, output heads), ``models/`` (loading, dtypes, architecture facts),
``data/`` (corpus loading and tokenization, resource lookup), ``scales/``, ``engines/`` (the vLLM
backends and engine profiles), ``runtime/`` (the BLAS mode), ``sweep/`` (grids, run parameters,
execution, the store), ``errors.py`` and ``units.py``.

Not covered here: the grids (their settings are the run spec itself); scale files outside
``calibration/``, the model weights and local corpora, which enter each run id by content instead
(:mod:`evalkit.sweep.run_inputs`, :func:`evalkit.data.corpus_check.input_hashes`). Library versions, the Python version and a real engine's package
and version enter the run id beside the identity (:func:`evalkit.sweep.grid.versions`).

The git commit (and whether the tree differs from it) is recorded next to the identity in each
run's info as provenance, for people: it does not enter the run id, since a commit changes with
every edit anywhere in the repository, including the commit that adds a results store. Both are
computed once per process (parsing the package's source takes a fraction of a second).
"""

from __future__ import annotations

import ast
import hashlib
import re
import subprocess
from fnmatch import fnmatch
from functools import lru_cache
from pathlib import Path

from evalkit.errors import EvalkitError

NUMERICS_VERSION = 2  # bump by hand when a commit means to change numbers (and re-pin the fingerprint test)

PACKAGE = Path(__file__).resolve().parents[1]  # .../evalkit
NOT_NUMERICS = (  # package-relative patterns of modules that never change a stored value (module docstring)
    "report/*",
    "cli/*",
    "planning/*",
    "sweep/estimate.py",
    "sweep/throughput.py",
    "sweep/workload.py",
    "sweep/code_identity.py",
    "evals/sizing.py",
    "evals/*/workload.py",
    "evals/*/report.py",
    "evals/*/plots.py",
    "models/facts.py",
    "models/presets.py",
    "data/freeze.py",
    "runtime/folders.py",
    "engines/vllm/defaults.py",
    "__init__.py",
    "__main__.py",
    "_data/*",  # a wheel's copies of the data folders: hashed as data
)
DATA = {"tasks": (".yaml", ".yml", ".py", ".json", ".txt", ".jinja"), "calibration": (".safetensors",)}
PACKAGE_DATA = {"texts": ("data/texts", (".json",))}  # data folders inside the package: the frozen texts


def data_dir(kind: str) -> Path | None:
    """A shipped data folder (``tasks``, ``calibration``): the checkout's, or the installed copy."""
    try:
        from evalkit.data.resources import resource_dir
    except ImportError:  # a tree without evalkit.data.resources: the folders sit beside the package
        folder = PACKAGE.parent / kind
        return folder if (PACKAGE.parent / "pyproject.toml").is_file() and folder.is_dir() else None
    try:
        return resource_dir(kind)
    except EvalkitError:  # missing from a broken install: runs fail anyway; the code still hashes
        return None


def is_numerics(rel: str) -> bool:
    """Whether the package module at ``rel`` (relative to ``evalkit/``, e.g. ``kv/quantize.py``) is hashed."""
    return rel.endswith(".py") and "__pycache__" not in rel and not any(fnmatch(rel, p) for p in NOT_NUMERICS)


def numerics_modules() -> list[Path]:
    """The number-deciding modules of the package, sorted (see the module docstring)."""
    return sorted(f for f in PACKAGE.rglob("*.py") if is_numerics(f.relative_to(PACKAGE).as_posix()))


def data_files() -> list[tuple[str, Path]]:
    """(name in the hash, file) of the number-deciding data files: ``tasks/...``, ``calibration/...``,
    ``texts/...``, each named relative to its own folder."""
    roots = [(kind, data_dir(kind), suffixes) for kind, suffixes in DATA.items()]
    roots += [(kind, PACKAGE / folder, suffixes) for kind, (folder, suffixes) in PACKAGE_DATA.items()]
    files = []
    for kind, root, suffixes in roots:
        for f in root.rglob("*") if root is not None and root.is_dir() else ():
            rel = f.relative_to(root).as_posix()
            if f.suffix in suffixes and "__pycache__" not in rel and f.is_file():
                files.append((f"{kind}/{rel}", f))
    return sorted(files)


_MODULE_REF = re.compile(r"evalkit(\.\w+)+(:[\w.]+)?")  # "evalkit.evals.decode.report:engine_frame" (registries)


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


class _EmptyText(ast.NodeTransformer):
    """Every string in an exception's construction becomes ``""``: a message never decides a number."""

    def visit_Constant(self, node: ast.Constant):
        return ast.Constant("") if isinstance(node.value, str) else node

    def visit_JoinedStr(self, node: ast.JoinedStr):
        return ast.Constant("")


class _Normalise(ast.NodeTransformer):
    """Bare strings (docstrings) out, raise messages emptied, evalkit module paths reduced to names."""

    def generic_visit(self, node):
        super().generic_visit(node)
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                kept = [s for s in block if not (isinstance(s, ast.Expr) and _is_text(s.value))]
                setattr(node, field, kept or [ast.Pass()])
        return node

    def visit_Raise(self, node: ast.Raise):
        return _EmptyText().visit(node)

    def visit_Constant(self, node: ast.Constant):
        if isinstance(node.value, str) and _MODULE_REF.fullmatch(node.value):
            return ast.Constant("evalkit" + (node.value[node.value.index(":") :] if ":" in node.value else ""))
        return node

    def visit_ImportFrom(self, node: ast.ImportFrom):
        if node.level or (node.module or "").split(".")[0] == "evalkit":
            return ast.ImportFrom(module="evalkit", names=node.names, level=0)
        return node

    def visit_Import(self, node: ast.Import):
        names = [ast.alias("evalkit", a.asname) if a.name.split(".")[0] == "evalkit" else a for a in node.names]
        return ast.Import(names=names)


def normalised_tree(source: str, name: str = "<module>") -> ast.Module:
    """The syntax tree of a module without what cannot change a number (see the module docstring)."""
    try:
        tree = ast.parse(source, filename=name)
    except SyntaxError as exc:
        raise EvalkitError(f"{name} does not parse ({exc.msg}, line {exc.lineno}): fix it before running") from None
    return ast.fix_missing_locations(_Normalise().visit(tree))


def normalised_source(source: str, name: str = "<module>") -> str:
    """:func:`normalised_tree` as Python text (``ast.unparse``), to read what the identity sees."""
    return ast.unparse(normalised_tree(source, name))


def _canonical(node) -> str:
    """A tree as text, the same on every Python: node types and their non-empty fields (fields a later
    Python added, such as ``type_params``, are empty in code that does not use them), no positions.
    (``ast.unparse`` quotes f-strings differently on 3.12, ``ast.dump`` shows empty fields by version.)"""
    if isinstance(node, ast.AST):
        fields = ((f, getattr(node, f, None)) for f in node._fields)
        return (
            type(node).__name__ + "(" + ",".join(f"{f}={_canonical(v)}" for f, v in fields if v not in (None, [])) + ")"
        )
    if isinstance(node, list):
        return "[" + ",".join(_canonical(v) for v in node) + "]"
    return repr(node)


def module_digest(source: str, name: str = "<module>") -> str:
    """SHA-256 of a module's normalised tree: equal for two sources that differ only in docstrings,
    comments, formatting, raise messages or evalkit import paths."""
    return _digest(_canonical(normalised_tree(source, name)).encode())


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def identity_parts() -> dict[str, object]:
    """What the identity hashes: the numerics version, the modules' digests (sorted, no paths) and
    the data files' ``name -> digest`` (``.py`` files by :func:`module_digest`, the rest by bytes)."""
    modules = sorted(module_digest(f.read_text(encoding="utf-8"), str(f)) for f in numerics_modules())
    data = {}
    for name, path in data_files():
        raw = path.read_bytes()
        data[name] = module_digest(raw.decode("utf-8"), name) if path.suffix == ".py" else _digest(raw)
    return {"numerics_version": NUMERICS_VERSION, "modules": modules, "data": data}


@lru_cache(maxsize=1)
def code_identity() -> str:
    """``sha256:<hex>`` of :func:`identity_parts` (see the module docstring)."""
    parts = identity_parts()
    h = hashlib.sha256(f"numerics {parts['numerics_version']}\n".encode())
    for digest in parts["modules"]:
        h.update(f"module {digest}\n".encode())
    for name, digest in parts["data"].items():
        h.update(f"data {name} {digest}\n".encode())
    return "sha256:" + h.hexdigest()


@lru_cache(maxsize=1)
def git_provenance() -> dict[str, object]:
    """``{"commit": SHA, "dirty": bool}`` when the package runs from a git checkout, else ``{}``.

    ``dirty``: the package or task files differ from the commit (uncommitted changes); the code
    identity covers them either way."""
    root = PACKAGE.parent
    if not (root / ".git").exists():
        return {}
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "evalkit", "tasks"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": commit, "dirty": bool(status.strip())} if commit else {}


def code_record() -> dict[str, object]:
    """What a run records about its code: the identity, the numerics version, evalkit's release
    version and, in a checkout, the git commit."""
    import evalkit

    return {
        "identity": code_identity(),
        "numerics_version": NUMERICS_VERSION,
        "evalkit_version": evalkit.__version__,
        **git_provenance(),
    }
