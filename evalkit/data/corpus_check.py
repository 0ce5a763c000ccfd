"""Check corpus specs before a model loads, so a typo costs a second, not a model load.

Loading a model takes seconds (the embedded one from its GGUF file tens of seconds); an
evaluation reads its corpus only after that. :func:`check_corpus_spec` finds what
:func:`evalkit.data.corpus.load_corpus` would refuse, early: ``embedded`` and ``file:PATH`` specs
are read as the evaluation will read them (a local file, milliseconds), so a missing file, a
``.jsonl`` line without its field or a foreign suffix is the same one line as later; an
``hf:...`` spec is checked for its form only (whether the dataset exists may need the network and
minutes, which is the evaluation's to spend). :func:`check_corpus_params` applies it to the
parameters of an evaluation (or a calibration) that name a corpus, and :func:`input_hashes` gives
the run id the content of the local files they name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from typing import Any

from evalkit.data.corpus import SHORT_NAMES, load_corpus, source_hash
from evalkit.errors import EvalkitError

CORPUS_KEYS = ("corpus", "haystack", "eval_corpus")  # parameters that hold a corpus spec
NOT_CORPORA = ("filler", "none", "stdlib-docs", "per-task")  # values of those keys that name no corpus file


def check_corpus_spec(spec: str, where: str = "corpus") -> None:
    """Raise EvalkitError (one line, prefixed by ``where``) for a spec that cannot load."""
    text = (spec or "").strip()
    if text.lower() in NOT_CORPORA:
        return
    text = SHORT_NAMES.get(text.lower(), text)
    try:
        if text.startswith("hf:"):
            parts = text[len("hf:") :].split(":")
            if len(parts) not in (2, 3) or not all(parts):
                raise EvalkitError(f"bad dataset corpus {text!r}: write hf:NAME[/CONFIG]:SPLIT[:COLUMN]")
            return
        load_corpus(text)
    except EvalkitError as exc:
        raise EvalkitError(f"{where}: {exc}") from None


def check_corpus_params(params: Any, where: str = "") -> None:
    """Check every corpus spec among an evaluation's parameters (a dict or a params dataclass)."""
    values = asdict(params) if is_dataclass(params) and not isinstance(params, type) else params
    if not isinstance(values, Mapping):
        return
    for key in CORPUS_KEYS:
        value = values.get(key)
        if isinstance(value, str) and value.strip():
            check_corpus_spec(value, f"{where} {key}".strip())


def corpus_problems(evals: Any, *, located: bool) -> list[tuple[tuple, str]]:
    """Every corpus spec among a grid's ``evals:`` (eval name -> its parameters) that cannot load, as
    ``(key path, message)`` (``("evals", NAME, KEY)``): for a grid file (``located``) the message without the
    key, which its line names; for a description without a file (``run``'s flags) named for the evaluation.
    An entry that is not a mapping is the grid's to report."""
    out: list[tuple[tuple, str]] = []
    for name, params in evals.items() if isinstance(evals, Mapping) else ():
        for key in CORPUS_KEYS:
            spec = params.get(key) if isinstance(params, Mapping) else None
            if not isinstance(spec, str) or not (located or spec.strip()):
                continue
            try:
                check_corpus_spec(spec, key if located else f"{name} {key}")
            except EvalkitError as exc:
                message = str(exc).removeprefix(f"{key}: ") if located else str(exc)
                out.append((("evals", name, key), message))
    return out


def input_hashes(params: Any) -> dict[str, str]:
    """``{key: "sha256:..."}`` of the local corpus files among an evaluation's parameters (``corpus``,
    ``haystack``, ...), by content (:func:`evalkit.data.corpus.source_hash`): part of the run id, so a
    corpus file edited under the same name is a new run, not a reused one. Empty when no parameter
    names a local file (the embedded corpus is in the code identity; hub datasets cannot be hashed
    before their download)."""
    values = asdict(params) if is_dataclass(params) and not isinstance(params, type) else params
    if not isinstance(values, Mapping):
        return {}
    out = {}
    for key in CORPUS_KEYS:
        value = values.get(key)
        if isinstance(value, str) and value.strip().lower() not in NOT_CORPORA:
            digest = source_hash(value)
            if digest is not None:
                out[key] = digest
    return out
