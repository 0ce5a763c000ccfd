"""evalkit: what does an FP8 (or INT8/INT4) KV cache cost a model in quality, and what does it save?

Public entry points::

    from evalkit import quantized_kv, parse_scheme, load_model
    with quantized_kv(model, "fp8_e4m3/head/dynamic"):
        logits = model(ids).logits          # K/V stored as FP8 codes and read back

Names are resolved on first use, so ``import evalkit`` (and the command line's ``--help``) does not
import torch or transformers.
"""

from __future__ import annotations

__version__ = "0.2.0"

_LAZY = {
    "EvalkitError": "evalkit.errors",
    "Scheme": "evalkit.kv.scheme",
    "parse_scheme": "evalkit.kv.scheme",
    "parse_schemes": "evalkit.kv.scheme",
    "quantized_kv": "evalkit.integration.install",
    "load_model": "evalkit.models.loading",
}

__all__ = [*_LAZY, "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'evalkit' has no attribute {name!r}")
