"""The identity of the code that decides the numbers: part of every run id.

``evalkit.__version__`` never changed while the numerics did, so a resumed sweep reused rows of
older code. The code identity is instead a SHA-256 over the files that decide a run's numbers:

* every ``.py`` file of the ``evalkit`` package (quantizers, hook, caches, evaluations, model
  loading, the sweep runner), except the report (``evalkit/report/`` and ``evalkit/cli/report.py``:
  they only read a results store, never compute a number in it);
* every file of the shipped task folder ``tasks/`` (the lm-eval YAMLs and their ``utils.py``, the
  retrieval task YAMLs) and the scale tables of ``calibration/`` (``*.safetensors``, named by the
  default grid's static schemes): the checkout's folders, or the installed package's copies.

Not covered: the grids (their settings are the run spec itself), scale files outside
``calibration/`` (a static scheme names its file by path: replacing its content under the same
name is not detected), the model weights (the run info records the model's path and config hash).

Each file enters as its path relative to its root and its bytes, in sorted order, so the same
source gives the same identity in a git checkout, an editable install and a wheel, and a commit
that touches only the README, the tests or the report keeps every run valid. Library versions
(torch, transformers, lm-eval) enter the run id separately (:func:`evalkit.sweep.grid.versions`).

The git commit (and whether the tree differs from it) is recorded next to the identity in each
run's info as provenance, for people: it does not enter the run id, since a commit changes with
every edit anywhere in the repository, including the commit that adds a results store.

Both are computed once per process (the package's source files and one ``git`` call).
"""

from __future__ import annotations

import hashlib
import subprocess
from functools import lru_cache
from pathlib import Path

from evalkit.errors import EvalkitError

PACKAGE = Path(__file__).resolve().parents[1]  # .../evalkit
EXCLUDED = ("report/", "cli/report.py", "_data/")  # the report reads stores only; _data/* are hashed as data


DATA = {"tasks": (".yaml", ".yml", ".py", ".json", ".txt", ".jinja"), "calibration": (".safetensors",)}


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


def code_files() -> list[tuple[str, Path]]:
    """(name in the hash, file) of everything that decides the numbers, in a stable order.

    Names are relative to the package and to each data folder, so a checkout and a wheel of the
    same source (whose data folders live in ``evalkit/_data/``) hash the same."""
    files = []
    for f in PACKAGE.rglob("*.py"):
        rel = f.relative_to(PACKAGE).as_posix()
        if "__pycache__" not in rel and not rel.startswith(EXCLUDED):
            files.append((f"evalkit/{rel}", f))
    for kind, suffixes in DATA.items():
        root = data_dir(kind)
        for f in root.rglob("*") if root is not None else ():
            rel = f.relative_to(root).as_posix()
            if f.suffix in suffixes and "__pycache__" not in rel and f.is_file():
                files.append((f"{kind}/{rel}", f))
    return sorted(files)


@lru_cache(maxsize=1)
def code_identity() -> str:
    """``sha256:<hex>`` of the number-deciding source files (see the module docstring)."""
    h = hashlib.sha256()
    for name, path in code_files():
        data = path.read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
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
    """What a run records about its code: the identity and, in a checkout, the git commit."""
    return {"identity": code_identity(), **git_provenance()}
