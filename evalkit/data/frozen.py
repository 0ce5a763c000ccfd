"""Frozen texts: the embedded corpus and the calibration text, shipped as files, the same on every Python.

Both texts come from Python's own documentation, but evalkit never reads them from the running
interpreter: ``pydoc_data.topics`` differs by version (465,126 characters on 3.11.7, 492,311 on
3.12.1, 510,742 on 3.13.0) and so do the standard library's docstrings (the calibration text is
259,323 characters on 3.11.7, 263,867 on 3.12.1), so a table made on one interpreter could not be
reproduced on another. The files in ``evalkit/data/texts/`` were taken once from CPython 3.11.7
(the interpreter that made the published stores) by :mod:`evalkit.data.freeze`, and ship in the wheel
as package data:

* ``pydoc_topics.json``: ``topics`` of CPython 3.11.7's ``Lib/pydoc_data/topics.py`` (the
  "Python Language Reference" topics ``help()`` shows), in its stored order. The embedded corpus
  (:func:`embedded_text`) is their values joined by blank lines; the lm-eval tasks
  ``evalkit_topics_ppl`` and ``evalkit_recall`` cut their documents from the same topics.
* ``stdlib_docs.json``: the calibration text ``stdlib-docs``: docstrings of a fixed list of
  standard-library modules and their public classes and functions, deduplicated, minus every
  docstring that shares a 13-word sequence with the embedded corpus (so calibration is disjoint from
  the default evaluation text by construction). Each entry names the object it documents.

Licence: both are part of Python's source and documentation, Copyright (c) 2001-2023 Python Software
Foundation, All Rights Reserved, used under the PSF License Agreement (version 2), which
``evalkit/data/texts/NOTICE`` reproduces together with the summary of changes it asks for (the
texts are unchanged; they are stored as JSON, and the docstrings selected as described above).

Each text's SHA-256 (of its UTF-8 bytes, as joined) is pinned here and checked on every load, so an
edited or damaged file is a one-line error rather than quietly different numbers; the tests pin the
same values independently. The files are data in evalkit's code identity
(:mod:`evalkit.sweep.code_identity`): changing them changes every run id.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from evalkit.errors import EvalkitError

FOLDER = Path(__file__).resolve().parent / "texts"
TOPICS_FILE = FOLDER / "pydoc_topics.json"
STDLIB_DOCS_FILE = FOLDER / "stdlib_docs.json"
SOURCE = "CPython 3.11.7"
EMBEDDED_SHA256 = "71f2ff5d99bdc1f9c48c5c2353ad138201c5ca1c377e0226857ef8fa89b8bcee"  # 465,126 characters
STDLIB_DOCS_SHA256 = "f3ae482017900dcf2fcbf626560cebf38b7bf14a83ff4d042331cd85b75413fa"  # 259,323 characters


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise EvalkitError(
            f"evalkit's frozen text {path} cannot be read ({type(exc).__name__}): reinstall evalkit "
            "(pip install --force-reinstall --no-deps evalkit, or pip install . from a checkout)"
        ) from None
    if not isinstance(data, dict) or data.get("source") != SOURCE:
        raise EvalkitError(f"{path} is not evalkit's frozen text from {SOURCE}: reinstall evalkit")
    return data


def _checked(text: str, expected: str, path: Path) -> str:
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest != expected:
        raise EvalkitError(
            f"{path} gives a text with SHA-256 {digest[:16]}..., not the frozen {expected[:16]}...: "
            "restore the file (git checkout, or reinstall evalkit)"
        )
    return text


@lru_cache(maxsize=1)
def pydoc_topics() -> dict[str, str]:
    """CPython 3.11.7's ``pydoc_data.topics.topics``: topic name -> text, in the stored order."""
    topics = _read(TOPICS_FILE).get("topics")
    if not isinstance(topics, dict) or not all(isinstance(v, str) for v in topics.values()):
        raise EvalkitError(f"{TOPICS_FILE} holds no topics: reinstall evalkit")
    _checked("\n\n".join(topics.values()), EMBEDDED_SHA256, TOPICS_FILE)
    return dict(topics)


def embedded_text() -> str:
    """The embedded corpus: the topics' texts joined by blank lines (SHA-256 :data:`EMBEDDED_SHA256`)."""
    return "\n\n".join(pydoc_topics().values())


@lru_cache(maxsize=1)
def stdlib_docs() -> str:
    """The ``stdlib-docs`` calibration text: the frozen docstrings joined by blank lines."""
    docs = _read(STDLIB_DOCS_FILE).get("docs")
    if not isinstance(docs, list) or not all(isinstance(d, dict) and isinstance(d.get("doc"), str) for d in docs):
        raise EvalkitError(f"{STDLIB_DOCS_FILE} holds no docstrings: reinstall evalkit")
    return _checked("\n\n".join(d["doc"] for d in docs), STDLIB_DOCS_SHA256, STDLIB_DOCS_FILE)
