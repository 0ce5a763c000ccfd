"""The one baseline cache of the evaluations that run lm-eval (``lmeval``, ``longcontext``, ``generation``).

Each runs its tasks once on the unquantized model and compares every scheme's items with those. Where
the backend's baseline is reusable (the emulation: the plain model), that run is kept as JSON under the
work folder, ``<workdir>/<eval>/<key[:20]>/baseline.json``, and reused while its key holds.

The key (:func:`baseline_key`) is :func:`evalkit.evals.output_head.baseline_key`'s, the one every
evaluation's baseline cache uses (model name, config, weights, dtype, device, tokenizer), with what
decides an lm-eval run's numbers besides: the evaluation's format version and canonical parameters, the
model's path (lm-eval tasks read it as metadata), its decode path (generation batches decode on it), the
task files of its folders by name and content, and the versions of lm-eval, torch and transformers.

Files are written whole (a per-process temporary file renamed into place, so sweep workers of one model
may share the cache) and read defensively: a missing, unreadable, foreign-keyed or mis-shaped file is a
cache miss, never an error. JSON only, no pickle.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

TASK_FILE_SUFFIXES = (".yaml", ".yml", ".py", ".json", ".jsonl", ".txt", ".jinja")


def task_files_digest(folders) -> str:
    """SHA-256 over every task file (:data:`TASK_FILE_SUFFIXES`) of ``folders``, by relative name and content."""
    h = hashlib.sha256()
    for folder in map(Path, folders):
        for f in sorted(folder.rglob("*")):
            if f.is_file() and f.suffix in TASK_FILE_SUFFIXES:
                h.update(str(f.relative_to(folder)).encode() + f.read_bytes())
    return h.hexdigest()


def baseline_key(lm, *, format: int, params: dict, task_folders) -> str:
    """The cache key of an lm-eval baseline run of ``lm`` (module docstring), as a hex digest."""
    import torch
    import transformers

    from evalkit.evals.lmeval.adapter import lm_eval_version
    from evalkit.evals.output_head import baseline_key as model_key

    key = model_key(
        lm,
        format=format,
        path=str(lm.path),
        decode_path=getattr(lm, "decode_path", "eager"),
        params=params,
        task_files=task_files_digest(task_folders),
        lm_eval=lm_eval_version(),
        torch=torch.__version__,
        transformers=transformers.__version__,
    )
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


def baseline_file(workdir: Path, eval_name: str, key: str) -> Path:
    return Path(workdir) / eval_name / key[:20] / "baseline.json"


def read_baseline(path: Path, key: str, fields: dict[str, type]) -> dict | None:
    """The cached ``fields`` (name -> the JSON type each must have) stored under ``key``, or None (a miss)."""
    try:
        stored = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(stored, dict) or stored.get("key") != key:
        return None
    if not all(isinstance(stored.get(name), kind) for name, kind in fields.items()):
        return None
    return {name: stored[name] for name in fields}


def write_baseline(path: Path, key: str, payload: dict) -> None:
    """Write ``payload`` under ``key`` whole: the complete file appears last."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # this process's own: workers may share the cache
    tmp.write_text(json.dumps({"key": key, **payload}))
    tmp.replace(path)
