"""``quantized_kv(model, scheme)``: inside the block, the model stores its KV cache under ``scheme``.

There is one storage path. A forward pre-hook on the decoder (the module that creates the cache)
gives every forward that brings no cache, or an empty one, a :class:`~evalkit.integration.storage.StorageCache`
(``use_cache`` is forced on): so ``model(ids)``, ``model.generate(...)``, lm-eval's ``HFLM`` and
evals that run the backbone directly all write K/V as codes plus scales and read them back, prefill
included. A cache made by :meth:`KVSession.new_cache` (or returned by an earlier forward in the
block) is used as it is, so teacher-forced decoding continues the same cache. A cache that already
holds tokens evalkit did not store is refused.

After every forward a hook checks the cache: a forward that wrote nothing to the cache means the
model's attention never calls ``cache.update`` (its K/V cannot be intercepted): that is refused,
never measured as if unquantized. NaN or inf in K/V raises naming the layer: read from the device
after every forward that wrote more than one token; a one-token decode step only sets the flag on
the device (no host synchronisation inside a decode step), read when the next longer forward comes,
when a decode loop calls :meth:`KVSession.check_finite`, and at the latest when the block ends.

A scheme whose codec family models what its engine's attention does to Q (``llamacpp:``: Q converted to
the K type's dot type, as llama.cpp's CPU kernels do; :meth:`evalkit.kv.codec.CodecFamily.query_rounding`)
routes attention through that rounding on the layers it quantizes.
``+attn=fa3`` additionally routes attention through :func:`~evalkit.integration.fa3.fa3_attention`
(queries and softmax probabilities in FP8 over the stored K/V) for quantized layers; ``+attn=fa3:acc1``
and ``+attn=fa3:acc2`` also model its FP8 tensor-core accumulation (one and two level).

The model is restored on exit, exception or not; nothing is patched at import time.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch

from evalkit.errors import EvalkitError, SchemeError, UnsupportedModelError
from evalkit.integration.attention import attention_handler
from evalkit.integration.binding import BoundScheme
from evalkit.integration.fa3 import ONE_LEVEL, TWO_LEVEL, fa3_attention
from evalkit.integration.hf_compat import cache_keyword, check_transformers, take_cache
from evalkit.integration.static_cache import StaticStorageCache
from evalkit.integration.storage import StorageCache
from evalkit.kv.codec import family_of
from evalkit.kv.scale_table import ScaleTable
from evalkit.kv.scheme import AttentionPrecision, Scheme, parse_scheme
from evalkit.models.info import check_supported, config_hash, kv_layout

check_transformers()

_ACTIVE: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def _is_static(cache) -> bool:
    return isinstance(cache, StaticStorageCache)


class KVSession:
    """One model inside one ``quantized_kv`` block: its bound scheme and the caches it hands out."""

    def __init__(self, model, binding: BoundScheme, cache_keyword: str = "cache"):
        self.model, self.binding = model, binding
        self.cache_keyword = cache_keyword  # what the decoder's forward calls its cache (see hf_compat)
        self._unchecked: weakref.WeakSet = weakref.WeakSet()  # caches whose decode steps' NaN flags are unread
        self._written_before = 0

    def check_finite(self) -> None:
        """Read the NaN/inf flags of every cache whose decode steps were not checked yet (one device read each)."""
        pending, self._unchecked = list(self._unchecked), weakref.WeakSet()
        for cache in pending:
            cache.check_finite()

    @property
    def scheme(self) -> Scheme:
        return self.binding.scheme

    @property
    def layout(self):
        return self.binding.layout

    def new_cache(self, attention_mask: torch.Tensor | None = None) -> StorageCache:
        """An empty storage cache; ``attention_mask`` (batch, seq) describes the first write's padding."""
        return StorageCache(self.model.config, self.binding, attention_mask)

    def new_static_cache(self, max_len: int, attention_mask: torch.Tensor | None = None):
        """An empty storage cache of static shapes for ``max_len`` tokens per sequence (compiled decoding:
        :mod:`evalkit.integration.static_cache`); its NaN flags are read when the block ends, or by
        :meth:`check_finite`."""
        cache = StaticStorageCache(self.model.config, self.binding, max_len, attention_mask)
        self._unchecked.add(cache)
        return cache

    # -- hooks on the decoder ------------------------------------------------------------------
    def _pre_forward(self, module, args, kwargs):
        cache = take_cache(kwargs)  # given as cache= or past_key_values=, whichever the release names it
        if _is_static(cache):  # a compiled decode step: nothing here may read the device or vary per step
            if cache.binding is not self.binding:
                raise SchemeError(
                    "this storage cache was made for another quantized_kv block: make a new one with session.new_cache()"
                )
            kwargs[self.cache_keyword], kwargs["use_cache"] = cache, True
            return args, kwargs
        if isinstance(cache, StorageCache):
            if cache.binding is not self.binding:
                raise SchemeError(
                    "this storage cache was made for another quantized_kv block: make a new one with session.new_cache()"
                )
            kwargs[self.cache_keyword], kwargs["use_cache"] = cache, True
            self._written_before = cache.get_seq_length()
            return args, kwargs
        if cache is not None and cache.get_seq_length() > 0:
            raise SchemeError(
                "the model got a cache that already holds tokens evalkit did not store: "
                "start from an empty cache (or none) inside quantized_kv"
            )
        mask = kwargs.get("attention_mask")
        if mask is None and len(args) > 1 and isinstance(args[1], torch.Tensor):
            mask = args[1]
        kwargs[self.cache_keyword] = self.new_cache(
            mask if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None
        )
        kwargs["use_cache"] = True
        self._written_before = 0
        return args, kwargs

    def _post_forward(self, module, args, kwargs, output):
        cache = kwargs.get(self.cache_keyword)
        if not isinstance(cache, StorageCache):  # a static cache's flags are read when its decoding is over
            return output
        if cache.get_seq_length() - self._written_before > 1:  # a prefill or scoring forward: read the flags now
            self.check_finite()
            cache.check_finite()
        else:  # a decode step: the flag stays on the device until the decoding is over
            self._unchecked.add(cache)
        layers = cache.storage_layers()
        if layers and all(layer.get_seq_length() == 0 for layer in layers):
            model_type = getattr(self.layout, "model_type", "?")
            raise UnsupportedModelError(
                f"model type {model_type!r} never wrote its K/V to the cache (its attention does not call cache.update), "
                "so evalkit cannot store them: use a model such as llama, mistral, qwen2/3, gemma, phi3, gpt2, gpt_neox or opt"
            )
        return output


@contextlib.contextmanager
def quantized_kv(model, scheme: Scheme | str, *, scale_table: ScaleTable | None = None) -> Iterator[KVSession]:
    """Within the block, ``model`` stores K/V under ``scheme`` (see the module docstring); yields the session."""
    if isinstance(scheme, str):
        scheme = parse_scheme(scheme)
    check_supported(model)
    layout = kv_layout(model.config)
    binding = BoundScheme(scheme, layout, config_hash(model.config), scale_table)
    fa3 = scheme.attention.is_fa3 and not scheme.is_identity
    if fa3 and layout.is_mla:
        raise SchemeError("attn=fa3 is not modeled for multi-head latent attention models: drop +attn=fa3")
    family = family_of(scheme.recipe)
    round_query = None if family is None or scheme.is_identity else family.query_rounding(scheme)
    if round_query is not None and fa3:
        raise SchemeError(f"a {family.prefix}: scheme models {family.own_attention}, not FA3: drop +attn=fa3")
    if model in _ACTIVE:
        raise EvalkitError(
            "quantized_kv blocks cannot be nested on one model: leave the first block before entering another"
        )
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    session = KVSession(model, binding, cache_keyword(decoder))
    with contextlib.ExitStack() as stack:
        if fa3:
            stack.enter_context(attention_handler(model, _fa3_handler(binding)))
        if round_query is not None:
            stack.enter_context(attention_handler(model, _query_handler(binding, round_query)))
        handles = [
            decoder.register_forward_pre_hook(session._pre_forward, with_kwargs=True),
            decoder.register_forward_hook(session._post_forward, with_kwargs=True),
        ]
        _ACTIVE.add(model)
        try:
            yield session
            session.check_finite()
        finally:
            _ACTIVE.discard(model)
            for h in handles:
                h.remove()


def _layer_of(module) -> int:
    """The decoder layer an attention module belongs to (transformers' ``layer_idx``); one line if it has none."""
    layer = getattr(module, "layer_idx", None)
    if layer is None:
        raise EvalkitError(f"attention module {type(module).__name__} has no layer_idx: evalkit cannot tell its layer")
    return layer


def _query_handler(binding: BoundScheme, round_query):
    """Q as the engine's attention reads it (its codec family's ``query_rounding``) on the quantized layers."""

    def handler(module, query, key, value, attention_mask, inner, **kwargs):
        if binding.is_active(_layer_of(module)):
            query = round_query(query)
        return inner(module, query, key, value, attention_mask, **kwargs)

    return handler


_FA3_ACCUMULATION = {
    AttentionPrecision.FA3: 0,
    AttentionPrecision.FA3_ACC1: ONE_LEVEL,
    AttentionPrecision.FA3_ACC2: TWO_LEVEL,
}


def _fa3_handler(binding: BoundScheme):
    accumulation = _FA3_ACCUMULATION[binding.scheme.attention]

    def handler(module, query, key, value, attention_mask, inner, **kwargs):
        if binding.is_active(_layer_of(module)):
            return fa3_attention(module, query, key, value, attention_mask, accumulation=accumulation, **kwargs)
        return inner(module, query, key, value, attention_mask, **kwargs)

    return handler
