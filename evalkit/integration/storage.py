"""The storage cache: K/V kept as real codes plus scales, read back as an engine's kernel reads them.

:class:`StorageCache` is a transformers ``DynamicCache`` whose attention layers hand what each
``cache.update(k, v, layer)`` receives to a :class:`~evalkit.integration.stored.StoredTensor` for K
and one for V (real codes and scales, kept as engines keep them: that module says how) and return
the dequantized K/V, so the prefill's own attention reads quantized K/V too, as engines that
attend from the paged cache do. ``nbytes()`` counts what an engine holds: codes, scales and zero
points (BF16 for unquantized layers). The cache keeps nothing else between forwards: the
dequantized K/V a layer returns are made for its attention and dropped after it (the layer's
``keys``/``values`` attributes stay empty for quantized layers), so the memory held is the engine's
bytes plus, while a layer attends, that one layer's K/V in the model's dtype.

Under a codec whose engine attends a first-chunk prefill from the raw K/V (``prefill_reads_raw``: vLLM
TurboQuant, UltraQuant) a sequence's first write is read raw; a later write of more than 128 tokens (a
continuation chunk of a chunked prefill, or the rest of a prompt after a prefix-cache hit) reads the
earlier tokens through their codes and its own K/V raw, and shorter writes read everything from the codes,
as vLLM's backends do (:mod:`evalkit.integration.chunked` cites them).

Sliding-window layers keep the last ``window - 1`` tokens as transformers does (whole blocks for
``block<N>``). Multi-head latent attention layers receive ``(latent, rope_key)`` through ``update``
and store exactly those; ``+rope=bf16`` keeps the RoPE key unquantized.

NaN or inf arriving in K/V sets a flag on the device; :meth:`StorageCache.check_finite` reads all
flags at once and raises naming the first layer. ``quantized_kv`` calls it after every forward that
wrote more than one token, and for one-token decode steps only when the decoding is over (no host
synchronisation inside a decode step).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

from evalkit.errors import NonFiniteKVError
from evalkit.integration.binding import BoundScheme
from evalkit.integration.chunked import continuation_reads_raw_chunk
from evalkit.integration.growing import Padding
from evalkit.integration.hf_compat import cache_layer_specs
from evalkit.integration.stored import StoredTensor, append_pair
from evalkit.kv.codec import codec_for
from evalkit.kv.memory import mla_rope_granularity
from evalkit.models.info import text_config


class _StorageLayerMixin:
    """Shared by the full-attention and sliding-window storage layers."""

    def _setup(self, binding: BoundScheme, layer_idx: int, padding: Padding):
        self.binding, self.layer_idx, self.padding = binding, layer_idx, padding
        self.active = binding.is_active(layer_idx)
        scheme, layout = binding.scheme, binding.layout
        self.k: StoredTensor | None = None
        self.v: StoredTensor | None = None
        self._rope_gran = mla_rope_granularity(scheme, layout) if layout.is_mla else scheme.granularity
        self._rope_quantized = self.active and not (layout.is_mla and scheme.rope_bf16)

    def _make_stores(self, device: torch.device) -> None:
        b, i = self.binding, self.layer_idx
        k_fixed = b.fixed_scale("k", i, device) if self.active else None
        v_fixed = b.fixed_scale("v", i, device) if self._rope_quantized else None
        self.k = StoredTensor(b.fmt, b.scheme.granularity, k_fixed, self.active, role="k")
        self.v = StoredTensor(b.fmt, self._rope_gran, v_fixed, self._rope_quantized, role="v")

    def _write(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._make_stores(key_states.device)
        padding, self.padding = self.padding, None  # the mask describes the first write only
        append_pair(self.k, self.v, key_states, value_states, padding)
        self._expose(key_states)

    def _expose(self, like: torch.Tensor) -> None:
        """transformers' ``keys``/``values`` attributes: the K/V themselves for an unquantized side,
        else empty (the stores hold codes; a dequantized copy kept here would double the memory)."""
        self.keys = self.k.read() if not self.k.quantized else like.new_empty(0)
        self.values = self.v.read() if not self.v.quantized else like.new_empty(0)

    def get_seq_length(self) -> int:
        return 0 if self.k is None else self.k.total

    def nbytes(self) -> int:
        return 0 if self.k is None else self.k.nbytes() + self.v.nbytes()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("the evalkit storage cache does not support cropping (assisted decoding)")

    def reorder_cache(self, beam_idx) -> None:
        raise NotImplementedError("the evalkit storage cache does not support beam search: use greedy decoding")

    batch_repeat_interleave = batch_select_indices = reorder_cache


def _prefill_reads_raw(binding: BoundScheme, tokens: int) -> bool:
    """Whether the engine dtype attends a sequence's first write of ``tokens`` tokens from the raw K/V (its slot
    codec: TurboQuant/UltraQuant always, Octave past 128 tokens)."""
    codec = codec_for(binding.fmt.recipe)
    return codec is not None and codec.reads_raw(tokens)


def _continuation_reads_raw(binding: BoundScheme, tokens: int) -> bool:
    """Whether a continuation chunk of ``tokens`` tokens reads its own K/V raw and the earlier tokens from the
    codes: vLLM's TurboQuant/UltraQuant ``_continuation_prefill`` (:mod:`evalkit.integration.chunked`). Octave's
    continuation is not read from its source here, so its continuation chunks read the cache, as its steps do."""
    codec = codec_for(binding.fmt.recipe)
    return codec is not None and codec.chunked_like_turboquant and continuation_reads_raw_chunk(tokens)


def _with_raw_tail(read: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
    """``read`` (the stored tokens, dequantized) with its last ``raw.shape[2]`` positions replaced by the raw
    K/V just written: vLLM's ``_continuation_prefill`` (:mod:`evalkit.integration.chunked`)."""
    return torch.cat([read[:, :, : read.shape[2] - raw.shape[2]], raw.to(read.dtype)], dim=2)


class StorageLayer(_StorageLayerMixin, DynamicLayer):
    def __init__(self, binding: BoundScheme, layer_idx: int, padding: Padding):
        DynamicLayer.__init__(self)
        self._setup(binding, layer_idx, padding)

    def update(self, key_states, value_states, *args, **kwargs):
        first = self.k is None or self.k.total == 0
        self._write(key_states, value_states)
        if first and self.active and _prefill_reads_raw(self.binding, key_states.shape[2]):
            self.k.read(), self.v.read()  # (drop the first write's values: attention reads the raw K/V)
            return key_states, value_states  # vLLM TurboQuant/UltraQuant: a first-chunk prefill attends raw K/V
        if not first and self.active and _continuation_reads_raw(self.binding, key_states.shape[2]):
            return _with_raw_tail(self.k.read(), key_states), _with_raw_tail(self.v.read(), value_states)
        return self.k.read(), self.v.read()


class SlidingStorageLayer(_StorageLayerMixin, DynamicSlidingWindowLayer):
    def __init__(self, binding: BoundScheme, layer_idx: int, sliding_window: int, padding: Padding):
        DynamicSlidingWindowLayer.__init__(self, sliding_window=sliding_window)
        self._setup(binding, layer_idx, padding)

    def update(self, key_states, value_states, *args, **kwargs):
        visible_past = 0 if self.k is None else min(self.k.total, self.sliding_window - 1)
        first = visible_past == 0 and (self.k is None or self.k.total == 0)
        self._write(key_states, value_states)
        self.cumulative_length = self.k.total
        n = visible_past + key_states.shape[2]
        keys, values = self.k.read()[:, :, -n:], self.v.read()[:, :, -n:]
        if first and self.active and _prefill_reads_raw(self.binding, key_states.shape[2]):
            keys, values = key_states, value_states  # a first-chunk prefill attends raw K/V (TurboQuant/UltraQuant)
        elif not first and self.active and _continuation_reads_raw(self.binding, key_states.shape[2]):
            keys, values = _with_raw_tail(keys, key_states), _with_raw_tail(values, value_states)
        self.k.drop_front(self.sliding_window - 1)
        self.v.drop_front(self.sliding_window - 1)
        self._expose(key_states)
        return keys, values


class StorageCache(DynamicCache):
    """A DynamicCache whose attention layers store K/V under a :class:`BoundScheme`."""

    def __init__(self, config, binding: BoundScheme, attention_mask: torch.Tensor | None = None):
        super().__init__(config=config)
        padding = Padding(attention_mask)
        layers = []
        for idx, (kind, kwargs) in enumerate(cache_layer_specs(text_config(config))):
            if kind == "full_attention":
                layers.append(StorageLayer(binding, idx, padding))
            elif kind in ("sliding_attention", "chunked_attention"):
                layers.append(SlidingStorageLayer(binding, idx, kwargs["sliding_window"], padding))
            else:  # layers without per-token K/V (linear attention, dummies) keep transformers' own cache layer
                layers.append(DYNAMIC_LAYER_TYPE_MAPPING[kind](**kwargs))
        self.layers = layers
        self.binding = binding

    def storage_layers(self) -> list[_StorageLayerMixin]:
        return [layer for layer in self.layers if isinstance(layer, _StorageLayerMixin)]

    def nbytes(self) -> int:
        """Exact bytes held: codes + scales (+ zero points); unquantized layers at 2 bytes per element."""
        return sum(layer.nbytes() for layer in self.storage_layers())

    def check_finite(self) -> None:
        """Raise :class:`NonFiniteKVError` naming the first layer whose K or V held NaN or inf (one device read)."""
        stores = [
            (layer.layer_idx, which, st)
            for layer in self.storage_layers()
            if layer.k is not None
            for which, st in (("K", layer.k), ("V", layer.v))
            if st.nonfinite is not None
        ]
        if not stores or not bool(torch.stack([st.nonfinite for _, _, st in stores]).any()):
            return
        layer_idx, which, st = next((i, w, st) for i, w, st in stores if bool(st.nonfinite))
        which = "K or V" if st.shares_flag else which  # one flag for both sides (stored.append_pair)
        raise NonFiniteKVError(
            f"layer {layer_idx} {which} contains NaN or inf before quantization: the model's activations overflowed "
            "(load it in float32 or bfloat16 rather than float16)"
        )
