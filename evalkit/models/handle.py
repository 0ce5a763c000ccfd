"""A model evalkit does not load: what an engine run needs of it, without its weights.

When a real engine computes the numbers (``run --engine vllm``, ``engine: llamacpp`` in a grid), the
engine loads the weights itself, under its own parallelism and in its own memory. evalkit then needs
only what it reads around the engine: the folder the engine is given, the tokenizer (to build and
decode requests), the config (its architectures, the KV layout, the config hash a scale table is checked
against, the longest context), and the dtype and device the run is recorded at. :func:`open_model`
reads those from the config and tokenizer files alone; :class:`ModelHandle` stands where a
:class:`~evalkit.models.loading.LoadedModel` stands on the emulation path, with ``model = None`` (no
weights: code that needs them must take the emulation path). For a 70B model that is the difference
between a few megabytes and 131 GiB on the first GPU before the engine asks for its share.

The embedded model's first use still converts its GGUF into the dense folder an engine reads
(:func:`evalkit.models.loading.ensure_embedded`, once per machine); later runs read only its config and
tokenizer files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from evalkit.models.info import KVLayout, config_hash, kv_layout

if TYPE_CHECKING:
    import torch


@dataclass
class ModelHandle:
    """A model's facts without its weights (see the module docstring); ``model`` is always None."""

    tokenizer: object
    config: object  # the transformers config, as AutoConfig reads it
    name: str  # what the user asked for (hub id, folder, or embedded name)
    path: str  # the folder or id the engine is given
    config_hash: str
    layout: KVLayout
    dtype: torch.dtype  # what the engine runs in (the same rule as a loaded model's dtype)
    device: torch.device
    decode_path: str = "eager"
    model: None = None  # no weights: the engine holds them

    @property
    def max_length(self) -> int | None:
        return self.layout.max_positions


def open_model(
    name: str, *, dtype=None, device: str = "cpu", device_map=None, trust_remote_code: bool = False, **_ignored
) -> ModelHandle:
    """The :class:`ModelHandle` of ``name`` (a hub id, a folder or an embedded name, as ``--model`` takes
    it) from its config and tokenizer files; one line (EvalkitError) when they cannot be read. Takes the
    keyword options :func:`evalkit.models.loading.load_model` takes (``attn_implementation``, which only a
    loaded model uses, is ignored)."""
    import torch
    from transformers import AutoConfig, AutoTokenizer

    from evalkit.models.loading import embedded_name, model_file_errors, model_source, resolve_dtype

    path, local_only = model_source(name)
    placed_on = device if device_map is None else ("cuda" if torch.cuda.is_available() else "cpu")
    with model_file_errors(name, path, "read"):
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, local_files_only=local_only)
        tokenizer = AutoTokenizer.from_pretrained(
            path, trust_remote_code=trust_remote_code, local_files_only=local_only
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return ModelHandle(
        tokenizer,
        config,
        embedded_name(name) or name,
        path,
        config_hash(config),
        kv_layout(config),
        resolve_dtype(dtype, placed_on),
        torch.device(placed_on),
    )


def open_model_with(name: str, options) -> ModelHandle:
    """:func:`open_model` with the options an object carries (a sweep's ``ModelSpec`` or the CLI's
    arguments), as :func:`evalkit.models.loading.load_model_with` takes them."""
    from evalkit.models.decode_path import resolve_decode_path
    from evalkit.models.loading import LOAD_OPTIONS

    setting = getattr(options, "decode_path", None) or "auto"
    resolve_decode_path(setting, "cpu")  # an unknown name fails before anything is read
    handle = open_model(name, **{option: getattr(options, option) for option in LOAD_OPTIONS})
    handle.decode_path = resolve_decode_path(setting, handle.device)
    return handle
