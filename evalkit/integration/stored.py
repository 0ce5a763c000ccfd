"""One layer's K or V (or MLA latent / RoPE key) as an engine stores it: codes, scales and zero
points, and nothing else.

:class:`StoredTensor` writes what :func:`evalkit.kv.quantize.quantize` makes of each new piece of
K/V: 1-byte codes (float8, int8; 4-bit codes packed two per byte), scales and zero points, all on
the device of the K/V they store. It keeps no full-precision copy: :meth:`StoredTensor.read`
dequantizes the stored bytes for attention each time it is asked (what an FP8 attention kernel does
on the fly), into a tensor the caller drops after the layer's attention, so a model holds the
engine's bytes plus one layer's K/V in the model's dtype at a time. A sequence's first write hands
attention the quantizer's own dequantized values instead of decoding them again: the same bits
(tests hold ``read()`` equal to them for every format and codec), without a second pass. Since
codes grow in place (:class:`~evalkit.integration.growing.GrowingTensor`), a decode step encodes
and copies only its new token; the codes hold at most 256 tokens (or an eighth) of growth room.
``nbytes()`` counts what an engine holds; ``held_bytes()`` what this process holds.

Scales evolve as engines keep them, per sequence (a result never depends on its batch-mates):

* ``tensor`` / ``head``, dynamic: from each sequence's first write (its prefill; padding left
  out), then frozen; later tokens beyond that range saturate. Static and unit scales never change.
* ``block<N>``: one scale per N tokens per KV head, blocks counted from each sequence's own first
  real token (a paged cache is per sequence); a block's stored codes and scale are always a one-shot
  encode of the tokens it holds (:mod:`~evalkit.integration.stored_blocks`: how an open block grows,
  and why no engine's scheme has dynamic block scales).
* ``token`` / ``group<N>``: per token, so a token's codes never depend on other tokens; NVFP4's
  per-tensor FP32 scale is taken from each sequence's first write and then frozen, like a
  dynamic ``tensor`` scale.

Sliding windows drop whole tokens from the front (whole blocks for ``block<N>``). NaN or inf
arriving in K/V sets a flag on the device instead of raising (no host synchronisation per layer).

What attention reads of the stored bytes is :mod:`~evalkit.integration.stored_read`.
"""

from __future__ import annotations

import torch

from evalkit.integration.growing import GrowingTensor, Padding
from evalkit.integration.stored_blocks import BlockScales
from evalkit.integration.stored_read import read_stored
from evalkit.kv.codec import codec_for, is_codec
from evalkit.kv.formats import KVFormat
from evalkit.kv.memory import BASELINE_BYTES, SCALE_BYTES
from evalkit.kv.quantize import dequantize, encode_quantized, quantize
from evalkit.kv.scheme import Granularity, GranularityKind

# Dynamic scales are kept here as float32 factors but counted at their storage dtype (fmt.scale_nbytes:
# e4m3/e8m0 = 1 byte); zero points, static/unit scales and NVFP4's per-tensor scale count SCALE_BYTES.


class StoredTensor(BlockScales):
    """One of a layer's K or V (or MLA latent / RoPE key): codes, scales and zero points; attention
    reads them dequantized (:meth:`read`)."""

    def __init__(
        self,
        fmt: KVFormat,
        granularity: Granularity,
        fixed_scale: torch.Tensor | None,
        quantized: bool,
        role: str = "k",
    ):
        self.fmt, self.granularity, self.quantized = fmt, granularity, quantized
        self.role = role  # "k" or "v": the vLLM rotation dtypes store the two differently (kv.codecs)
        self._role = {"role": role} if is_codec(fmt.recipe) else {}  # passed to quantize() for those only
        self.fixed = fixed_scale  # static or unit scale: one per layer (or per head), never changes
        self._codes = GrowingTensor()  # stored bytes (B, H, S, D * bits / 8)
        self._fresh: torch.Tensor | None = None  # a first write's dequantized values, until read() hands them out
        self.dtype: torch.dtype | None = None  # the K/V's dtype: what read() returns
        self.dim: int | None = None  # head_dim (or the MLA part's width)
        self._raw: torch.Tensor | None = None  # unquantized: the K/V as given, concatenated as DynamicCache does
        # an unscaled 16-bit cache (bf16, fp16): the unquantized K/V are kept in its dtype (auto: None)
        self.cast = fmt.torch_dtype if fmt.is_unscaled else None
        self._token_scale, self._token_zero = GrowingTensor(), GrowingTensor()  # token / group granularity
        self._scale: torch.Tensor | None = None  # tensor / head (frozen) and block scales
        self._zero: torch.Tensor | None = None
        self.starts: list[int] | None = None  # per-sequence first real position (block alignment)
        self.offset = 0  # absolute position of the first stored token (sliding windows drop the front)
        self.block_base = 0  # block scales dropped from the front
        self.total = 0  # tokens written so far
        self.nonfinite: torch.Tensor | None = None
        self.tensor_scale: torch.Tensor | None = None  # NVFP4: per-sequence FP32 scale from the first write, frozen
        self._tail: torch.Tensor | None = None  # dynamic blocks: the last (at most N - 1) tokens as they arrived
        self.shares_flag = False  # written with its layer's other side in one call (append_pair): one NaN flag

    @property
    def kind(self) -> GranularityKind:
        return self.granularity.kind

    @property
    def codes(self) -> torch.Tensor | None:
        return self._codes.data

    @property
    def values(self) -> torch.Tensor | None:
        """What attention reads (:meth:`read`): the stored bytes dequantized to the K/V's dtype, or
        for an unquantized layer the K/V themselves. Each access decodes afresh."""
        return self.read()

    @property
    def empty(self) -> bool:
        return (self._raw if not self.quantized else self._codes.data) is None

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        """What attention reads, in ``dtype`` (default: the K/V's own): the stored bytes dequantized
        (a new tensor: nothing of it is kept), or the K/V themselves for an unquantized layer. Right
        after a sequence's first write, the quantizer's own dequantized values (the same bits)."""
        if not self.quantized:
            if self.cast is None or self._raw is None:
                return self._raw
            return self._raw.to(dtype or self.dtype)
        if self.empty:
            return None
        fresh, self._fresh = self._fresh, None
        if fresh is not None and (dtype is None or fresh.dtype == dtype):
            return fresh
        return self.decoded(dtype or self.dtype)

    @property
    def per_token(self) -> bool:
        return self.fixed is None and self.kind in (GranularityKind.TOKEN, GranularityKind.GROUP)

    @property
    def scale(self) -> torch.Tensor | None:
        return self._token_scale.data if self.per_token else self._scale

    @scale.setter
    def scale(self, value: torch.Tensor | None) -> None:
        self._scale = value

    @property
    def zero(self) -> torch.Tensor | None:
        return self._token_zero.data if self.per_token else self._zero

    @zero.setter
    def zero(self, value: torch.Tensor | None) -> None:
        self._zero = value

    def _flag(self, nonfinite: torch.Tensor) -> None:
        self.nonfinite = nonfinite if self.nonfinite is None else self.nonfinite | nonfinite

    @staticmethod
    def _cat(old: torch.Tensor | None, new: torch.Tensor, dim: int = 2) -> torch.Tensor:
        return new if old is None else torch.cat([old, new], dim=dim)

    def _arrival(self, x: torch.Tensor, padding: Padding | None) -> torch.Tensor | None:
        """The valid mask of the new tokens (None: none padded); a first write also records ``starts``."""
        if padding is None or padding.valid is None:
            return None
        self.starts = [max(0, st - (padding.valid.shape[1] - x.shape[2])) for st in padding.starts]
        return padding.valid[:, -x.shape[2] :].to(x.device)

    def append(self, x: torch.Tensor, padding: Padding | None = None) -> None:
        """Store the new tokens ``x`` (B, H, s, D); ``padding`` is given with a sequence's first write only."""
        valid = self._arrival(x, padding)
        self.dtype, self.dim = x.dtype, x.shape[-1]
        if not self.quantized:
            self._raw = self._cat(self._raw, x if self.cast is None else x.to(self.cast))
        elif self.fixed is not None:
            self._store(
                quantize(x, self.fmt, self.granularity, scale=self.fixed, valid=valid), x.dtype, per_token=False
            )
        elif self.kind is GranularityKind.BLOCK:
            self._append_blocks(x, valid)
        elif self.kind in (GranularityKind.TOKEN, GranularityKind.GROUP):
            q = quantize(x, self.fmt, self.granularity, valid=valid, tensor_scale=self.tensor_scale, **self._role)
            self.tensor_scale = q.tensor_scale  # None unless NVFP4; then the first write's, passed back unchanged
            self._store(q, x.dtype, per_token=True)
        elif self.scale is None:  # tensor / head: the first write sets the scale, frozen from then on
            q = quantize(x, self.fmt, self.granularity, valid=valid)
            self.scale, self.zero = q.scale, q.zero
            self._store(q, x.dtype, per_token=False)
        else:
            self._store(
                quantize(x, self.fmt, self.granularity, scale=self.scale, zero=self.zero), x.dtype, per_token=False
            )
        self.total += x.shape[2]

    def _store(self, q, dtype: torch.dtype, per_token: bool) -> None:
        first = self.total == 0  # a first write hands attention the quantizer's own values (read())
        values = dequantize(q, dtype) if first else None
        self._store_parts(encode_quantized(q, self.fmt), values, q.scale, q.zero, q.nonfinite, per_token)

    def _store_parts(self, codes, values, scale, zero, nonfinite, per_token: bool) -> None:
        """Append codes (and per-token scales); ``values``: the dequantized new tokens when they are
        all that is stored (a first write), kept for the next :meth:`read` only."""
        self._codes.append(codes)
        self._fresh = values if self._codes.length == codes.shape[2] else None
        if per_token:
            self._token_scale.append(scale)
            if zero is not None:
                self._token_zero.append(zero)
        self._flag(nonfinite)

    # -- reading and bookkeeping ----------------------------------------------------------------
    def decoded(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The stored bytes dequantized afresh, in ``dtype`` (float32 unless asked; :meth:`read` asks for the K/V's)."""
        if not self.quantized:
            return self._raw.to(dtype)
        if self.fixed is not None:
            return read_stored(self.codes, self.fmt, self.granularity, self.fixed, None, dtype, self.role, self.dim)
        scale = self.scale
        if self.kind is GranularityKind.BLOCK:  # one scale per position, from its block
            n = self.granularity.size
            pos = torch.arange(self.offset, self.offset + self.codes.shape[2], device=self.codes.device)
            idx = ((pos[None, :] - self._starts_tensor()[:, None]).clamp(min=0) // n - self.block_base).clamp(min=0)
            scale = scale.gather(2, idx[:, None, :].expand(-1, self.codes.shape[1], -1))
        return read_stored(self.codes, self.fmt, self.granularity, scale, self.zero, dtype, self.role, self.dim)

    def _starts_tensor(self) -> torch.Tensor:
        key = tuple(self.starts or [0] * self.codes.shape[0])
        if getattr(self, "_starts_cache", (None,))[0] != key:  # made once per sequence layout, not per read
            self._starts_cache = (key, torch.tensor(key, device=self.codes.device))
        return self._starts_cache[1]

    def drop_front(self, keep: int) -> None:
        """Keep the last ``keep`` tokens (whole blocks for block scales)."""
        target = self.total - keep
        if self.quantized and self.fixed is None and self.kind is GranularityKind.BLOCK:
            n = self.granularity.size
            target = min(st + max(target - st, 0) // n * n for st in self.starts)
        drop = target - self.offset
        if drop <= 0:
            return
        if not self.quantized:
            self._raw = self._raw[:, :, drop:]
        else:
            self._fresh = None
            self._codes.drop_front(drop)
            if self.per_token:
                self._token_scale.drop_front(drop)
                if self._token_zero.buffer is not None:
                    self._token_zero.drop_front(drop)
            elif self.fixed is None and self.kind is GranularityKind.BLOCK and len(set(self.starts)) == 1:
                whole = (target - self.starts[0]) // self.granularity.size - self.block_base
                self.scale, self.block_base = self.scale[:, :, whole:], self.block_base + whole
        self.offset = target

    def held_bytes(self) -> int:
        """Bytes this process keeps for it between forwards: the allocated codes, scales, zero points
        and open-block tail (or, unquantized, the K/V), never a dequantized copy."""
        if self.empty:
            return 0
        if not self.quantized:
            return self._raw.numel() * self._raw.element_size()
        held = sum(g.allocated_bytes() for g in (self._codes, self._token_scale, self._token_zero))
        kept = (self._scale, self._zero, self.fixed, self._tail, self.tensor_scale)
        return held + sum(t.numel() * t.element_size() for t in kept if t is not None)

    def nbytes(self) -> int:
        if self.empty:
            return 0
        if not self.quantized:
            return self._raw.numel() * BASELINE_BYTES
        extra = 0
        if self.fixed is not None:
            extra = self.fixed.numel() * SCALE_BYTES
        else:
            extra = sum(
                t.numel() * n
                for t, n in (
                    (self.scale, self.fmt.scale_nbytes),
                    (self.zero, SCALE_BYTES),
                    (self.tensor_scale, SCALE_BYTES),
                )
                if t is not None
            )
        return self.codes.numel() * self.codes.element_size() + extra


def _joinable(k: StoredTensor, v: StoredTensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether a layer's K and V store by the same row-wise arithmetic, so one quantize call does both."""
    if not (k.quantized and v.quantized and k.per_token and v.per_token):
        return False
    if k.fmt != v.fmt or k.granularity != v.granularity or key.shape != value.shape or key.dtype != value.dtype:
        return False
    if (k.tensor_scale is None) != (v.tensor_scale is None):
        return False
    codec = codec_for(k.fmt.recipe)
    return codec is None or codec.roles_alike


def append_pair(k: StoredTensor, v: StoredTensor, key: torch.Tensor, value: torch.Tensor, padding: Padding | None):
    """Store a layer's new K and V (B, H, s, D) in ``k`` and ``v``.

    Where both sides are per-token (or per-group) dynamic stores of one format and shape, and the
    format treats K and V alike, K and V go through one quantize call on the two stacked along the
    batch: every such scale (and NVFP4's per-sequence FP32 scale, one per batch row) is computed
    within a row, so each half is bit for bit what its own call gives (tested), for half the torch
    calls of a decode step's store. The two then share one NaN flag (:attr:`StoredTensor.shares_flag`).
    Otherwise each side is appended on its own."""
    if not _joinable(k, v, key, value):
        k.append(key, padding)
        v.append(value, padding)
        return
    valid = k._arrival(key, padding)
    v._arrival(value, padding)
    n = key.shape[0]
    both_scale = None if k.tensor_scale is None else torch.cat([k.tensor_scale, v.tensor_scale])
    q = quantize(
        torch.cat([key, value]),
        k.fmt,
        k.granularity,
        valid=None if valid is None else torch.cat([valid, valid]),
        tensor_scale=both_scale,
        **k._role,
    )
    first = k.total == 0 and v.total == 0
    codes, values = encode_quantized(q, k.fmt), dequantize(q, key.dtype) if first else None
    for store, rows in ((k, slice(0, n)), (v, slice(n, 2 * n))):
        zero = None if q.zero is None else q.zero[rows]
        store.dtype, store.dim = key.dtype, key.shape[-1]
        store._store_parts(
            codes[rows], None if values is None else values[rows], q.scale[rows], zero, q.nonfinite, per_token=True
        )
        store.tensor_scale = None if q.tensor_scale is None else q.tensor_scale[rows]
        store.shares_flag = True
        store.total += key.shape[2]
