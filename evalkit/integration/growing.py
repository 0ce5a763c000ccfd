"""The two storage primitives under :class:`~evalkit.integration.stored.StoredTensor`, kept apart
from its quantization logic: :class:`Padding`, which positions of a batch's first write are real (from
its attention mask, read once; where each sequence's blocks begin), and :class:`GrowingTensor`, a
tensor that grows along the token dimension in place, so that a decode step copies only its new
token. Neither quantizes anything. Both caches read a batch's padding through :class:`Padding`
(:mod:`evalkit.integration.storage`, :mod:`evalkit.integration.static_cache`); the storage cache's
codes, per-token scales and zero points grow in :class:`GrowingTensor`.
"""

from __future__ import annotations

import torch

from evalkit.errors import SchemeError


class Padding:
    """Which positions of a batch's first write are real, from its 2-D attention mask (read once).

    Padding must be on one side of each sequence. ``starts[b]`` is sequence b's first real position
    (left padding), where its blocks begin; ``valid`` (B, S) is None when nothing is padded."""

    def __init__(self, attention_mask: torch.Tensor | None):
        self.valid, self.starts = None, None
        if attention_mask is None or attention_mask.dim() != 2:
            return
        mask = attention_mask.bool()
        if bool(mask.all()):
            return
        real = mask.sum(-1)
        first = mask.long().argmax(-1)  # 0 for a row without real tokens
        pos = torch.arange(mask.shape[1], device=mask.device)
        expected = (pos >= first[:, None]) & (pos < (first + real)[:, None])
        if not bool((expected == mask).all()):
            raise SchemeError("padding inside a sequence is not supported: pad on one side only")
        self.valid, self.starts = mask, [int(v) for v in first.tolist()]


class GrowingTensor:
    """A tensor that grows along the token dimension (dim 2) in place: appends cost the new tokens
    only, not a copy of everything stored so far. The first append adopts its tensor as it is (a
    single forward reads exactly what was written, with no copy); later growth reserves at least
    ``CHUNK`` tokens (or an eighth of what is held), so at most that much stays allocated and unused."""

    CHUNK = 256

    def __init__(self):
        self.buffer: torch.Tensor | None = None
        self.length = 0

    @property
    def data(self) -> torch.Tensor | None:
        return None if self.buffer is None else self.buffer[:, :, : self.length]

    def append(self, new: torch.Tensor) -> None:
        need = self.length + new.shape[2]
        fits = self.buffer is not None and need <= self.buffer.shape[2] and self.buffer.shape[:2] == new.shape[:2]
        if not fits and self.length == 0:
            self.buffer, self.length = new, need  # adopted as it is
            return
        if not fits:
            grown = max(need, self.length + max(self.CHUNK, self.length // 8))
            buffer = new.new_empty(*new.shape[:2], grown, *new.shape[3:])
            if self.length:
                buffer[:, :, : self.length] = self.buffer[:, :, : self.length]
            self.buffer = buffer
        self.buffer[:, :, self.length : need] = new
        self.length = need

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens (the buffer stays; later appends overwrite the rest)."""
        self.length = min(self.length, n)

    def drop_front(self, n: int) -> None:
        self.buffer, self.length = self.buffer[:, :, n:], self.length - n

    def allocated_bytes(self) -> int:
        return 0 if self.buffer is None else self.buffer.numel() * self.buffer.element_size()
