"""What a run reads besides its spec, the code and the corpora, by content, for its run id: the model's
weights, its config and tokenizer files, and the static scale tables its scheme reads.

A run id must change when a checkpoint is re-trained in place, its config or chat template edited, or
a scale table rewritten under the same path; the spec names each by path only. :func:`run_inputs` adds

* ``weights``: :func:`model_weights_fingerprint`, computed without loading the model (the loaded-model
  :func:`evalkit.models.info.weights_fingerprint` of the baseline caches needs the weights in memory,
  too dear at grid expansion for a sweep of large models): for a local folder the SHA-256 of its
  weight files' names and bytes; for a hub id the blob digests of the weight files in the local
  Hugging Face cache (their SHA-256, which the hub names them by), ``uncached`` before its download
  (then the first run's download gives later processes a new id: a re-run, never a stale reuse); for
  the embedded model the SHA-256 of its GGUF file. A file's digest is kept per process by (path,
  size, mtime, inode), so a rewritten file is hashed again and an unchanged one once;
* ``model_files``: :func:`model_files_fingerprint`, the same for the files beside the weights that
  decide the numbers: ``config.json`` (``rope_scaling``, ``max_position_embeddings``, the attention
  and norm settings), ``generation_config.json`` (the decoding defaults, the end-of-sequence ids) and
  the tokenizer's files (:data:`MODEL_FILES`: vocabulary, merges, special tokens, the chat template
  in ``tokenizer_config.json`` or its own ``chat_template.jinja``/``.json``). Each present file by name
  and content, absent ones left out. The embedded model has none: its GGUF file, hashed as its
  weights, holds its config, tokenizer and chat template in its metadata, so the key is left out and
  its run ids are those of before;
* ``scales``: the SHA-256 of the static table the scheme reads (``+scales=PATH``, found as the run
  finds it). An engine profile's derived table (``engine-scales/...``) is the file its scheme
  names, so a rewritten source table, re-derived when the grid is expanded, changes it too. A
  missing table is ``missing`` (the run is refused before it starts);
* ``tasks``: the shipped task files of the run's evaluation (the folder ``tasks/<eval>``, e.g.
  ``tasks/lmeval``: lm-eval YAMLs and their Python helpers; ``tasks/retrieval``), each by name and
  content, so a reworded prompt re-runs that evaluation's runs and a task added for another
  evaluation re-runs nothing.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack")
# the files beside the weights that from_pretrained reads for the config, decoding defaults and tokenizer
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
)
_CHUNK = 1 << 20
_DIGESTS: dict[tuple, str] = {}  # (resolved path, size, mtime_ns, inode) -> sha256 hex
_HUB: dict[str, str] = {}  # hub id -> its fingerprint, once per process (a mid-sweep download keeps the id)


def file_digest(path: Path) -> str:
    """SHA-256 hex of a file's bytes, kept per process while its size, mtime and inode stay."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def _weight_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix in WEIGHT_SUFFIXES and p.is_file())


def _folder_fingerprint(folder: Path) -> str:
    h = hashlib.sha256()
    for f in _weight_files(folder):
        h.update(f"{f.relative_to(folder).as_posix()} {file_digest(f)}\n".encode())
    return "sha256:" + h.hexdigest()


def _hub_snapshot(repo_id: str) -> Path | None:
    """The local Hugging Face cache's snapshot folder of ``repo_id``, None before its download."""
    try:
        from huggingface_hub import try_to_load_from_cache

        config = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001  (not a hub id, or no huggingface_hub: the loader refuses the model)
        config = None
    return Path(config).parent if isinstance(config, str) else None


def _hub_fingerprint(repo_id: str) -> str:
    if repo_id in _HUB:
        return _HUB[repo_id]
    snapshot = _hub_snapshot(repo_id)
    if snapshot is None:
        _HUB[repo_id] = "uncached"
        return "uncached"
    h = hashlib.sha256()
    for f in _weight_files(snapshot):
        blob = f.resolve().name if f.is_symlink() else file_digest(f)  # the cache's blobs are named by digest
        h.update(f"{f.relative_to(snapshot).as_posix()} {blob}\n".encode())
    _HUB[repo_id] = "sha256:" + h.hexdigest()
    return _HUB[repo_id]


def _model_files(folder: Path) -> list[tuple[str, Path]]:
    """(name, path) of the :data:`MODEL_FILES` present in ``folder`` (and its ``additional_chat_templates``)."""
    found = [(n, folder / n) for n in MODEL_FILES if (folder / n).is_file()]
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        found += [(f"{extra.name}/{f.name}", f) for f in sorted(extra.iterdir()) if f.is_file()]
    return found


def model_files_fingerprint(name: str) -> str:
    """The fingerprint of the config, generation config and tokenizer files ``name`` loads beside its
    weights (see the module docstring): "" for the embedded model (its GGUF holds them) and for a model
    with none of them present; ``uncached`` for a hub id not yet downloaded."""
    from evalkit.models.loading import embedded_name, is_path_like

    if embedded_name(name):
        return ""
    if is_path_like(name):
        folder = Path(name).expanduser()
        files = _model_files(folder) if folder.is_dir() else []
    else:
        snapshot = _hub_snapshot(name)
        if snapshot is None:
            return "uncached"
        files = _model_files(snapshot)
    if not files:
        return ""
    h = hashlib.sha256()
    for rel, f in files:
        blob = f.resolve().name if f.is_symlink() else file_digest(f)  # hub cache blobs are named by digest
        h.update(f"{rel} {blob}\n".encode())
    return "sha256:" + h.hexdigest()


def model_weights_fingerprint(name: str) -> str:
    """The fingerprint of the weights ``name`` (an embedded name, a local folder or a hub id) loads."""
    from evalkit.errors import EvalkitError
    from evalkit.models.loading import embedded_gguf, embedded_name, is_path_like

    embedded = embedded_name(name)
    if embedded:
        try:
            return "sha256:" + file_digest(embedded_gguf(embedded))
        except EvalkitError:  # its package is missing: the run is refused when it loads the model
            return "absent"
    if is_path_like(name):
        folder = Path(name).expanduser()
        return _folder_fingerprint(folder) if folder.is_dir() else "absent"
    return _hub_fingerprint(name)


def scale_file_hashes(scheme: str) -> dict[str, str]:
    """``{path as the scheme names it: "sha256:..."}`` of the static table the scheme reads; {} for none."""
    from evalkit.data.resources import resolve_calibration_file
    from evalkit.errors import EvalkitError
    from evalkit.kv.scheme import parse_scheme

    try:
        path = parse_scheme(scheme).static_path
    except EvalkitError:
        return {}
    if not path:
        return {}
    try:
        found = resolve_calibration_file(path)
    except EvalkitError:
        return {path: "missing"}
    return {path: "sha256:" + file_digest(found) if found.is_file() else "missing"}


TASK_SUFFIXES = (".yaml", ".yml", ".py", ".json", ".jsonl", ".txt", ".jinja")


def task_file_hashes(eval_name: str) -> dict[str, str]:
    """``{"tasks/<eval>/<file>": "sha256:..."}`` of the shipped task folder of an evaluation; {} for none."""
    from evalkit.data.resources import resource_dir
    from evalkit.errors import EvalkitError

    try:
        root = resource_dir("tasks") / eval_name
    except EvalkitError:  # a broken install: the evaluation refuses to run anyway
        return {}
    if not root.is_dir():
        return {}
    files = sorted(
        f for f in root.rglob("*") if f.is_file() and f.suffix in TASK_SUFFIXES and "__pycache__" not in f.parts
    )
    return {f"tasks/{eval_name}/{f.relative_to(root).as_posix()}": "sha256:" + file_digest(f) for f in files}


def run_inputs(model_name: str, scheme: str, eval_name: str = "") -> dict[str, object]:
    """What enters the run id beside the spec: the weights' and the model files' fingerprints, the scale
    tables' and the evaluation's shipped task files' hashes."""
    scales = scale_file_hashes(scheme)
    tasks = task_file_hashes(eval_name) if eval_name else {}
    files = model_files_fingerprint(model_name)
    return {
        "weights": model_weights_fingerprint(model_name),
        **({"model_files": files} if files else {}),
        **({"scales": scales} if scales else {}),
        **({"tasks": tasks} if tasks else {}),
    }
