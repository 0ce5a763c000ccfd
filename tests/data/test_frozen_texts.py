"""The embedded corpus and the calibration text are frozen files: the same SHA-256 on every Python.

``pydoc_data.topics`` and the standard library's docstrings differ by Python version, so evalkit
ships CPython 3.11.7's (evalkit.data.frozen). The hashes below are pinned here, independently of
the module's own constants: they are the texts the published stores were computed from. This file
needs neither datasets nor lm-eval, so it runs in the GPU image's environment (Python 3.12) too:
``.ci/gpu_image_env DIR && DIR/bin/python -m pytest -q tests/data/test_frozen_texts.py``.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from evalkit.data import frozen
from evalkit.data.corpus import load_corpus, ngrams
from evalkit.errors import EvalkitError

EMBEDDED = ("71f2ff5d99bdc1f9c48c5c2353ad138201c5ca1c377e0226857ef8fa89b8bcee", 465_126)
STDLIB_DOCS = ("f3ae482017900dcf2fcbf626560cebf38b7bf14a83ff4d042331cd85b75413fa", 259_323)
REPO = Path(__file__).resolve().parents[2]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_embedded_corpus_has_the_pinned_hash_on_this_python():
    c = load_corpus("embedded")
    assert (c.sha256, len(c.text)) == EMBEDDED, f"Python {sys.version.split()[0]}"
    assert c.sha256 == sha(c.text) == frozen.EMBEDDED_SHA256 and c.name == "embedded"
    assert c.text == "\n\n".join(frozen.pydoc_topics().values())
    assert len(c.text.split()) > 50_000 and len(frozen.pydoc_topics()) == 79


def test_calibration_text_has_the_pinned_hash_and_is_disjoint_from_the_corpus():
    from evalkit.scales.calibrate import DEFAULT_CORPUS, load_text

    text = load_text(DEFAULT_CORPUS)
    assert (sha(text), len(text)) == STDLIB_DOCS, f"Python {sys.version.split()[0]}"
    assert not ngrams(text) & ngrams(load_text("embedded"))


def test_the_interpreters_own_texts_are_never_read():
    """In a fresh interpreter where ``pydoc_data`` cannot be imported, the corpus, the calibration
    text and the lm-eval tasks' topics still load, and none of the standard-library modules whose
    docstrings the calibration text holds gets imported."""
    code = f"""
import sys
sys.modules["pydoc_data"] = None  # any import of it now fails
from evalkit.data.corpus import load_corpus
from evalkit.scales.calibrate import load_text
assert load_corpus("embedded").sha256 == {EMBEDDED[0]!r}
assert len(load_text("stdlib-docs")) == {STDLIB_DOCS[1]}
from evalkit.data import frozen
assert frozen.pydoc_topics()
touched = sorted(m for m in ("wave", "smtplib", "sched") if m in sys.modules)
assert not touched, touched
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_lmeval_topics_come_from_the_frozen_copy(monkeypatch):
    import importlib.util

    pytest.importorskip("datasets")
    monkeypatch.setitem(sys.modules, "pydoc_data", None)
    spec = importlib.util.spec_from_file_location(
        "evalkit_frozen_test_task_utils", REPO / "tasks" / "lmeval" / "utils.py"
    )
    task_utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(task_utils)

    topics = frozen.pydoc_topics()
    docs = task_utils.topic_documents(200)
    assert docs and all(p in topics[d["topic"]] for d in docs for p in d["text"].split("\n\n"))
    assert len(task_utils.recall_documents()) == 100


@pytest.mark.parametrize("which", ["topics", "docs"])
def test_an_edited_frozen_file_is_a_one_line_error(tmp_path, monkeypatch, which):
    source = frozen.TOPICS_FILE if which == "topics" else frozen.STDLIB_DOCS_FILE
    data = json.loads(source.read_text())
    if which == "topics":
        first = next(iter(data["topics"]))
        data["topics"][first] += " "
    else:
        data["docs"][0]["doc"] += " "
    edited = tmp_path / source.name
    edited.write_text(json.dumps(data))
    monkeypatch.setattr(frozen, "TOPICS_FILE" if which == "topics" else "STDLIB_DOCS_FILE", edited)
    loader = frozen.pydoc_topics if which == "topics" else frozen.stdlib_docs
    loader.cache_clear()
    try:
        with pytest.raises(EvalkitError, match="not the frozen") as err:
            loader()
        assert "\n" not in str(err.value)
        edited.write_text("{not json")
        with pytest.raises(EvalkitError, match="cannot be read.*reinstall"):
            loader()
    finally:
        loader.cache_clear()


def test_the_frozen_files_are_ascii_package_data_with_their_licence():
    for path in (frozen.TOPICS_FILE, frozen.STDLIB_DOCS_FILE):
        assert path.read_bytes().isascii() and json.loads(path.read_text())["source"] == frozen.SOURCE
    notice = (frozen.FOLDER / "NOTICE").read_text()
    assert "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" in notice and "Summary of changes" in notice
    setup = (REPO / "setup.py").read_text()
    assert '"evalkit.data": ["texts/*.json", "texts/NOTICE"]' in setup
    assert "recursive-include evalkit/data/texts *.json NOTICE" in (REPO / "MANIFEST.in").read_text()
