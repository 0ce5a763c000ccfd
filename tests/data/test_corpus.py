"""Corpus specs (embedded, file:, hf: on local dataset folders) and the on-disk token cache."""

from __future__ import annotations

import hashlib
import json

import pytest

from evalkit.data.corpus import SHORT_NAMES, Corpus, load_corpus, tokenize_corpus
from evalkit.errors import EvalkitError


def test_embedded_corpus_is_python_docs_with_its_hash():
    """The frozen topics (tests/data/test_frozen_texts.py pins their hash on every Python)."""
    from evalkit.data.frozen import pydoc_topics

    c = load_corpus("embedded")
    assert c.name == "embedded"
    assert c.text == "\n\n".join(pydoc_topics().values())
    assert c.sha256 == hashlib.sha256(c.text.encode()).hexdigest()
    assert len(c.text.split()) > 50_000


def test_txt_and_jsonl_files(tmp_path):
    (tmp_path / "a.txt").write_text("hello world\nsecond line\n", encoding="utf-8")
    assert load_corpus(f"file:{tmp_path / 'a.txt'}").text == "hello world\nsecond line\n"
    lines = [{"text": "first doc", "id": 1}, {"text": "second doc", "body": "other", "id": 2}]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n\n", encoding="utf-8")
    assert load_corpus(f"file:{tmp_path / 'd.jsonl'}").text == "first doc\n\nsecond doc"
    (tmp_path / "e.jsonl").write_text(json.dumps({"body": "x"}) + "\n" + json.dumps({"body": "y"}) + "\n")
    assert load_corpus(f"file:{tmp_path / 'e.jsonl'}:body").text == "x\n\ny"


@pytest.mark.parametrize(
    "content, spec_suffix, message",
    [
        (None, "missing.txt", "does not exist"),
        ("", "empty.txt", "is empty"),
        ('{"body": "x"}\n', "nofield.jsonl", "no string field 'text'"),
        ("not json\n", "bad.jsonl", "not valid JSON"),
        ("a,b\n", "table.csv", "use a .txt or .jsonl"),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path, content, spec_suffix, message):
    path = tmp_path / spec_suffix
    if content is not None:
        path.write_text(content)
    with pytest.raises(EvalkitError, match=message) as err:
        load_corpus(f"file:{path}")
    assert "\n" not in str(err.value)


def test_unknown_spec():
    with pytest.raises(EvalkitError, match="unknown corpus 'nonsense'"):
        load_corpus("nonsense")
    with pytest.raises(EvalkitError, match="hf:NAME"):
        load_corpus("hf:onlyname")


def test_saved_dataset_folder(tmp_path):
    import datasets

    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": ["a b c", "d e"], "n": [1, 2]}),
            "test": datasets.Dataset.from_dict({"text": ["line one\n", "line two\n"], "body": ["x", "y"]}),
        }
    )
    dd.save_to_disk(tmp_path / "saved")
    assert load_corpus(f"hf:{tmp_path / 'saved'}:train").text == "a b c\n\nd e"
    assert load_corpus(f"hf:{tmp_path / 'saved'}:test").text == "line one\nline two\n"  # wikitext-style rows
    assert load_corpus(f"hf:{tmp_path / 'saved'}:test:body").text == "x\n\ny"
    with pytest.raises(EvalkitError, match="no split 'validation'"):
        load_corpus(f"hf:{tmp_path / 'saved'}:validation")
    with pytest.raises(EvalkitError, match="no column 'n'|no column"):
        load_corpus(f"hf:{tmp_path / 'saved'}:test:n")


def test_data_files_folder_goes_through_load_dataset(tmp_path):
    folder = tmp_path / "raw"
    folder.mkdir()
    (folder / "test.jsonl").write_text(json.dumps({"text": "alpha"}) + "\n" + json.dumps({"text": "beta"}) + "\n")
    assert load_corpus(f"hf:{folder}:test").text == "alpha\n\nbeta"


def test_wikitext_short_name_and_offline_error(monkeypatch):
    assert SHORT_NAMES["wikitext2"] == "hf:Salesforce/wikitext/wikitext-2-raw-v1:test"
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EvalkitError, match="could not load dataset corpus") as err:
        load_corpus("hf:no-such-owner/no-such-dataset-xyz:test")
    assert "\n" not in str(err.value)


def test_tokenize_once_and_cache(tmp_path, tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    corpus = Corpus.from_text("The quick brown fox jumps over the lazy dog. " * 20, "fox")
    ids = tokenize_corpus(corpus, tok, tmp_path)
    assert ids.dtype.is_floating_point is False and ids.dim() == 1
    assert ids.tolist() == tok(corpus.text, add_special_tokens=False)["input_ids"]
    files = list((tmp_path / "tokens").glob("*.safetensors"))
    assert len(files) == 1

    calls = []

    class Counting:
        def __init__(self, inner):
            self.inner = inner
            self.backend_tokenizer = inner.backend_tokenizer

        def __call__(self, *a, **k):
            calls.append(1)
            return self.inner(*a, **k)

        def __len__(self):
            return len(self.inner)

    counting = Counting(tok)
    counting.__class__.__name__ = type(tok).__name__  # same identity as the real tokenizer
    assert tokenize_corpus(corpus, counting, tmp_path).tolist() == ids.tolist()
    assert calls == []  # served from the cache
    other = Corpus.from_text(corpus.text + " more", "fox2")
    tokenize_corpus(other, tok, tmp_path)
    assert len(list((tmp_path / "tokens").glob("*.safetensors"))) == 2
    assert not list((tmp_path / "tokens").glob("*.tmp"))
