"""The GGUF file llama.cpp loads for an evalkit model name: the embedded model's, a ``.gguf`` path, or
the one ``.gguf`` in a folder."""

from __future__ import annotations

from pathlib import Path

from evalkit.errors import EvalkitError


def gguf_path(name: str) -> Path:
    """The GGUF file llama.cpp loads for model ``name``: the embedded model's, a ``.gguf`` file, or the
    one ``.gguf`` in a folder; EvalkitError (one line) otherwise."""
    from evalkit.models.loading import embedded_gguf, embedded_name

    embedded = embedded_name(name)
    if embedded:
        return embedded_gguf(embedded)
    p = Path(name).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return p
    found = sorted(p.glob("*.gguf")) if p.is_dir() else []
    if len(found) == 1:
        return found[0]
    what = f"{len(found)} .gguf files" if found else "no .gguf file"
    raise EvalkitError(
        f"engine llamacpp loads a GGUF file and {name} has {what}: give the embedded model, a .gguf path "
        "or a folder holding exactly one"
    )
