"""A KV cache that really stores K/V as 1-byte (or half-byte) codes plus scales.

``quantized_cache(model, scheme)`` yields a factory of transformers ``Cache`` objects to pass as
``cache=`` (``past_key_values=`` before transformers 5.x deprecated it) to ``generate()``: prefill and decode both read back the stored codes
(transformers' own ``QuantizedCache(backend="fp8")`` returns the unquantized prefill, so it is not
used). ``cache.nbytes()`` is the exact size of what is held: code tensors plus float32 scales
(plus zero points for asymmetric INT), with unquantized (skipped) layers counted at 2 bytes per
element as BF16 would take; it equals :func:`evalkit.memory.layer_cache_bytes` summed over layers.

How scales evolve, as engines do it (and where the cache differs from the attention hook, which
re-quantizes the full unquantized K/V at every step):

* ``tensor`` / ``head`` with dynamic scales: computed from the prefill (real tokens only) and then
  frozen; later tokens beyond the scale's range saturate. The hook recomputes them over all tokens
  seen so far, so the two differ once decoding starts. Static and unit scales never change.
* ``block<N>``: one scale per block of N tokens per head. When decode tokens land in a partially
  filled block, the block is re-encoded with the scale of all its tokens (its earlier tokens are
  rounded twice). Blocks are aligned to position 0 of the (possibly left-padded) batch; the hook
  aligns them to each sequence's first real token.
* ``token`` / ``group<N>``: each token's scale depends only on itself, so cache and hook agree
  bit-for-bit (tested).

Sliding-window layers keep the last ``window - 1`` tokens as transformers does (whole blocks for
``block<N>``, as a paged cache frees whole blocks). Multi-head latent attention layers receive
``(latent, rope_key)`` through ``update`` and store exactly those; ``+rope=bf16`` keeps the RoPE
key unquantized.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, DynamicCache, DynamicLayer, DynamicSlidingWindowLayer, get_layer_types_and_kwargs

from evalkit.errors import SchemeError
from evalkit.kv.formats import KVFormat
from evalkit.integration.binding import KVQuantizer
from evalkit.memory import BASELINE_BYTES
from evalkit.model_info import text_config
from evalkit.kv.quantize import (asymmetric_codes, asymmetric_params, group_amax, grouped, round_codes, scale_from_amax,
                              ungrouped)
from evalkit.kv.scheme import Granularity, GranularityKind, ScaleSource


def _pack_int4(codes: torch.Tensor) -> torch.Tensor:
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def _unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    out = torch.stack((packed & 0xF, packed >> 4), dim=-1)
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def encode(codes: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """Float32 code values (already rounded) -> the stored tensor (exact)."""
    if fmt.kind == "float":
        return codes.to(fmt.torch_dtype)
    if fmt.bits == 4:
        return _pack_int4(codes if fmt.asymmetric else codes + 8)
    return codes.to(fmt.torch_dtype)


def decode(stored: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """The stored tensor -> float32 code values."""
    if fmt.kind == "float":
        return stored.to(torch.float32)
    if fmt.bits == 4:
        c = _unpack_int4(stored).to(torch.float32)
        return c if fmt.asymmetric else c - 8
    return stored.to(torch.float32)


class StoredTensor:
    """One of a layer's K or V (or MLA latent / RoPE key): codes, scales, zero points."""

    def __init__(self, fmt: KVFormat, granularity: Granularity, fixed_scale: torch.Tensor | None, quantized: bool):
        self.fmt, self.granularity, self.quantized = fmt, granularity, quantized
        self.fixed = fixed_scale
        self.codes: torch.Tensor | None = None  # (B, H, S, D * bits / 8) or the raw values when not quantized
        self.scale: torch.Tensor | None = fixed_scale  # shape depends on granularity
        self.zero: torch.Tensor | None = None
        self.head_dim = 0
        self.offset = 0  # absolute position of the first stored token (sliding windows drop the front)
        self.total = 0  # tokens written so far

    @property
    def length(self) -> int:
        return 0 if self.codes is None else self.codes.shape[2]

    @property
    def kind(self) -> GranularityKind:
        return self.granularity.kind

    def _cat(self, name: str, new: torch.Tensor, dim: int = 2) -> None:
        old = getattr(self, name)
        setattr(self, name, new if old is None else torch.cat([old, new], dim=dim))

    def append(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        self.head_dim = x.shape[-1]
        if not self.quantized:
            self._cat("codes", x)
        elif self.fixed is not None:  # static or unit: one fixed scale, whatever the granularity
            self._cat("codes", encode(round_codes(x.float() / self.fixed, self.fmt), self.fmt))
        elif self.kind is GranularityKind.BLOCK:
            self._append_block(x, valid)
        else:
            self._append_scaled(x.float(), valid)
        self.total += x.shape[2]

    def _append_scaled(self, xf: torch.Tensor, valid) -> None:
        fmt, kind = self.fmt, self.kind
        per_token = kind in (GranularityKind.TOKEN, GranularityKind.GROUP)
        if self.scale is None or per_token:  # dynamic: per-token scales, or tensor/head frozen at first write
            g = grouped(xf, self.granularity)
            masked = g if valid is None or per_token else g.masked_fill(~valid[:, None, :, None], 0.0)
            if fmt.asymmetric:
                scale, zero = asymmetric_params(masked, fmt, self.granularity)
            else:
                scale, zero = scale_from_amax(group_amax(masked, self.granularity), fmt), None
            if per_token:
                codes = self._codes(g, scale, zero)
                self._cat("codes", encode(ungrouped(codes, xf.shape), fmt))
                self._cat("scale", scale.reshape(*xf.shape[:3], -1))
                if zero is not None:
                    self._cat("zero", zero.reshape(*xf.shape[:3], -1))
                return
            self.scale, self.zero = scale, zero
        self._cat("codes", encode(self._codes(xf, self.scale, self.zero), fmt))

    def _codes(self, g, scale, zero):
        if self.fmt.asymmetric:
            return asymmetric_codes(g, self.fmt, scale, zero)
        return round_codes(g / scale, self.fmt)

    def _append_block(self, x: torch.Tensor, valid) -> None:
        n = self.granularity.size
        if self.fmt.asymmetric:
            raise SchemeError("the storage cache keeps block scales for symmetric formats only: use int4/int8 (not _asym) or token/group granularity")
        partial = self.total % n
        xf = x.float()
        if valid is not None:
            xf = xf.masked_fill(~valid[:, None, :, None], 0.0)
        if partial and self.length >= partial:  # re-encode the partly filled last block with the new tokens
            tail = self.dequantize(torch.float32)[:, :, -partial:]
            self.codes, self.scale = self.codes[:, :, :-partial], self.scale[:, :, :-1]
            xf = torch.cat([tail, xf], dim=2)
        g = grouped(xf, self.granularity)
        scale = scale_from_amax(group_amax(g, self.granularity), self.fmt)
        codes = ungrouped(round_codes(g / scale, self.fmt), xf.shape)
        self._cat("codes", encode(codes, self.fmt))
        self._cat("scale", scale.reshape(*xf.shape[:2], -1))

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        if not self.quantized:
            return self.codes
        values = decode(self.codes, self.fmt)
        if self.fixed is not None:
            return (values * self.fixed).to(dtype)
        b, h, s, d = values.shape
        kind = self.kind
        if kind is GranularityKind.GROUP:
            size = self.granularity.size
            out = values.reshape(b, h, s, d // size, size) * self.scale.unsqueeze(-1)
            return out.reshape(b, h, s, d).to(dtype)
        if kind is GranularityKind.BLOCK:
            n = self.granularity.size
            scale = self.scale.repeat_interleave(n, dim=2)[:, :, :s, None]
            return (values * scale).to(dtype)
        scale = self.scale
        if self.fmt.asymmetric:
            return ((values - self.zero) * scale).to(dtype)
        return (values * scale).to(dtype)

    def drop_front(self, keep: int) -> None:
        """Keep the last ``keep`` tokens (rounded out to whole blocks for block scales)."""
        if self.length <= keep:
            return
        target = self.total - keep
        if self.quantized and self.kind is GranularityKind.BLOCK:
            target = target // self.granularity.size * self.granularity.size
        drop = target - self.offset
        if drop <= 0:
            return
        self.codes = self.codes[:, :, drop:]
        if self.fixed is not None:
            pass  # one fixed scale: nothing per token to drop
        elif self.quantized and self.kind in (GranularityKind.TOKEN, GranularityKind.GROUP):
            self.scale = self.scale[:, :, drop:]
            if self.zero is not None:
                self.zero = self.zero[:, :, drop:]
        elif self.quantized and self.kind is GranularityKind.BLOCK:
            self.scale = self.scale[:, :, drop // self.granularity.size:]
        self.offset = target

    def nbytes(self) -> int:
        if self.codes is None:
            return 0
        if not self.quantized:
            return self.codes.numel() * BASELINE_BYTES
        extra = sum(t.numel() * 4 for t in (self.scale, self.zero) if t is not None)
        return self.codes.numel() * self.codes.element_size() + extra


class _QuantizedLayerMixin:
    """Shared by the full-attention and sliding-window layers below."""

    def _setup(self, quantizer: KVQuantizer, layer_idx: int, valid: torch.Tensor | None):
        self.quantizer, self.layer_idx, self.pending_valid = quantizer, layer_idx, valid
        active = quantizer.is_active(layer_idx)
        fmt, gran, layout = quantizer.fmt, quantizer.scheme.granularity, quantizer.layout
        rope_gran = gran
        if layout.is_mla and gran.kind is GranularityKind.GROUP and gran.size > layout.mla_rope_dim:
            rope_gran = Granularity(GranularityKind.GROUP, layout.mla_rope_dim)
        k_fixed = quantizer.fixed_scale("k", layer_idx, "cpu") if active else None
        v_fixed = quantizer.fixed_scale("v", layer_idx, "cpu") if active else None
        rope_quantized = active and not (layout.is_mla and quantizer.scheme.rope_bf16)
        self.k = StoredTensor(fmt, gran, k_fixed, active)
        self.v = StoredTensor(fmt, rope_gran if layout.is_mla else gran, v_fixed, rope_quantized)

    def _store(self, key_states, value_states):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            for st in (self.k, self.v):
                if st.scale is not None:
                    st.scale = st.scale.to(key_states.device)
        valid = self.pending_valid
        if valid is not None:
            valid = valid[:, -key_states.shape[2]:].to(key_states.device).bool()
            self.pending_valid = None
        q = self.quantizer
        if self.k.quantized:
            q.check_finite("k", self.layer_idx, key_states)
        if self.v.quantized:
            q.check_finite("v", self.layer_idx, value_states)
        self.k.append(key_states, valid)
        self.v.append(value_states, valid)
        self.dtype = key_states.dtype

    def get_seq_length(self) -> int:
        return self.k.total

    def nbytes(self) -> int:
        return self.k.nbytes() + self.v.nbytes()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("the evalkit storage cache does not support cropping (assisted decoding)")

    def reorder_cache(self, beam_idx) -> None:
        raise NotImplementedError("the evalkit storage cache does not support beam search: use greedy decoding")

    batch_repeat_interleave = batch_select_indices = reorder_cache


class QuantizedLayer(_QuantizedLayerMixin, DynamicLayer):
    def __init__(self, quantizer: KVQuantizer, layer_idx: int, valid=None):
        DynamicLayer.__init__(self)
        self._setup(quantizer, layer_idx, valid)

    def update(self, key_states, value_states, *args, **kwargs):
        self._store(key_states, value_states)
        return self.k.dequantize(self.dtype), self.v.dequantize(self.dtype)


class QuantizedSlidingWindowLayer(_QuantizedLayerMixin, DynamicSlidingWindowLayer):
    def __init__(self, quantizer: KVQuantizer, layer_idx: int, sliding_window: int, valid=None):
        DynamicSlidingWindowLayer.__init__(self, sliding_window=sliding_window)
        self._setup(quantizer, layer_idx, valid)

    def update(self, key_states, value_states, *args, **kwargs):
        visible_past = min(self.k.total, self.sliding_window - 1)
        self._store(key_states, value_states)
        self.cumulative_length = self.k.total
        n = visible_past + key_states.shape[2]
        keys, values = self.k.dequantize(self.dtype)[:, :, -n:], self.v.dequantize(self.dtype)[:, :, -n:]
        self.k.drop_front(self.sliding_window - 1)
        self.v.drop_front(self.sliding_window - 1)
        return keys, values

    def get_seq_length(self) -> int:
        return self.k.total


class QuantizedKVCache(DynamicCache):
    """A DynamicCache whose attention layers store K/V through a :class:`KVQuantizer`."""

    def __init__(self, config, quantizer: KVQuantizer, attention_mask: torch.Tensor | None = None):
        super().__init__(config=config)
        valid = None
        if attention_mask is not None and not bool(attention_mask.all()):
            valid = attention_mask.bool()
        layer_types, per_layer_kwargs = get_layer_types_and_kwargs(text_config(config))
        layers = []
        for idx, (kind, kwargs) in enumerate(zip(layer_types, per_layer_kwargs)):
            if kind == "full_attention":
                layers.append(QuantizedLayer(quantizer, idx, valid))
            elif kind in ("sliding_attention", "chunked_attention"):
                layers.append(QuantizedSlidingWindowLayer(quantizer, idx, kwargs["sliding_window"], valid))
            else:  # layers without per-token K/V (linear attention, dummies) keep transformers' own cache layer
                layers.append(DYNAMIC_LAYER_TYPE_MAPPING[kind](**kwargs))
        self.layers = layers
        self.quantizer = quantizer

    def nbytes(self) -> int:
        """Exact bytes held: codes + scales (+ zero points); unquantized layers at 2 bytes per element."""
        return sum(layer.nbytes() for layer in self.layers if hasattr(layer, "nbytes"))


@contextlib.contextmanager
def quantized_cache(model, scheme, *, scale_table=None) -> Iterator[Callable[..., QuantizedKVCache]]:
    """Yield ``new_cache(attention_mask=None)`` building storage caches for ``model`` under ``scheme``.

    With ``attn=fa3`` the attention precision wrapper is installed for the block too (K/V are
    then quantized by the cache, not by the hook).
    """
    from evalkit.integration.install import quantized_kv

    with quantized_kv(model, scheme, scale_table=scale_table, kv_in_cache=True) as quantizer:
        def new_cache(attention_mask: torch.Tensor | None = None) -> QuantizedKVCache:
            return QuantizedKVCache(model.config, quantizer, attention_mask)

        yield new_cache


@contextlib.contextmanager
def mla_cache_session(model, quantizer: KVQuantizer):
    """For MLA models: give every decoder forward that brings no (or an empty, foreign) cache a storage cache."""
    if quantizer.scheme.attention.value != "kv" and not quantizer.fmt.is_identity:
        raise SchemeError("attn=fa3 is not modeled for multi-head latent attention models: drop +attn=fa3")

    def pre_hook(module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if isinstance(cache, QuantizedKVCache):
            return args, kwargs
        if cache is not None and cache.get_seq_length() > 0:
            raise SchemeError("an MLA model under quantized_kv got a pre-filled cache evalkit did not make: start from an empty cache")
        kwargs.pop("past_key_values", None)
        kwargs["cache"] = QuantizedKVCache(model.config, quantizer, kwargs.get("attention_mask"))
        kwargs["use_cache"] = True
        return args, kwargs

    # on the decoder (the module that creates the cache), so callers that run the backbone directly
    # (the perplexity eval does, to chunk the output head) are covered as well as model(...) and generate()
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    handle = decoder.register_forward_pre_hook(pre_hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
