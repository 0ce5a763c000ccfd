"""Text corpora for evaluations: load one from a short spec, tokenize it once, cache the ids.

Specs (``load_corpus(spec)``):

- ``embedded``: Python's own documentation prose (the topics of CPython 3.11.7's
  ``pydoc_data/topics.py``, PSF licence, about 65k words), the topics joined in their stored order
  by blank lines. It is a frozen file shipped with evalkit (:mod:`evalkit.data.frozen`), never the
  running interpreter's copy, which differs by Python version: the same text (SHA-256
  ``71f2ff5d...``) on every Python.
- ``file:PATH``: a ``.txt`` file (read as UTF-8), or a ``.jsonl`` file whose records have a
  ``text`` field (``file:PATH.jsonl:FIELD`` names another field). Records are joined by blank lines.
- ``hf:NAME[/CONFIG]:SPLIT[:COLUMN]``: any ``datasets`` dataset; ``COLUMN`` defaults to ``text``.
  ``NAME`` may be a hub id (``owner/name``; with one slash, ``name/config`` is tried when
  ``owner/name`` does not exist), a local folder of data files, or a folder written by
  ``Dataset.save_to_disk`` (so the path works offline). Rows are joined by blank lines, except
  that rows already ending in a newline (wikitext) are joined as they are.
- ``wikitext2``: short for ``hf:Salesforce/wikitext/wikitext-2-raw-v1:test``.

A :class:`Corpus` carries the joined text, its SHA-256 and a name. ``tokenize_corpus`` encodes the
whole text once without special tokens (evaluations add BOS themselves) and caches the ids as
safetensors under ``cache_dir/tokens/``, keyed by the text hash and a hash of the tokenizer's
serialized state, so a changed tokenizer never reuses stale ids. No pickle anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from evalkit.errors import EvalkitError

SHORT_NAMES = {"wikitext2": "hf:Salesforce/wikitext/wikitext-2-raw-v1:test"}
OVERLAP_NGRAM = 13  # n-word sequences shared by two texts count as overlap (calibration against evaluation)
SPEC_HELP = "use 'embedded', 'wikitext2', 'file:PATH' (.txt or .jsonl) or 'hf:NAME[/CONFIG]:SPLIT[:COLUMN]'"


@dataclass(frozen=True)
class Corpus:
    text: str
    sha256: str
    name: str

    @classmethod
    def from_text(cls, text: str, name: str) -> Corpus:
        if not text.strip():
            raise EvalkitError(f"corpus {name!r} is empty: give a corpus with text in it")
        return cls(text, hashlib.sha256(text.encode("utf-8")).hexdigest(), name)


def load_corpus(spec: str) -> Corpus:
    """Load the text a spec names (see the module docstring); EvalkitError on any bad spec."""
    spec = (spec or "").strip()
    spec = SHORT_NAMES.get(spec.lower(), spec)
    if spec.lower() == "embedded":
        from evalkit.data.frozen import embedded_text

        return Corpus.from_text(embedded_text(), "embedded")
    if spec.startswith("file:"):
        return _load_file(spec[len("file:") :], spec)
    if spec.startswith("hf:"):
        return _load_hf(spec[len("hf:") :], spec)
    raise EvalkitError(f"unknown corpus {spec!r}: {SPEC_HELP}")


def _file_and_field(rest: str) -> tuple[Path, str]:
    """``PATH`` or ``PATH.jsonl:FIELD`` -> (path, field)."""
    path, field = Path(rest), "text"
    if not path.exists() and ":" in rest:
        head, tail = rest.rsplit(":", 1)
        if head.endswith(".jsonl"):
            path, field = Path(head), tail
    return path, field


def source_hash(spec: str) -> str | None:
    """``sha256:<hex>`` of the local bytes a spec reads, for the run id, or None where the spec has none.

    ``file:PATH``: the file's bytes; ``hf:FOLDER:...`` naming a local folder: every file under it
    (relative names and bytes, in sorted order). None for ``embedded`` (a frozen file inside the
    package, hashed as data in the code identity) and for hub datasets (``hf:owner/name``,
    ``wikitext2``): their content is known only after a download, so the run id cannot cover it; each
    perplexity row records the ``corpus_sha256`` of the text it read instead. A missing path hashes as
    ``absent`` (the grid check refuses it before anything runs). Computed once per file state (path,
    size, modification time) in a process."""
    spec = SHORT_NAMES.get((spec or "").strip().lower(), (spec or "").strip())
    if spec.startswith("file:"):
        path = _file_and_field(spec[len("file:") :])[0]
        return _hash_paths((path,)) if path.is_file() else "absent"
    if spec.startswith("hf:"):
        folder = Path(spec[len("hf:") :].split(":")[0])
        if folder.is_dir():
            return _hash_paths(tuple(sorted(f for f in folder.rglob("*") if f.is_file())), root=folder)
    return None


def _hash_paths(paths: tuple[Path, ...], root: Path | None = None) -> str:
    state = tuple((str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in paths)
    return _hash_state(state, str(root.resolve()) if root is not None else None)


@lru_cache(maxsize=256)
def _hash_state(state: tuple[tuple[str, int, int], ...], root: str | None) -> str:
    h = hashlib.sha256()
    for path, _size, _mtime in state:
        if root is not None:
            h.update(Path(path).relative_to(root).as_posix().encode() + b"\0")
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        if root is not None:
            h.update(b"\0")
    return "sha256:" + h.hexdigest()


def _load_file(rest: str, spec: str) -> Corpus:
    path, field = _file_and_field(rest)
    if not path.is_file():
        raise EvalkitError(f"corpus file {str(path)!r} does not exist: check the path in {spec!r}")
    if path.suffix == ".jsonl":
        texts = []
        with open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise EvalkitError(
                        f"{path}:{n} is not valid JSON ({exc.msg}): fix the line or use a .txt file"
                    ) from None
                if not isinstance(record, dict) or not isinstance(record.get(field), str):
                    keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
                    raise EvalkitError(f"{path}:{n} has no string field {field!r} (has: {keys}): use file:{path}:FIELD")
                texts.append(record[field])
        return Corpus.from_text("\n\n".join(texts), spec)
    if path.suffix in (".txt", ".md", ".text", ""):
        try:
            return Corpus.from_text(path.read_text(encoding="utf-8"), spec)
        except UnicodeDecodeError:
            raise EvalkitError(f"corpus file {path} is not UTF-8 text: convert it first") from None
    raise EvalkitError(f"corpus file {path} has suffix {path.suffix!r}: use a .txt or .jsonl file")


def _load_hf(rest: str, spec: str) -> Corpus:
    parts = rest.split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise EvalkitError(f"bad dataset corpus {spec!r}: write hf:NAME[/CONFIG]:SPLIT[:COLUMN]")
    name, split = parts[0], parts[1]
    column = parts[2] if len(parts) == 3 else "text"
    ds = _open_dataset(name, split, spec)
    if column not in ds.column_names:
        raise EvalkitError(
            f"dataset {name!r} split {split!r} has no column {column!r} (has: {', '.join(ds.column_names)}): add :COLUMN to the spec"
        )
    rows = [r for r in ds[column] if isinstance(r, str)]
    if rows and sum(r.endswith("\n") for r in rows) > len(rows) // 2:
        text = "".join(rows)  # line-per-row datasets (wikitext) carry their own newlines
    else:
        text = "\n\n".join(rows)
    return Corpus.from_text(text, spec)


def _open_dataset(name: str, split: str, spec: str):
    import datasets

    local = Path(name)
    if local.is_dir():
        if (local / "dataset_dict.json").is_file() or (local / "state.json").is_file():
            ds = datasets.load_from_disk(str(local))
        else:
            ds = datasets.load_dataset(str(local))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise EvalkitError(
                    f"dataset folder {name!r} has no split {split!r} (has: {', '.join(ds)}): fix the SPLIT in {spec!r}"
                )
            ds = ds[split]
        return ds
    segments = name.split("/")
    if len(segments) > 3:
        raise EvalkitError(f"bad dataset name {name!r} in {spec!r}: write OWNER/NAME[/CONFIG] or a local folder")
    attempts = [("/".join(segments[:2]), segments[2])] if len(segments) == 3 else [(name, None)]
    if len(segments) == 2:
        attempts.append((segments[0], segments[1]))
    errors = []
    for path, config in attempts:
        try:
            return datasets.load_dataset(path, config, split=split)
        except Exception as exc:  # datasets raises many types for a missing dataset, config or network
            errors.append(
                f"{path}"
                + (f" config {config}" if config else "")
                + f": {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
            )
    raise EvalkitError(
        f"could not load dataset corpus {spec!r} ({'; '.join(errors)}): check the name, split and network (HF_DATASETS_OFFLINE)"
    )


def ngrams(text: str, n: int = OVERLAP_NGRAM) -> set[tuple[str, ...]]:
    """The text's n-word sequences (lower-cased ``\\w+`` words), for overlap checks between texts."""
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def tokenizer_adds_bos(tokenizer) -> bool:
    """True when the tokenizer puts BOS in front of plain text by itself (the model expects it)."""
    if getattr(tokenizer, "bos_token_id", None) is None:
        return False
    ids = tokenizer("hello", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0] == tokenizer.bos_token_id


def tokenizer_fingerprint(tokenizer) -> str:
    """SHA-256 of what decides the ids: the tokenizer's class and its serialized vocabulary and rules."""
    h = hashlib.sha256(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode("utf-8"))
    else:
        h.update(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode("utf-8"))
        h.update(json.dumps(getattr(tokenizer, "init_kwargs", {}), sort_keys=True, default=str).encode("utf-8"))
    return h.hexdigest()


def tokenize_corpus(corpus: Corpus, tokenizer, cache_dir: Path | str | None) -> torch.LongTensor:
    """The corpus as one 1-D LongTensor of token ids (no special tokens), cached on disk.

    The cache file is ``cache_dir/tokens/<text hash>-<tokenizer hash>.safetensors``; it is written
    to a temporary name and renamed, so an interrupted run never leaves a half file.
    """
    from safetensors.torch import load_file, save_file

    path = None
    if cache_dir is not None:
        key = f"{corpus.sha256[:20]}-{tokenizer_fingerprint(tokenizer)[:20]}"
        path = Path(cache_dir) / "tokens" / f"{key}.safetensors"
        if path.is_file():
            return load_file(path)["ids"].long()
    ids = tokenizer(corpus.text, add_special_tokens=False, return_attention_mask=False, verbose=False)["input_ids"]
    tensor = torch.tensor(ids, dtype=torch.long)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        store = tensor.to(torch.int32) if len(tokenizer) < 2**31 else tensor
        save_file(
            {"ids": store},
            tmp,
            metadata={
                "corpus": corpus.name,
                "sha256": corpus.sha256,
                "tokenizer": getattr(tokenizer, "name_or_path", ""),
            },
        )
        os.replace(tmp, path)
    return tensor
