"""Run a handler in place of a model's attention function: for FA3 precision and for observing K/V.

Every mainstream decoder in transformers 5.x calls
``ALL_ATTENTION_FUNCTIONS[config._attn_implementation](module, query, key, value, attention_mask, **kw)``
with post-RoPE K/V shaped (batch, kv_heads, seq, head_dim), after ``cache.update``. We register
one function under ``evalkit_<impl>`` that looks up the calling module's handler and gives it the
model's *own* implementation to call (sdpa, another registered backend, or the modeling module's
``eager_attention_forward``: gemma2's soft-capping lives there). The matching mask function is
registered under the same name: without it transformers passes no mask and ignores padding.

The model is switched with ``set_attn_implementation`` on entry and back on exit, exception or
not; nothing is patched at import time. Storing K/V is not done here: that is the storage cache's
job (:mod:`evalkit.integration.storage`).
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Callable, Iterator

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from evalkit.errors import EvalkitError
from evalkit.models.info import text_config

PREFIX = "evalkit_"
Handler = Callable[..., tuple]  # handler(module, query, key, value, attention_mask, inner, **kwargs)
_HANDLERS: weakref.WeakKeyDictionary[torch.nn.Module, tuple[Handler, str]] = weakref.WeakKeyDictionary()


def key_validity(attention_mask: torch.Tensor | None, batch: int, kv_len: int) -> torch.Tensor | None:
    """(batch, kv_len) bool of real (non-padding) key positions from a 4-D mask, or None when all are real."""
    if attention_mask is None or attention_mask.dim() != 4:
        return None
    mask = attention_mask[..., :kv_len]
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    valid = allowed.any(dim=(1, 2))
    if valid.shape[0] != batch:
        valid = valid.expand(batch, -1)
    return None if bool(valid.all()) else valid


def _inner(module, inner_name: str):
    if inner_name == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[inner_name]


def _evalkit_attention(module, query, key, value, attention_mask, **kwargs):
    entry = _HANDLERS.get(module)
    if entry is None:
        raise EvalkitError(
            "the evalkit attention function was called outside its block: switch the model back with set_attn_implementation"
        )
    handler, inner_name = entry
    return handler(module, query, key, value, attention_mask, _inner(module, inner_name), **kwargs)


def attention_implementation(model) -> str:
    return text_config(model.config)._attn_implementation or "eager"


@contextlib.contextmanager
def attention_handler(model, handler: Handler) -> Iterator[None]:
    """Within the block, every attention call of ``model`` goes through ``handler``."""
    original = attention_implementation(model)
    if original.startswith(PREFIX):
        raise EvalkitError(
            "evalkit attention blocks cannot be nested on one model: leave the first block before entering another"
        )
    if original not in ALL_MASK_ATTENTION_FUNCTIONS and original != "eager":
        raise EvalkitError(
            f"attention implementation {original!r} has no mask function evalkit can reuse: "
            "load the model with attn_implementation='sdpa' or 'eager'"
        )
    name = PREFIX + original
    AttentionInterface.register(name, _evalkit_attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[original])
    modules = list(model.modules())
    for m in modules:
        _HANDLERS[m] = (handler, original)
    try:
        model.set_attn_implementation(name)
        yield
    finally:
        try:
            model.set_attn_implementation(original)
        finally:
            for m in modules:
                _HANDLERS.pop(m, None)
