"""attn=fa3: FP8 queries and probabilities, checked against a float64 reference attention."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F

from evalkit import quantized_kv
from evalkit.integration.fa3 import fa3_attention

from tests.tiny_models import tiny_model


def e4m3(x: np.ndarray) -> np.ndarray:
    return np.clip(x, -448, 448).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)


def reference_fa3(q, k, v, mask, scaling):
    """Plain float64 attention with FA3's FP8 rounding of Q (one scale per sequence) and of exp(S - rowmax)."""
    q, k, v = (t.double().numpy() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)
    amax = np.abs(q).max(axis=(1, 2, 3), keepdims=True)
    scale = (amax.astype(np.float32) / np.float32(448)).astype(np.float64)
    q8 = e4m3((q / scale).astype(np.float32)) * scale
    s = q8 @ k.transpose(0, 1, 3, 2) * scaling
    s = np.where(mask.numpy(), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    out = e4m3(p) @ v / p.sum(-1, keepdims=True)
    return torch.from_numpy(out.transpose(0, 2, 1, 3))


def test_fa3_attention_matches_float64_reference():
    g = torch.Generator().manual_seed(0)
    b, hq, hk, s, d = 2, 4, 2, 40, 16
    q, k, v = (torch.randn(b, h, s, d, generator=g) * 2 for h in (hq, hk, hk))
    mask = torch.ones(s, s, dtype=torch.bool).tril().expand(b, 1, s, s).clone()
    module = torch.nn.Module()
    ours, _ = fa3_attention(module, q, k, v, mask, scaling=d**-0.5)
    ref = reference_fa3(q, k, v, mask, d**-0.5)
    plain = F.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=mask, scale=d**-0.5
    )
    plain = plain.transpose(1, 2).double()
    fp8_effect = (plain - ref).abs().mean()
    assert (ours.double() - ref).abs().mean() < 1e-3 * fp8_effect  # float32 vs float64 only
    assert torch.allclose(ours.double(), ref, atol=1e-4, rtol=1e-4)
    assert fp8_effect > 1e-3  # and the FP8 rounding itself is visible


def mean_kl(ref, out):
    lp, lq = F.log_softmax(ref.double(), -1), F.log_softmax(out.double(), -1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


def test_fa3_mode_moves_logits_beyond_kv_mode():
    model = tiny_model("llama")
    ids = torch.randint(0, 128, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
        with quantized_kv(model, "fp8_e4m3/head/dynamic"):
            kv = model(ids).logits
        with quantized_kv(model, "fp8_e4m3/head/dynamic+attn=fa3"):
            fa3 = model(ids).logits
    assert mean_kl(ref, fa3) > 1.2 * mean_kl(ref, kv) > 0  # Q and P rounding add to the K/V error


def test_fa3_applies_the_causal_mask_when_sdpa_passes_none():
    """sdpa's mask function passes no mask for an unpadded causal batch: FA3 must still be causal."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, h, 12, 16, generator=g) for h in (4, 2, 2))
    module = torch.nn.Module()
    module.is_causal = True
    mask = torch.ones(12, 12, dtype=torch.bool).tril()[None, None]
    assert torch.equal(
        fa3_attention(module, q, k, v, None, scaling=0.25)[0], fa3_attention(module, q, k, v, mask, scaling=0.25)[0]
    )
    # a decode step (one query, all keys visible) needs no mask
    one, _ = fa3_attention(module, q[:, :, -1:], k, v, None, scaling=0.25)
    assert torch.equal(
        one, fa3_attention(module, q[:, :, -1:], k, v, torch.ones(1, 1, 1, 12, dtype=torch.bool), scaling=0.25)[0]
    )


def test_fa3_logits_do_not_see_future_tokens():
    model = tiny_model("llama")
    ids = torch.randint(0, 128, (1, 24), generator=torch.Generator().manual_seed(2))
    other = ids.clone()
    other[0, 12:] = (other[0, 12:] + 1) % 128
    with torch.no_grad(), quantized_kv(model, "fp8_e4m3/token/dynamic+attn=fa3"):
        a, b = model(ids).logits, model(other).logits
    # early positions move only through Q's one dynamic scale per sequence (rounding-level), later ones for real
    assert (a[0, :12] - b[0, :12]).abs().max() < 0.02 * (a[0, 12:] - b[0, 12:]).abs().max()
