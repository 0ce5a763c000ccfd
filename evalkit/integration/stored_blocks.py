"""Dynamic ``block<N>`` scales in a store: one scale per N tokens per KV head, an open block re-encoded
from its tokens as they arrived.

Blocks are counted from each sequence's own first real token (a paged cache is per sequence). A block's
stored codes and scale are always a one-shot encode of the tokens it holds: when tokens join a partly
filled block, the whole block is re-encoded with the scale of all its tokens from the K/V *as they
arrived*, which the store keeps for the open block only (at most N - 1 tokens per sequence and head, in
the K/V's dtype; in one piece when every sequence's blocks start together, else sequence by sequence: the
same numbers, tested). It never re-encodes from the dequantized values: under ``+rounding=rtz``
``(c * s) / s`` falls just below ``c`` for a few percent of E4M3 codes in float32 (and about half in
bfloat16), so each re-encode would truncate one more code step, up to N - 1 times, and under nearest even
a grown scale would round the old codes twice.

What engines do with a block whose tokens arrive one at a time: none of the FP8 KV caches of
vLLM (per tensor, or ``*_per_token_head``: one scale per token), SGLang (per tensor) or
TensorRT-LLM (per tensor) keeps a dynamic scale per block of tokens, so ``block<N>/dynamic`` is
a reference point, not an engine's scheme (no engine profile accepts it). The caches that group
tokens keep the newest tokens unquantized until a group fills: KIVI quantizes a full group of
its full-precision residual once, and transformers' ``QuantizedCache`` keeps ``residual_length``
tokens unquantized and then re-quantizes the whole cache from its dequantized values (the
lossy round trip this store avoids). evalkit's block differs from both in one respect, on
purpose: attention reads the open block quantized (with the scale of its tokens so far), so
that a single forward and a decode read the same kind of K/V.

:class:`BlockScales` is that part of :class:`~evalkit.integration.stored.StoredTensor` (its base class):
it reads and writes the store's codes, block-scale table, block starts and open-block tail.
"""

from __future__ import annotations

import torch

from evalkit.errors import SchemeError
from evalkit.kv.quantize import encode_quantized, quantize


class BlockScales:
    """The dynamic ``block<N>`` writes of :class:`~evalkit.integration.stored.StoredTensor` (see the module
    docstring); the state they use (``_codes``, ``scale``, ``starts``, ``_tail``, ``total``, ``offset``,
    ``block_base``) is the store's."""

    def _append_blocks(self, x: torch.Tensor, valid: torch.Tensor | None) -> None:
        if self.fmt.asymmetric:
            raise SchemeError(
                f"block scales are kept for symmetric formats only: use {self.fmt.name.replace('_asym', '')} "
                "or token/group granularity"
            )
        n, t0 = self.granularity.size, self.total
        starts = self.starts or [0] * x.shape[0]
        self.starts = starts
        if valid is None and len(set(starts)) == 1 and t0 >= starts[0]:
            self._extend_blocks(x, starts[0])
        else:
            self._append_block_regions(x, valid, starts)
        keep = n - 1  # an open block holds at most N - 1 tokens: keep those as they arrived, nothing more
        self._tail = None if keep == 0 else self._cat(self._tail, x)[:, :, -keep:].clone()

    def _arrived(self, rows: slice, lo: int) -> torch.Tensor:
        """Stored tokens from absolute position ``lo`` on, as they arrived (float32; ``lo`` lies in the
        open block, so within the kept tail)."""
        first = self.total - self._tail.shape[2]  # absolute position of the tail's first token
        assert lo >= first, "an open block starts within the last N - 1 tokens"
        return self._tail[rows, :, lo - first :].float()

    def _append_block_regions(self, x: torch.Tensor, valid: torch.Tensor | None, starts: list[int]) -> None:
        b, h, s, d = x.shape
        n, t0 = self.granularity.size, self.total
        # grow codes, values and the block-scale table first; the regions below fill them in
        self._codes.append(self._zero_codes(b, h, s, d, x.device))
        self._fresh = None
        blocks = max(-(-(t0 + s - st) // n) for st in starts) - self.block_base
        have = 0 if self.scale is None else self.scale.shape[2]
        if blocks > have:
            self.scale = self._cat(self.scale, torch.ones(b, h, blocks - have, dtype=torch.float32, device=x.device))
        if len(set(starts)) == 1:
            self._encode_region(slice(None), starts[0], x, valid)
        else:  # left padding: each sequence's blocks begin at its own first token
            for i, st in enumerate(starts):
                self._encode_region(slice(i, i + 1), st, x[i : i + 1], None if valid is None else valid[i : i + 1])

    def _extend_blocks(self, x: torch.Tensor, start: int) -> None:
        """The common case in one piece (every sequence's blocks start at ``start``, no padding in
        ``x``, e.g. a decode step): the block holding the first new token, whose earlier tokens are
        re-encoded from their values as they arrived, and the new tokens are quantized together; the codes,
        values and scales before that block stay as they are. The same numbers as
        :meth:`_encode_region` (tested), with a few small operations instead of many per step."""
        n, t0 = self.granularity.size, self.total
        lo = start + (t0 - start) // n * n  # absolute position where the block holding t0 begins
        keep = lo - self.offset  # stored tokens before that block
        xf = x.float()
        region = xf if lo == t0 else torch.cat([self._arrived(slice(None), lo), xf], dim=2)
        q = quantize(region, self.fmt, self.granularity)
        self._codes.truncate(keep)
        self._codes.append(encode_quantized(q, self.fmt))
        self._fresh = None
        k0, m = (lo - start) // n - self.block_base, q.scale.shape[2]
        if self.scale is not None and k0 + m <= self.scale.shape[2]:
            self.scale[:, :, k0 : k0 + m] = q.scale
        else:
            self.scale = (
                q.scale if self.scale is None or k0 == 0 else torch.cat([self.scale[:, :, :k0], q.scale], dim=2)
            )
        self._flag(q.nonfinite)

    def _zero_codes(self, b: int, h: int, s: int, d: int, device) -> torch.Tensor:
        """Stored bytes for ``s`` tokens not encoded yet (all-zero bytes; the regions fill them in)."""
        return torch.zeros(b, h, s, d * self.fmt.bits // 8, dtype=self.fmt.storage_dtype, device=device)

    def _encode_region(self, rows: slice, start: int, x: torch.Tensor, valid: torch.Tensor | None) -> None:
        """(Re-)encode, for the sequences ``rows`` whose blocks start at ``start``, every block that
        the new tokens ``x`` touch: a partly filled last block is re-encoded, from its tokens as they
        arrived, with its new tokens."""
        n, t0, s = self.granularity.size, self.total, x.shape[2]
        first_block = max(t0 - start, 0) // n
        lo = start + first_block * n  # absolute position where the first touched block begins
        if lo >= t0 + s:
            return  # only padding so far
        old = self._arrived(rows, lo) if lo < t0 else None
        new = x[:, :, max(lo - t0, 0) :].float()
        region = new if old is None else torch.cat([old, new], dim=2)
        region_valid = None
        if valid is not None:
            region_valid = valid[:, max(lo - t0, 0) :]
            if old is not None:
                region_valid = torch.cat(
                    [
                        torch.ones(region_valid.shape[0], old.shape[2], dtype=torch.bool, device=region_valid.device),
                        region_valid,
                    ],
                    dim=1,
                )
        q = quantize(region, self.fmt, self.granularity, valid=region_valid)
        sl = slice(lo - self.offset, t0 + s - self.offset)
        self.codes[rows, :, sl] = encode_quantized(q, self.fmt)
        k0 = first_block - self.block_base
        self.scale[rows, :, k0 : k0 + q.scale.shape[2]] = q.scale
        self._flag(q.nonfinite)
