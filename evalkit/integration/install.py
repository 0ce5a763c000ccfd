"""``quantized_kv(model, scheme)``: make a loaded transformers model store K/V through a scheme.

How it works (transformers 5.x; see shared/DESIGN.md): every mainstream decoder calls the
function ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`` with post-RoPE K/V shaped
(batch, kv_heads, seq, head_dim). We register a wrapper under ``evalkit_<impl>`` that looks up the
calling attention module's session, quantizes K and V (the full K/V including the cached past,
so the result is what a quantized cache would hold), and then calls the model's *own*
implementation: sdpa, another registered backend, or the modeling module's
``eager_attention_forward`` (gemma2's soft-capping lives there). The matching mask function is
registered under the same name: without it transformers would pass no mask and ignore padding.

The model is switched with ``set_attn_implementation`` on entry and switched back on exit,
exception or not; nothing is patched at import time and no model file is copied. Registration
happens on first use and is idempotent; which model a call belongs to is looked up in a
weak-keyed table of the attention modules of models inside a ``quantized_kv`` block.

Multi-head latent attention models store a compressed latent, not per-head K/V, so for them the
hook quantizes at the cache boundary instead (:mod:`evalkit.integration.storage`): a forward pre-hook hands the
model an FP8 storage cache whenever the caller did not pass one.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Iterator

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from evalkit.integration.fa3 import fa3_attention
from evalkit.errors import EvalkitError
from evalkit.integration.binding import KVQuantizer
from evalkit.model_info import check_supported, config_hash, kv_layout, text_config
from evalkit.kv.scheme import AttentionPrecision, GranularityKind, ScaleSource, Scheme, parse_scheme

_SESSIONS: "weakref.WeakKeyDictionary[torch.nn.Module, _Session]" = weakref.WeakKeyDictionary()
_PREFIX = "evalkit_"


def key_validity(attention_mask: torch.Tensor | None, batch: int, kv_len: int) -> torch.Tensor | None:
    """(batch, kv_len) bool of real (non-padding) key positions, or None when all are real."""
    if attention_mask is None or attention_mask.dim() != 4:
        return None
    mask = attention_mask[..., :kv_len]
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    valid = allowed.any(dim=(1, 2))
    if valid.shape[0] != batch:
        valid = valid.expand(batch, -1)
    return None if bool(valid.all()) else valid


class _Session:
    """One model inside one ``quantized_kv`` block."""

    def __init__(self, model, quantizer: KVQuantizer, inner_name: str, kv_in_cache: bool = False):
        self.quantizer = quantizer
        self.kv_in_cache = kv_in_cache  # the storage cache already quantized K/V
        self.inner_name = inner_name
        scheme = quantizer.scheme
        self.fa3 = scheme.attention is AttentionPrecision.FA3
        dynamic_shared = scheme.scales is ScaleSource.DYNAMIC and scheme.granularity.kind in (
            GranularityKind.TENSOR, GranularityKind.HEAD, GranularityKind.BLOCK)
        self.padding_aware = dynamic_shared and not quantizer.fmt.is_identity and not kv_in_cache
        self._validity_cache: tuple | None = None

    def inner(self, module):
        if self.inner_name == "eager":
            modeling = sys.modules[type(module).__module__]
            return getattr(modeling, "eager_attention_forward")
        return ALL_ATTENTION_FUNCTIONS[self.inner_name]

    def validity(self, attention_mask, batch, kv_len):
        if not self.padding_aware or attention_mask is None:
            return None
        cached = self._validity_cache
        if cached is not None and cached[0] is attention_mask and cached[1] == kv_len:
            return cached[2]
        valid = key_validity(attention_mask, batch, kv_len)
        self._validity_cache = (attention_mask, kv_len, valid)
        return valid

    def attend(self, module, query, key, value, attention_mask, **kwargs):
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            raise EvalkitError(f"attention module {type(module).__name__} has no layer_idx: evalkit cannot tell its layer")
        q = self.quantizer
        if q.is_active(layer):
            if not self.kv_in_cache:
                valid = self.validity(attention_mask, key.shape[0], key.shape[-2])
                key = q("k", layer, key, valid)
                value = q("v", layer, value, valid)
            if self.fa3:
                return fa3_attention(module, query, key, value, attention_mask, **kwargs)
        return self.inner(module)(module, query, key, value, attention_mask, **kwargs)


def _evalkit_attention(module, query, key, value, attention_mask, **kwargs):
    session = _SESSIONS.get(module)
    if session is None:
        raise EvalkitError("the evalkit attention function was called outside `quantized_kv`: switch the model back with set_attn_implementation")
    return session.attend(module, query, key, value, attention_mask, **kwargs)


def _register(inner_name: str) -> str:
    name = _PREFIX + inner_name
    if inner_name not in ALL_MASK_ATTENTION_FUNCTIONS and inner_name != "eager":
        raise EvalkitError(f"attention implementation {inner_name!r} has no mask function evalkit can reuse: load the model with attn_implementation='sdpa' or 'eager'")
    AttentionInterface.register(name, _evalkit_attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[inner_name])
    return name


def attention_implementation(model) -> str:
    return text_config(model.config)._attn_implementation or "eager"


@contextlib.contextmanager
def quantized_kv(model, scheme: Scheme | str, *, scale_table=None, quantizer: KVQuantizer | None = None,
                 kv_in_cache: bool = False) -> Iterator[KVQuantizer]:
    """Within the block, ``model`` stores its K/V through ``scheme``; restored on exit.

    Yields the :class:`KVQuantizer` (its ``scheme``, ``layout`` and static ``table``). A ready
    ``quantizer`` (e.g. the calibration observer, a KVQuantizer subclass) replaces the one built
    from ``scheme``. ``kv_in_cache=True`` is for :func:`evalkit.integration.storage.quantized_cache`: K/V are
    quantized by the storage cache and the hook only applies the attention precision (``attn=fa3``).
    """
    if isinstance(scheme, str):
        scheme = parse_scheme(scheme)
    check_supported(model)
    layout = kv_layout(model.config)
    if quantizer is None:
        quantizer = KVQuantizer(scheme, layout, config_hash(model.config), scale_table)
    if layout.is_mla:
        from evalkit.integration.storage import mla_cache_session

        if kv_in_cache:
            yield quantizer
            return
        with mla_cache_session(model, quantizer):
            yield quantizer
        return
    original = attention_implementation(model)
    if original.startswith(_PREFIX):
        raise EvalkitError("quantized_kv blocks cannot be nested on one model: leave the first block before entering another")
    session = _Session(model, quantizer, original, kv_in_cache)
    modules = list(model.modules())
    name = _register(original)
    for m in modules:
        _SESSIONS[m] = session
    try:
        model.set_attn_implementation(name)
        yield quantizer
    finally:
        try:
            model.set_attn_implementation(original)
        finally:
            for m in modules:
                _SESSIONS.pop(m, None)
