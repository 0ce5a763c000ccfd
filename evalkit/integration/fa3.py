"""Attention with FlashAttention-3's FP8 precision: queries and softmax probabilities in FP8.

On Hopper, vLLM runs FA3 for an FP8 E4M3 cache (:mod:`evalkit.engines.attention_paths`), and FA3's
FP8 forward takes Q, K and V in E4M3, each with a descale factor:

* **Q** is quantized before the kernel with a static per-tensor scale, the checkpoint's ``q_scale``,
  else 1.0 (vLLM's ``Attention.forward``, ``QuantFP8(static=True)``). evalkit's scale tables carry no
  ``q_scale``, so Q is rounded at scale 1.0: clamped to ±448 and rounded to nearest even.
* **P**: the kernel computes ``exp(S - rowmax) * 2**8`` (in [0, 256]: its softmax subtracts 8 from the
  row max in log2 units for FP8, so small probabilities stay normal numbers), casts that to E4M3 for the
  ``P @ V`` product, and normalises by the row sum accumulated in float32 from the unrounded values
  (``hopper/softmax.h``, ``Max_offset``, in vllm-project/flash-attention).

Quantizing only the stored K/V misses the Q and P error, which is why the ``attn=fa3`` mode exists.
This is a reference implementation in float32 (K/V arrive already quantized by the scheme). Left out,
and documented: the row max is the exact one rather than FA3's running max over 128-key tiles (so P's
rounding is that of a single tile), and a checkpoint's calibrated ``q_scale``. Queries are processed in
chunks whose float32 scores stay within ``SCORE_BYTES``, so memory stays linear in the sequence length.

**The FP8 tensor cores' accumulation** (``attn=fa3:acc1`` and ``attn=fa3:acc2``; plain ``attn=fa3``
sums the products exactly in float32). Hopper's FP8 ``wgmma`` does not keep a float32 accumulator:
SageAttention2 (Zhang et al., 2024, section on FP22 accumulation) measured ``C = A B + D`` on Ada and
Hopper and found ``D`` kept with 1 sign, 8 exponent and 13 mantissa bits, its 10 lower mantissa bits
zeroed; DeepSeek-V3's technical report (section 3.3.2) measured "around 14 bits" on H800. Modelled here:

* every FP8 ``wgmma`` contracts ``WGMMA_K`` = 32 elements (PTX ``wgmma.mma_async .m64nNk32`` for
  ``.e4m3``) and returns ``trunc14(D + sum of its 32 products)``: the products summed in float32, the
  result truncated toward zero to ``ACC_BITS`` = 14 significant bits (the float32 value's lower 10
  mantissa bits cleared, :func:`truncate_accumulator`). Within one instruction the products are not
  aligned and truncated against the largest one (DeepGEMM's description, deepseek-ai/DeepGEMM#50):
  that error does not grow with the key length and is left out;
* ``S = Q K^T`` contracts head_dim in 32-element steps from zero (FA3's QK gemm is ``zero_init``), so
  it loses at most a few 14-bit truncations, the same in both modes;
* ``O = P V`` contracts the keys. FA3 walks key tiles of ``kBlockN`` keys from the last tile to the
  first (``hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp``: ``n_block = n_block_max - 1 ... --n_block``),
  32 keys per instruction in order within a tile (:func:`key_tile` gives ``kBlockN`` from
  ``hopper/tile_size.h``). **acc1, one level** (FA3 as released, and vLLM's fork built with
  ``FLASHATTENTION_DISABLE_FP8_TWO_LEVEL_ACCUMULATION``): the output accumulator stays in the tensor
  cores over every tile, so it is truncated after every 32 keys of the whole row; truncation toward
  zero is biased, so at 128k keys (4,096 instructions) it shrinks the output by several percent, and
  the row sum it is divided by is float32 (``Softmax::finalize``). **acc2, two level** (vLLM's
  flash-attention #104, ``flash::gemm`` in ``hopper/utils.h``: every FP8 gemm that is not
  ``zero_init`` accumulates into a cleared fragment and adds it to the running output in float32):
  the tensor cores accumulate one key tile from zero, and each tile's sum is promoted to float32.
  (flash-attention #122's every-n-tiles interval was reverted, #136; the promotion interval is one
  tile.)

Also left out for the accumulation: FA3 rescales the running output by ``exp(m_old - m_new)`` when the
running max grows; with the exact row max there is no rescale, and the truncation is relative, so its
size is the same. K and V arrive dequantized (scale folded in); the hardware truncates the sums of the
raw codes and applies the descale afterwards, which is the same truncation only for a power-of-two scale.

Masking: transformers' sdpa mask function returns no mask at all for an unpadded causal batch
(sdpa then applies ``is_causal`` itself), so when no mask arrives and the module is causal, the
causal mask is applied here, aligned to the last key (a query at position i of a q-token chunk
sees the cached keys and new keys up to i).
"""

from __future__ import annotations

import math

import torch

from evalkit.kv.formats import FORMATS
from evalkit.kv.rounding import round_to_fp8

E4M3 = FORMATS["fp8_e4m3"]
QUERY_CHUNK = 1024  # queries per chunk at most
SCORE_BYTES = 2**30  # at most this many bytes per float32 score chunk (B x Hq x chunk x keys), so long
# prompts at batch size > 1 do not hold several copies of a (4, 32, 1024, 32768) score tensor at once
Q_SCALE = 1.0  # vLLM's q_scale without a calibrated one in the checkpoint
P_OFFSET = 2.0**8  # FA3's FP8 softmax scales exp(S - rowmax) by 2**Max_offset, Max_offset = 8
WGMMA_K = 32  # elements one FP8 wgmma contracts (PTX ISA: wgmma.mma_async .m64nNk32 for .e4m3/.e5m2)
ACC_BITS = 14  # significant bits the FP8 tensor-core accumulator keeps (SageAttention2: FP22 = 1 + 8 + 13 bits)
_ACC_MASK = -(1 << (23 - (ACC_BITS - 1)))  # float32 bits with the lower 23 - 13 = 10 mantissa bits cleared
ACC_BYTES = 2**28  # at most this many bytes of per-instruction partial sums (acc modes) per query chunk
ONE_LEVEL, TWO_LEVEL = 1, 2  # the accumulation modes: +attn=fa3:acc1, +attn=fa3:acc2 (0: exact float32)


def quantize_query(q: torch.Tensor, scale: float = Q_SCALE) -> torch.Tensor:
    """Q as vLLM hands it to FA3: ``q / scale`` clamped to E4M3's range and rounded, times ``scale``
    (float32 in and out; one static scale for the whole tensor)."""
    return round_to_fp8((q / scale).clamp(-E4M3.max, E4M3.max), E4M3) * scale


def round_probabilities(p: torch.Tensor) -> torch.Tensor:
    """``p`` (in [0, 1]) as FA3's P·V product reads it: ``p * 2**8`` rounded to E4M3, scaled back."""
    return round_to_fp8(p * P_OFFSET, E4M3) / P_OFFSET


def truncate_accumulator(x: torch.Tensor) -> torch.Tensor:
    """float32 ``x`` truncated toward zero to ``ACC_BITS`` significant bits, as the FP8 tensor cores keep
    their accumulator: the lower 10 of float32's 23 mantissa bits cleared (sign and exponent kept)."""
    return (x.float().contiguous().view(torch.int32) & _ACC_MASK).view(torch.float32)


def key_tile(head_dim: int, one_warpgroup: bool, two_level: bool) -> int:
    """FA3's ``kBlockN`` (keys per tile) on Hopper's FP8 path, from ``tile_size_fwd_sm90`` in vLLM's
    ``hopper/tile_size.h``: decode tiles (``use_one_mma_wg``: head_dim 64 or 128 and queries times query
    heads per KV head at most 64) and prefill tiles, which the two-level build makes smaller."""
    if one_warpgroup:
        return 128 if head_dim <= 96 else 96
    # (head_dim up to, kBlockN with two-level accumulation, kBlockN without: the #else branch)
    table = ((64, 128, 160), (96, 128, 128), (128, 192, 224), (192, 96, 160))
    for limit, two, one in table:
        if head_dim <= limit:
            return two if two_level else one
    return 128


def wgmma_chain(partials: torch.Tensor, start: torch.Tensor | None = None) -> torch.Tensor:
    """``partials`` (..., steps, D): each step's float32 sum of products; the accumulator after the chain of
    instructions ``C = trunc14(D + partial)``, D starting at ``start`` (zero by default)."""
    acc = torch.zeros_like(partials[..., 0, :]) if start is None else start
    for j in range(partials.shape[-2]):
        acc = truncate_accumulator(acc + partials[..., j, :])
    return acc


def scores_accumulated(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``q @ k^T`` as FA3's FP8 QK gemm sums it: head_dim in 32-element instructions from zero."""
    d = q.shape[-1]
    acc = None
    for start in range(0, d, WGMMA_K):
        part = torch.matmul(q[..., start : start + WGMMA_K], k[..., start : start + WGMMA_K].transpose(-1, -2))
        acc = truncate_accumulator(part if acc is None else acc + part)
    return acc


def output_accumulated(p: torch.Tensor, v: torch.Tensor, tile: int, levels: int) -> torch.Tensor:
    """``p @ v`` (p: (B, H, S, N), v: (B, H, N, Dv)) as FA3's FP8 PV gemm sums it: key tiles of ``tile`` keys
    from the last to the first, 32 keys per instruction; one level keeps the accumulator in the tensor cores
    throughout, two level starts each tile from zero and adds its sum to a float32 accumulator."""
    b, h, s, n = p.shape
    tiles = -(-n // tile)
    pad = tiles * tile - n  # keys past the end contribute zero products, as FA3's masked tile does
    p = torch.nn.functional.pad(p, (0, pad)).view(b, h, s, tiles, tile // WGMMA_K, WGMMA_K)
    v = torch.nn.functional.pad(v, (0, 0, 0, pad)).view(b, h, tiles, tile // WGMMA_K, WGMMA_K, v.shape[-1])
    partials = torch.einsum("bhstjk,bhtjkd->bhstjd", p, v)  # each instruction's sum of 32 products
    out = None
    for t in reversed(range(tiles)):
        if levels == ONE_LEVEL:
            out = wgmma_chain(partials[:, :, :, t], out)
        else:
            tile_sum = wgmma_chain(partials[:, :, :, t])
            out = tile_sum if out is None else out + tile_sum
    return out


def fa3_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None, accumulation=0, **kwargs
):
    """Drop-in attention function: (B, Hq, S, D) inputs, returns ((B, S, Hq, Dv), None). ``accumulation``:
    0 sums products exactly in float32 (``+attn=fa3``), ``ONE_LEVEL``/``TWO_LEVEL`` model the FP8 tensor
    cores' accumulation (``+attn=fa3:acc1``/``:acc2``, see the module docstring)."""
    b, hq, s, d = query.shape
    groups = hq // key.shape[1]
    if scaling is None:
        scaling = getattr(module, "scaling", None) or 1.0 / math.sqrt(d)
    if softcap is None:
        softcap = getattr(module, "attn_logit_softcapping", None)
    causal = getattr(module, "is_causal", True)
    q = quantize_query(query.float())
    k = key.float().repeat_interleave(groups, dim=1)
    v = value.float().repeat_interleave(groups, dim=1)
    out = torch.empty(b, hq, s, v.shape[-1], dtype=torch.float32, device=query.device)
    chunk = max(1, min(QUERY_CHUNK, SCORE_BYTES // (4 * b * hq * k.shape[-2])))
    if accumulation:
        if accumulation not in (ONE_LEVEL, TWO_LEVEL):
            raise ValueError(f"accumulation={accumulation!r}: use 0, ONE_LEVEL or TWO_LEVEL")
        tile = key_tile(d, d in (64, 128) and s * groups <= 64, accumulation == TWO_LEVEL)
        partial_bytes = 4 * b * hq * (-(-k.shape[-2] // tile) * tile // WGMMA_K) * v.shape[-1]
        chunk = max(1, min(chunk, ACC_BYTES // partial_bytes))
    for start in range(0, s, chunk):
        stop = min(s, start + chunk)
        if accumulation:
            scores = scores_accumulated(q[:, :, start:stop], k) * scaling
        else:
            scores = torch.matmul(q[:, :, start:stop], k.transpose(-1, -2)) * scaling
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        if attention_mask is not None:
            mask = attention_mask[:, :, start:stop, : k.shape[-2]]
            if mask.dtype == torch.bool:
                scores = scores.masked_fill(~mask, float("-inf"))
            else:
                scores = scores + mask.float()
        elif causal and s > 1:
            rows = torch.arange(start, stop, device=query.device)[:, None] + (k.shape[-2] - s)
            scores = scores.masked_fill(torch.arange(k.shape[-2], device=query.device)[None, :] > rows, float("-inf"))
        row_max = scores.amax(dim=-1, keepdim=True).clamp(min=torch.finfo(torch.float32).min)
        p = torch.exp(scores - row_max)
        row_sum = p.sum(dim=-1, keepdim=True)
        p8 = round_probabilities(p)
        # a fully masked row (a padding query) has row_sum 0: output zeros, as sdpa does
        pv = output_accumulated(p8, v, tile, accumulation) if accumulation else torch.matmul(p8, v)
        out[:, :, start:stop] = pv / torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))
    return out.transpose(1, 2).contiguous().to(query.dtype), None
