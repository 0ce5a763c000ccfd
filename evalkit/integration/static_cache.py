"""The storage cache with static shapes: what a compiled decode step (CUDA graphs) needs.

:class:`StaticStorageCache` keeps the same bytes as :class:`~evalkit.integration.storage.StorageCache`
(codes, scales and zero points as engines keep them, nothing else), but in buffers allocated once for
the run's longest sequence (``max_len`` tokens), written in place at each token's position, so every
decode step has the same shapes and touches the same memory: it can be captured and replayed. Like
transformers' own ``StaticCache``, each layer hands attention all ``max_len`` positions (those not
written yet are masked, and hold zero codes), and its length is a device tensor, never a Python
number that would change between steps.

A sequence's first write (its prefill, eager) is stored by the dynamic store itself
(:class:`~evalkit.integration.stored.StoredTensor`: padding, per-sequence scales and block starts,
exactly as there) and copied into the buffers. Every later write is one token per sequence, made
with tensor ops only:

* unquantized layers copy the token; fixed (static/unit) and frozen (dynamic tensor/head, taken at
  the first write) scales quantize it with that scale; per-token and per-group scales and the engine
  codecs quantize it alone (NVFP4 under its frozen per-tensor scale), as the dynamic store does;
* ``block<N>``: the open block of each sequence is re-encoded from its tokens as they arrived, kept
  in a ring of N float32 slots per sequence and head (slot = (position - start) mod N), with the
  stale slots masked out of the scale: the same scale and codes as the dynamic store's re-encode.

Reading dequantizes all ``max_len`` positions through the same function as the dynamic store
(:func:`~evalkit.integration.stored_read.read_stored`), into a new tensor the layer does not keep.
NaN or inf sets a device flag in place, read by :meth:`StaticStorageCache.check_finite` once the
decoding is over.

Not covered (refused in one line): sliding-window and other non-full-attention layers (transformers'
static sliding layers roll a window buffer that the stores would have to follow), a second write of
more than one token (chunked prefill), and beam search.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from evalkit.errors import NonFiniteKVError, SchemeError
from evalkit.integration.binding import BoundScheme
from evalkit.integration.growing import Padding
from evalkit.integration.hf_compat import cache_layer_specs
from evalkit.integration.stored import StoredTensor
from evalkit.integration.stored_read import read_stored
from evalkit.kv.codec import is_codec
from evalkit.kv.memory import mla_rope_granularity
from evalkit.kv.quantize import encode_quantized, quantize
from evalkit.kv.scheme import GranularityKind
from evalkit.models.info import text_config


def _static(t: torch.Tensor) -> torch.Tensor:
    """Mark a buffer as living at a fixed address (CUDA graphs replay in place over it)."""
    if not torch.compiler.is_compiling():
        torch._dynamo.mark_static_address(t)
    return t


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """Float8 buffers as their bytes (index_copy_ and scatter_ have no float8 kernels on the CPU)."""
    return t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz) else t


def _buffer_like(part: torch.Tensor, length: int) -> torch.Tensor:
    """A zero buffer shaped like ``part`` (B, H, S, ...) but ``length`` long, with ``part`` copied in front."""
    out = part.new_zeros(*part.shape[:2], length, *part.shape[3:])
    out[:, :, : part.shape[2]] = part
    return _static(out)


class StaticStoredTensor:
    """One of a layer's K or V (or MLA latent / RoPE key) in buffers of ``max_len`` tokens."""

    def __init__(self, first: StoredTensor, x: torch.Tensor, max_len: int):
        """Take over ``first``, a dynamic store that has just stored ``x`` (the sequence's first write)."""
        self.fmt, self.granularity, self.quantized, self.role = (
            first.fmt,
            first.granularity,
            first.quantized,
            first.role,
        )
        self.fixed, self.dtype, self.dim = first.fixed, first.dtype, first.dim
        self.cast = first.cast  # an unscaled 16-bit cache's dtype (bf16, fp16), None for auto
        self.kind = first.kind
        self.per_token = first.per_token
        self.max_len = max_len
        written = x.shape[2]
        if written > max_len:
            raise SchemeError(f"the first write holds {written} tokens, more than the static cache's {max_len}")
        device = x.device
        self.length = _static(torch.tensor(written, dtype=torch.long, device=device))
        self.nonfinite = _static(torch.zeros((), dtype=torch.bool, device=device))
        if first.nonfinite is not None:
            self.nonfinite |= first.nonfinite
        self.block = self.quantized and self.fixed is None and self.kind is GranularityKind.BLOCK
        n = self.granularity.size if self.block else 0
        self.alloc = max_len + n  # a block's re-encode writes all N of its positions
        self.raw = self.codes = self.token_scale = self.token_zero = None
        self.scale, self.zero, self.tensor_scale = first.scale, first.zero, first.tensor_scale
        if not self.quantized:
            self.raw = _buffer_like(x if self.cast is None else x.to(self.cast), self.alloc)
            return
        self.codes = _buffer_like(first.codes, self.alloc)
        if self.per_token:
            self.token_scale = _buffer_like(first.scale, self.alloc)
            self.token_zero = None if first.zero is None else _buffer_like(first.zero, self.alloc)
        if self.block:
            self._take_blocks(first, x, n)

    def _take_blocks(self, first: StoredTensor, x: torch.Tensor, n: int) -> None:
        b, h, _, d = x.shape
        device = x.device
        starts = torch.tensor(first.starts or [0] * b, dtype=torch.long, device=device)
        self.starts = _static(starts)
        blocks = -(-self.alloc // n) + 1
        self.scale = _static(first.scale.new_ones(b, h, blocks))
        self.scale[:, :, : first.scale.shape[2]] = first.scale
        pos = torch.arange(self.alloc, device=device)
        self.block_index = _static(((pos[None, :] - starts[:, None]).clamp(min=0) // n)[:, None, :].expand(b, h, -1))
        # the ring of the open blocks' tokens as they arrived: slot (position - start) mod N
        written = x.shape[2]
        self.ring = _static(torch.zeros(b, h, n, d, dtype=torch.float32, device=device))
        open_start = starts + (written - starts).clamp(min=0) // n * n  # where each sequence's open block begins
        for j in range(n):
            at = open_start + j
            keep = at < written
            src = x.float()[torch.arange(b, device=device), :, at.clamp(max=written - 1)]  # (B, H, D)
            self.ring[:, :, j] = torch.where(keep[:, None, None], src, self.ring[:, :, j])
        self.slots = torch.arange(n, device=device)

    # -- writing one token -------------------------------------------------------------------------
    def write_token(self, x: torch.Tensor) -> None:
        """Store one token per sequence, ``x`` (B, H, 1, D), at position ``length``; tensor ops only."""
        at = self.length.view(1)
        if not self.quantized:
            self.raw.index_copy_(2, at, x if self.cast is None else x.to(self.cast))
        elif self.block:
            self._write_block(x)
        else:
            if self.fixed is not None:
                q = quantize(x, self.fmt, self.granularity, scale=self.fixed)
            elif self.per_token:
                q = quantize(x, self.fmt, self.granularity, tensor_scale=self.tensor_scale, **self._role())
            else:  # tensor / head: the scale frozen at the first write
                q = quantize(x, self.fmt, self.granularity, scale=self.scale, zero=self.zero)
            _bytes(self.codes).index_copy_(2, at, _bytes(encode_quantized(q, self.fmt)))
            if self.per_token:
                self.token_scale.index_copy_(2, at, q.scale)
                if self.token_zero is not None:
                    self.token_zero.index_copy_(2, at, q.zero)
            self.nonfinite.logical_or_(q.nonfinite)
        self.length.add_(1)

    def _role(self) -> dict:
        return {"role": self.role} if is_codec(self.fmt.recipe) else {}

    def _write_block(self, x: torch.Tensor) -> None:
        b, h, _, d = x.shape
        n = self.granularity.size
        rel = self.length - self.starts  # (B,): the new token's place after its sequence's first token
        slot, block = rel % n, rel // n
        self.ring.scatter_(2, slot.view(b, 1, 1, 1).expand(b, h, 1, d), x.float())
        valid = self.slots[None, :] <= slot[:, None]  # (B, N): the open block's tokens so far
        q = quantize(self.ring, self.fmt, self.granularity, valid=valid)
        where = (self.starts + block * n)[:, None] + self.slots[None, :]  # (B, N) positions of the block
        codes = encode_quantized(q, self.fmt)
        _bytes(self.codes).scatter_(2, where.view(b, 1, n, 1).expand(b, h, n, codes.shape[-1]), _bytes(codes))
        self.scale.scatter_(2, block.view(b, 1, 1).expand(b, h, 1), q.scale.reshape(b, h, 1))
        self.nonfinite.logical_or_(q.nonfinite)

    # -- reading ------------------------------------------------------------------------------------
    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """All ``max_len`` positions as attention reads them (positions not written yet hold zero codes)."""
        if not self.quantized:
            raw = self.raw[:, :, : self.max_len]
            return raw if self.cast is None else raw.to(dtype or self.dtype)
        codes = self.codes[:, :, : self.max_len]
        if self.fixed is not None:
            scale, zero = self.fixed, None
        elif self.per_token:
            scale = self.token_scale[:, :, : self.max_len]
            zero = None if self.token_zero is None else self.token_zero[:, :, : self.max_len]
        elif self.block:
            scale, zero = self.scale.gather(2, self.block_index[:, :, : self.max_len]), None
        else:
            scale, zero = self.scale, self.zero
        return read_stored(codes, self.fmt, self.granularity, scale, zero, dtype or self.dtype, self.role, self.dim)

    def nbytes_at(self, tokens: int) -> int:
        """Engine bytes of the first ``tokens`` positions (as :meth:`StoredTensor.nbytes` counts them)."""
        from evalkit.kv.memory import BASELINE_BYTES, SCALE_BYTES

        if not self.quantized:
            return self.raw[:, :, :tokens].numel() * BASELINE_BYTES
        data = self.codes[:, :, :tokens].numel() * self.codes.element_size()
        if self.fixed is not None:
            return data + self.fixed.numel() * SCALE_BYTES
        if self.per_token:
            scales = self.token_scale[:, :, :tokens].numel() * self.fmt.scale_nbytes
            zeros = 0 if self.token_zero is None else self.token_zero[:, :, :tokens].numel() * SCALE_BYTES
        elif self.block:
            n = self.granularity.size
            per_row = [-(-(tokens - int(s)) // n) for s in self.starts.tolist()]
            scales = sum(per_row) * self.scale.shape[1] * self.fmt.scale_nbytes
            zeros = 0
        else:
            scales = self.scale.numel() * self.fmt.scale_nbytes
            zeros = 0 if self.zero is None else self.zero.numel() * SCALE_BYTES
        tensor = 0 if self.tensor_scale is None else self.tensor_scale.numel() * SCALE_BYTES
        return data + scales + zeros + tensor

    def held_bytes(self) -> int:
        """Everything this store allocates: buffers of ``max_len`` (+ N) tokens, scales, the block ring."""
        parts = (self.raw, self.codes, self.token_scale, self.token_zero, self.scale, self.zero, self.tensor_scale)
        parts += (getattr(self, "ring", None), getattr(self, "block_index", None), self.fixed)
        seen, total = set(), 0
        for t in parts:
            if t is not None and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                total += t.untyped_storage().nbytes()
        return total


class StaticStorageLayer(DynamicLayer):
    """One full-attention layer of a :class:`StaticStorageCache`."""

    is_compileable = True
    is_sliding = False

    def __init__(self, binding: BoundScheme, layer_idx: int, padding: Padding, max_len: int):
        super().__init__()
        self.binding, self.layer_idx, self.padding, self.max_len = binding, layer_idx, padding, max_len
        self.active = binding.is_active(layer_idx)
        layout = binding.layout
        self._rope_gran = mla_rope_granularity(binding.scheme, layout) if layout.is_mla else binding.scheme.granularity
        self._rope_quantized = self.active and not (layout.is_mla and binding.scheme.rope_bf16)
        self.k: StaticStoredTensor | None = None
        self.v: StaticStoredTensor | None = None

    def update(self, key_states, value_states, *args, **kwargs):
        if self.k is None:
            return self._first(key_states, value_states)
        if key_states.shape[2] != 1:
            raise SchemeError(
                "a static storage cache takes one token per step after the first write: "
                "decode token by token (or use the dynamic cache for chunked prefill)"
            )
        self.k.write_token(key_states)
        self.v.write_token(value_states)
        return self.k.read(), self.v.read()

    def _first(self, key_states: torch.Tensor, value_states: torch.Tensor):
        from evalkit.integration.storage import _prefill_reads_raw

        self.lazy_initialization(key_states, value_states)
        b, i, device = self.binding, self.layer_idx, key_states.device
        k_fixed = b.fixed_scale("k", i, device) if self.active else None
        v_fixed = b.fixed_scale("v", i, device) if self._rope_quantized else None
        k = StoredTensor(b.fmt, b.scheme.granularity, k_fixed, self.active, role="k")
        v = StoredTensor(b.fmt, self._rope_gran, v_fixed, self._rope_quantized, role="v")
        padding, self.padding = self.padding, None
        k.append(key_states, padding)
        v.append(value_states, padding)
        k.read(), v.read()  # the first write's own values are not needed: attention reads all positions
        self.k = StaticStoredTensor(k, key_states, self.max_len)
        self.v = StaticStoredTensor(v, value_states, self.max_len)
        if self.active and _prefill_reads_raw(b, key_states.shape[2]):  # TurboQuant/UltraQuant (Octave past 128)
            return _padded(key_states, self.max_len), _padded(value_states, self.max_len)
        return self.k.read(), self.v.read()

    def get_seq_length(self):
        return 0 if self.k is None else self.k.length

    def get_mask_sizes(self, *args, **kwargs) -> tuple[int, int]:
        return self.max_len, 0

    def get_max_length(self) -> int:
        return self.max_len

    def nbytes(self) -> int:
        if self.k is None:
            return 0
        tokens = int(self.k.length)
        return self.k.nbytes_at(tokens) + self.v.nbytes_at(tokens)

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("the evalkit storage cache does not support cropping (assisted decoding)")

    def reorder_cache(self, beam_idx) -> None:
        raise NotImplementedError("the evalkit storage cache does not support beam search: use greedy decoding")

    batch_repeat_interleave = batch_select_indices = reorder_cache


def _padded(x: torch.Tensor, length: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, 0, 0, length - x.shape[2]))


class StaticStorageCache(DynamicCache):
    """A storage cache of ``max_len`` tokens per sequence, every layer a :class:`StaticStorageLayer`."""

    def __init__(self, config, binding: BoundScheme, max_len: int, attention_mask: torch.Tensor | None = None):
        super().__init__(config=config)
        specs = cache_layer_specs(text_config(config))
        other = sorted({kind for kind, _ in specs if kind != "full_attention"})
        if other:
            raise SchemeError(
                f"the static (compiled) decode path takes full-attention layers only; this model has {', '.join(other)} "
                "layers: decode it on the dynamic path (--decode-path eager)"
            )
        padding = Padding(attention_mask)
        self.layers = [StaticStorageLayer(binding, i, padding, max_len) for i in range(len(specs))]
        self.binding, self.max_len = binding, max_len

    @property
    def is_compileable(self) -> bool:
        return True

    def storage_layers(self) -> list[StaticStorageLayer]:
        return list(self.layers)

    def nbytes(self) -> int:
        """Engine bytes of the tokens written so far (one device read)."""
        return sum(layer.nbytes() for layer in self.layers)

    def held_bytes(self) -> int:
        """Bytes allocated for the whole ``max_len``: what a preallocated engine pool holds."""
        return sum(st.held_bytes() for layer in self.layers if layer.k is not None for st in (layer.k, layer.v))

    def check_finite(self) -> None:
        """Raise :class:`NonFiniteKVError` naming the first layer whose K or V held NaN or inf (one device read)."""
        layers = [layer for layer in self.layers if layer.k is not None]
        if not layers:
            return
        flags = torch.stack([torch.stack([layer.k.nonfinite, layer.v.nonfinite]) for layer in layers]).cpu()
        if not bool(flags.any()):
            return
        i, side = (int(v) for v in flags.nonzero()[0])
        raise NonFiniteKVError(
            f"layer {layers[i].layer_idx} {'KV'[side]} contains NaN or inf before quantization: the model's "
            "activations overflowed (load it in float32 or bfloat16 rather than float16)"
        )
