"""The identity of what decides the numbers besides a run's spec and inputs: part of every run id.

A run id must change when the numbers a run would give can change, and only then. A published store
stays valid across a refactor that changes no number: the identity is **not** a hash of the source.
It is a SHA-256 over

* :data:`NUMERICS_VERSION`, an integer bumped by hand in the commit that means to change numbers.
  What holds the code to it are the numerics fingerprints (``tests/numerics/``): fixed computations
  whose outputs are pinned per version, one per codec family (every scheme and engine codec, bytes and
  dequantized values), one for the storage path (what the storage cache keeps and hands to attention
  for fixed K/V, prefill and decode, every cache kind) and one per evaluation (the statistics and the
  metrics of each evaluation on fixed inputs, and a whole evaluation on a tiny model). A change that
  moves any of them fails that test until the version is bumped and the fingerprint re-pinned, and a
  bumped version changes every run id; the rerun checks of the published stores' sampled rows
  (``tests/report/test_published*.py``) hold the stores to what the code gives today;
* the frozen texts (``evalkit/data/texts/*.json``: the embedded corpus and the calibration text,
  :mod:`evalkit.data.frozen`), which every default run reads, by name and bytes;
* the numerics versions of the components the run's numbers go through (:func:`components`): its codec
  family (:attr:`evalkit.kv.codec.CodecFamily.numerics_version`; evalkit's own formats by
  :data:`evalkit.kv.formats.FORMAT_NUMERICS`) and its evaluation
  (:attr:`evalkit.evals.base.Evaluation.numerics_version`). A component's version starts at 0 and enters
  the hash only once bumped, so bumping one re-keys the runs that use it and no others, as lm-eval keeps a
  version per task. :data:`NUMERICS_VERSION` stays for what every run shares (the storage path, the
  statistics every evaluation uses); the fingerprints pin each component's groups under its own version.

What each run reads besides these enters its own run id by content (:mod:`evalkit.sweep.run_inputs`):
the model's weights, the static scale tables its scheme names, the shipped task files of its
evaluation (``tasks/<eval>/``) and local corpus files (:func:`evalkit.data.corpus_check.input_hashes`).
Library versions, the Python version and a real engine's package and version enter beside the
identity (:func:`evalkit.sweep.run_versions.versions`).

The git commit (and whether the tree differs from it) is recorded next to the identity in each run's
info as provenance, for people: it does not enter the run id, since a commit changes with every edit
anywhere in the repository, including the commit that adds a results store.
"""

from __future__ import annotations

import hashlib
import subprocess
from functools import lru_cache
from pathlib import Path

NUMERICS_VERSION = 3  # bump by hand when a commit means to change numbers (and re-pin the numerics fingerprints)

PACKAGE = Path(__file__).resolve().parents[1]  # .../evalkit
TEXTS = PACKAGE / "data" / "texts"  # the frozen texts: hashed as data


def data_files() -> list[tuple[str, Path]]:
    """(name in the hash, file) of the frozen texts, ``texts/<name>.json``."""
    return sorted((f"texts/{f.name}", f) for f in TEXTS.glob("*.json") if f.is_file())


def identity_parts() -> dict[str, object]:
    """What the identity hashes: the numerics version and the frozen texts' ``name -> SHA-256``."""
    data = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in data_files()}
    return {"numerics_version": NUMERICS_VERSION, "data": data}


def components(
    scheme: str | None = None, eval_name: str | None = None, decode_path: str | None = None
) -> dict[str, int]:
    """``component -> numerics version`` of what a run of ``scheme`` and ``eval_name`` goes through, the
    bumped ones only (version 0 adds nothing to the identity): ``codec:<prefix>`` for a scheme of an engine
    codec family (``vllm:``, ``llamacpp:``; what the family's fingerprint group pins), ``format:<name>`` for
    evalkit's own formats, ``eval:<name>`` for the evaluation, ``decode:static`` for a run whose decode steps
    take the static-shape paths (``decode_path`` resolved: ``static`` or ``compiled``)."""
    out: dict[str, int] = {}
    if decode_path in ("static", "compiled"):
        from evalkit.models.decode_path import STATIC_NUMERICS

        out["decode:static"] = STATIC_NUMERICS
    if scheme is not None:
        from evalkit.kv.codec import family_of
        from evalkit.kv.formats import FORMAT_NUMERICS
        from evalkit.kv.scheme import parse_scheme

        parsed = parse_scheme(scheme)
        family = family_of(parsed.recipe)  # an engine family's recipe: its fingerprint group pins the scheme
        if family is not None:
            out[f"codec:{family.prefix}"] = int(family.numerics_version)
        elif not parsed.is_identity:
            out[f"format:{parsed.format}"] = int(FORMAT_NUMERICS.get(parsed.format, 0))
    if eval_name is not None:
        from evalkit.evals.base import get_eval, registry

        if eval_name in registry():  # one that is not registered cannot run (a grid refuses it in one line)
            out[f"eval:{eval_name}"] = int(get_eval(eval_name).numerics_version)
    return {name: version for name, version in sorted(out.items()) if version}


def code_identity(parts: dict[str, int] | None = None) -> str:
    """``sha256:<hex>`` of :func:`identity_parts` and the bumped component versions ``parts``
    (:func:`components`; see the module docstring)."""
    return _identity(tuple(sorted((parts or {}).items())))


@lru_cache(maxsize=64)
def _identity(bumped: tuple[tuple[str, int], ...]) -> str:
    parts = identity_parts()
    h = hashlib.sha256(f"numerics {parts['numerics_version']}\n".encode())
    for name, digest in parts["data"].items():
        h.update(f"data {name} {digest}\n".encode())
    for name, version in bumped:
        h.update(f"component {name} {version}\n".encode())
    return "sha256:" + h.hexdigest()


@lru_cache(maxsize=1)
def git_provenance() -> dict[str, object]:
    """``{"commit": SHA, "dirty": bool}`` when the package runs from a git checkout, else ``{}``.

    ``dirty``: the package or task files differ from the commit (uncommitted changes)."""
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


def code_record(parts: dict[str, int] | None = None) -> dict[str, object]:
    """What a run records about its code: the identity (with the bumped component versions ``parts`` of
    its scheme and evaluation, :func:`components`), the numerics version, the component versions,
    evalkit's release version and, in a checkout, the git commit."""
    import evalkit

    return {
        "identity": code_identity(parts),
        "numerics_version": NUMERICS_VERSION,
        **({"components": dict(parts)} if parts else {}),
        "evalkit_version": evalkit.__version__,
        **git_provenance(),
    }
