"""`evalkit models`: the embedded offline models, where their files are, and evalkit's on-disk cache.

The cache (``$EVALKIT_CACHE``, default ``~/.cache/evalkit``) holds the dense copy of each embedded
model (``models/``) and the tokenized data and baselines that evaluations reuse (``work/``). It is
shown with its size (binary units, :mod:`evalkit.units`) because it grows silently with every new
model, corpus and grid (the README's cache section says how much); every file in it is rebuilt
when missing, so deleting it is always safe.
"""

from __future__ import annotations

import os
from pathlib import Path

from evalkit.cli import COMMANDS
from evalkit.errors import EvalkitError
from evalkit.models.loading import (
    _MARKER,
    EMBEDDED_ALIASES,
    EMBEDDED_MODELS,
    cache_root,
    embedded_dense_dir,
    embedded_gguf,
)
from evalkit.units import format_bytes


def add_parser(sub):
    p = sub.add_parser("models", help=COMMANDS["models"])
    p.set_defaults(handler=run)


def folder_bytes(folder: Path) -> int:
    """Total size of the files under ``folder`` (0 when it does not exist); links are not followed."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass  # removed while we walked
    return total


def run(args) -> int:
    aliases = {}
    for alias, target in EMBEDDED_ALIASES.items():
        aliases.setdefault(target, []).append(alias)
    for name, info in EMBEDDED_MODELS.items():
        print(f"{name}  (also: {', '.join(aliases.get(name, []))})")
        print(f"  {info['description']}")
        print(f"  upstream: {info['hub_id']} via PyPI {info['pip']}")
        try:
            print(f"  gguf:     {embedded_gguf(name)}")
        except EvalkitError as exc:
            print(f"  gguf:     missing ({exc})")
        dense = embedded_dense_dir(name)
        state = "ready" if (dense / _MARKER).is_file() else "not converted yet (the first load converts it)"
        print(f"  dense:    {dense} [{state}]")
    print("\nAny Hugging Face id or local model folder works too: --model ORG/NAME or --model ./folder")
    root = cache_root()
    parts = (
        [f"{p.name} {format_bytes(folder_bytes(p))}" for p in sorted(root.iterdir()) if p.is_dir()]
        if root.is_dir()
        else []
    )
    detail = f" ({', '.join(parts)})" if parts else ""
    print(f"\ncache: {root}  {format_bytes(folder_bytes(root))}{detail}")
    print("  move it: set EVALKIT_CACHE=/other/folder; clear it: delete the folder (rebuilt when needed)")
    return 0
