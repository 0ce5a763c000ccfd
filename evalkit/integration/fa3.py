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
rounding is that of a single tile), a checkpoint's calibrated ``q_scale``, and the FP8 tensor cores'
accumulation. Queries are processed in chunks whose float32 scores stay within ``SCORE_BYTES``, so
memory stays linear in the sequence length.

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


def quantize_query(q: torch.Tensor, scale: float = Q_SCALE) -> torch.Tensor:
    """Q as vLLM hands it to FA3: ``q / scale`` clamped to E4M3's range and rounded, times ``scale``
    (float32 in and out; one static scale for the whole tensor)."""
    return round_to_fp8((q / scale).clamp(-E4M3.max, E4M3.max), E4M3) * scale


def round_probabilities(p: torch.Tensor) -> torch.Tensor:
    """``p`` (in [0, 1]) as FA3's P·V product reads it: ``p * 2**8`` rounded to E4M3, scaled back."""
    return round_to_fp8(p * P_OFFSET, E4M3) / P_OFFSET


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
    chunk = max(1, min(QUERY_CHUNK, SCORE_BYTES // (4 * b * hq * k.shape[-2])))
    for start in range(0, s, chunk):
        stop = min(s, start + chunk)
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
        out[:, :, start:stop] = torch.matmul(p8, v) / torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))
    return out.transpose(1, 2).contiguous().to(query.dtype), None
