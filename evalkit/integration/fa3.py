"""Attention with FlashAttention-3's FP8 precision: queries and softmax probabilities in FP8.

On Hopper, FA3's FP8 forward takes Q, K and V in FP8 E4M3 (each with a descale factor) and also
casts the un-normalised probabilities ``P = exp(S - rowmax)`` to E4M3 before the ``P @ V`` matmul;
the row sum that normalises the output is accumulated in float32 from the unrounded P.
Quantizing only the stored K/V misses the Q and P error, which is why the ``attn=fa3`` mode
exists. This is a reference implementation in float32 (K/V arrive already quantized by the
scheme). Two simplifications, both documented: Q gets one dynamic scale per sequence and layer
(engines use a per-layer ``q_scale``), and the row max is the exact one rather than FA3's running
max over 128-key tiles, so P's rounding is that of a single tile. Queries are processed in
chunks, so memory stays linear in the sequence length for a fixed chunk.

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
QUERY_CHUNK = 1024


def quantize_query(q: torch.Tensor) -> torch.Tensor:
    """One dynamic E4M3 scale per sequence over all heads (float32 in and out)."""
    amax = q.abs().amax(dim=(1, 2, 3), keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3.max, torch.ones_like(amax))
    return round_to_fp8((q / scale).clamp(-E4M3.max, E4M3.max), E4M3) * scale


def fa3_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None, **kwargs):
    """Drop-in attention function: (B, Hq, S, D) inputs, returns ((B, S, Hq, Dv), None)."""
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
    for start in range(0, s, QUERY_CHUNK):
        stop = min(s, start + QUERY_CHUNK)
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
        p8 = round_to_fp8(p, E4M3)  # p is in [0, 1]: FA3 casts it with no scale
        # a fully masked row (a padding query) has row_sum 0: output zeros, as sdpa does
        out[:, :, start:stop] = torch.matmul(p8, v) / torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))
    return out.transpose(1, 2).contiguous().to(query.dtype), None
