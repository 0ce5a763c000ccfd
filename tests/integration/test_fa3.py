"""attn=fa3: FP8 queries and probabilities, checked against a float64 reference attention."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from evalkit import quantized_kv
from evalkit.errors import SchemeError
from evalkit.integration.fa3 import fa3_attention

from tests.tiny_models import tiny_model


def e4m3(x: np.ndarray) -> np.ndarray:
    return np.clip(x, -448, 448).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)


def reference_fa3(q, k, v, mask, scaling):
    """Plain float64 attention as vLLM runs FA3 on Hopper: Q rounded to E4M3 at its static scale 1.0, and
    exp(S - rowmax) * 2**8 rounded to E4M3 for the P @ V product (the row sum from the unrounded P)."""
    q, k, v = (t.double().numpy() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)
    q8 = e4m3(q.astype(np.float32))
    s = q8 @ k.transpose(0, 1, 3, 2) * scaling
    s = np.where(mask.numpy(), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    out = (e4m3((p * 256).astype(np.float32)) / 256) @ v / p.sum(-1, keepdims=True)
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
    # Q's scale is static (vLLM's q_scale, 1.0), so nothing couples a position to later tokens: the early
    # logits are the same numbers, the later ones move
    assert torch.equal(a[0, :12], b[0, :12]) and (a[0, 12:] - b[0, 12:]).abs().max() > 0.1


def test_query_rounds_at_scale_one_and_saturates():
    """vLLM's static q_scale 1.0: values beyond ±448 saturate, small ones round on E4M3's subnormal grid."""
    from evalkit.integration.fa3 import quantize_query

    q = torch.tensor([500.0, -1000.0, 3.3, 0.001, -0.0009, 1e-4])
    expected = torch.from_numpy(e4m3(q.numpy().astype(np.float64)).astype(np.float32))
    assert torch.equal(quantize_query(q), expected)
    assert quantize_query(q)[:2].tolist() == [448.0, -448.0]
    # E4M3's smallest subnormal is 2**-9: 0.001 is past half of it and rounds up, 0.0009 and 1e-4 are not
    assert quantize_query(q)[3:].tolist() == [2.0**-9, 0.0, 0.0]


def test_probabilities_keep_fa3s_offset_so_small_ones_survive():
    """FA3 rounds exp(S - max) * 2**8: a probability of 1e-4 relative to the row max stays, where rounding
    the bare value to E4M3 (smallest subnormal 2**-9) would flush it to zero."""
    from evalkit.integration.fa3 import round_probabilities

    p = torch.tensor([1.0, 0.3, 1e-3, 1e-4, 1e-6])
    rounded = round_probabilities(p)
    assert torch.equal(rounded, torch.from_numpy(e4m3(p.numpy().astype(np.float64) * 256) / 256).float())
    assert rounded[3] > 0 and rounded[4] == 0  # 1e-4 * 256 = 0.0256 is a normal E4M3 number; 1e-6 * 256 is not
    assert e4m3(np.array([1e-4]))[0] == 0  # without the offset it would vanish
    assert ((rounded[:4] - p[:4]).abs() / p[:4]).max() <= 2.0**-4  # E4M3's half-ulp for normal numbers


def test_small_score_chunks_give_the_same_attention(monkeypatch):
    """The query chunk shrinks so a chunk's float32 scores stay within SCORE_BYTES; the rows do not change."""
    import evalkit.integration.fa3 as fa3

    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, h, 50, 16, generator=g) for h in (4, 2, 2))
    module = torch.nn.Module()
    module.is_causal = True
    whole, _ = fa3_attention(module, q, k, v, None, scaling=0.25)
    monkeypatch.setattr(fa3, "SCORE_BYTES", 4 * 2 * 4 * 50 * 7)  # 7 query rows per chunk, the last one 1 row
    chunked, _ = fa3_attention(module, q, k, v, None, scaling=0.25)
    assert torch.allclose(chunked, whole, atol=1e-6, rtol=1e-5)


# FA3's FP8 tensor-core accumulation (+attn=fa3:acc1 / :acc2), held to a float64 loop of the same description


def trunc14(x: np.ndarray) -> np.ndarray:
    """float64: x truncated toward zero to 14 significant bits (x = m * 2**e with 0.5 <= |m| < 1)."""
    m, e = np.frexp(x)
    return np.ldexp(np.trunc(m * 2.0**14) / 2.0**14, e)


def reference_accumulated(q, k, v, mask, scaling, levels, tile):
    """The modelled kernel as a plain float64 loop: Q and P in E4M3 as above; every 32-element instruction
    returns trunc14(D + its products); QK^T over head_dim from zero; P V over key tiles of ``tile`` keys from
    the last tile to the first, 32 keys per instruction, the accumulator kept throughout (levels 1) or each
    tile's sum added to an exact accumulator (levels 2)."""
    q, k, v = (t.double().numpy() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)
    q8 = e4m3(q.astype(np.float32))
    n, d = k.shape[2], k.shape[3]
    s = np.zeros(q.shape[:3] + (n,))
    for lo in range(0, d, 32):
        s = trunc14(s + q8[..., lo : lo + 32] @ k[..., lo : lo + 32].transpose(0, 1, 3, 2))
    s = np.where(mask.numpy(), s * scaling, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p8 = e4m3((p * 256).astype(np.float32)) / 256
    out = np.zeros(q.shape[:3] + (v.shape[3],))
    for first in reversed(range(0, n, tile)):
        acc = out if levels == 1 else np.zeros_like(out)
        for lo in range(first, first + tile, 32):
            products = np.zeros_like(out)
            for key in range(lo, min(lo + 32, n)):
                products += p8[..., key, None] * v[..., key, None, :]
            acc = trunc14(acc + products)
        out = acc if levels == 1 else out + acc
    return torch.from_numpy((out / p.sum(-1, keepdims=True)).transpose(0, 2, 1, 3))


def test_the_accumulator_truncation_is_fourteen_significant_bits_toward_zero():
    from evalkit.integration.fa3 import truncate_accumulator

    x = torch.tensor([1 + 2.0**-13, 1 + 2.0**-14, -(1 + 2.0**-14), 3 * 2.0**-20 * (1 + 2.0**-16), 0.0, 1e30])
    assert truncate_accumulator(x).tolist() == [1 + 2.0**-13, 1.0, -1.0, 3 * 2.0**-20, 0.0, float(trunc14(1e30))]
    wide = torch.randn(10_000, generator=torch.Generator().manual_seed(5)) * torch.logspace(-8, 8, 10_000)
    assert np.array_equal(truncate_accumulator(wide).double().numpy(), trunc14(wide.double().numpy()))


def test_fa3_key_tiles_follow_tile_size_h():
    from evalkit.integration.fa3 import key_tile

    assert [key_tile(64, True, True), key_tile(128, True, True), key_tile(128, True, False)] == [128, 96, 96]
    assert [key_tile(64, False, True), key_tile(64, False, False), key_tile(128, False, True)] == [128, 160, 192]
    assert key_tile(128, False, False) == 224 and key_tile(256, False, True) == 128


@pytest.mark.parametrize("levels", [1, 2])
@pytest.mark.parametrize("queries", [3, 40])  # 3 x 2 query heads per KV head: FA3's decode tiles; 40: prefill
def test_fa3_accumulation_matches_its_float64_reference(levels, queries):
    from evalkit.integration.fa3 import key_tile

    g = torch.Generator().manual_seed(6)
    b, hq, hk, n, d = 1, 4, 2, 1500, 64  # 1,500 keys: a partial last tile
    q, k = (torch.randn(b, h, s, d, generator=g) for h, s in ((hq, queries), (hk, n)))
    v = torch.randn(b, hk, n, d, generator=g) + 0.5  # a mean, so the output is not near zero
    mask = (torch.arange(n)[None, :] <= torch.arange(n - queries, n)[:, None]).expand(b, 1, queries, n)
    ours, _ = fa3_attention(torch.nn.Module(), q, k, v, mask, scaling=d**-0.5, accumulation=levels)
    tile = key_tile(d, queries * 2 <= 64, levels == 2)
    ref = reference_accumulated(q, k, v, mask, d**-0.5, levels, tile)
    exact = reference_fa3(q, k, v, mask, d**-0.5)  # the same kernel, products summed exactly
    effect = (ref - exact).abs().mean()
    assert effect > 0
    assert (ours.double() - ref).abs().mean() < 0.02 * effect  # float32 vs float64 only
    if levels == 1:  # truncation toward zero over ~47 instructions shrinks the output
        assert (ref.abs() < exact.abs()).double().mean() > 0.9


def test_one_level_accumulation_loses_more_than_two_level_and_grows_with_the_keys():
    g = torch.Generator().manual_seed(7)
    d, errors = 64, {}
    for n in (256, 4096):
        q = torch.randn(1, 2, 1, d, generator=g)
        k, v = torch.randn(1, 2, n, d, generator=g), torch.randn(1, 2, n, d, generator=g) + 0.5
        exact = fa3_attention(torch.nn.Module(), q, k, v, None, scaling=d**-0.5)[0]
        for levels in (1, 2):
            out = fa3_attention(torch.nn.Module(), q, k, v, None, scaling=d**-0.5, accumulation=levels)[0]
            errors[n, levels] = float(((out - exact).abs() / exact.abs()).mean())
    assert errors[4096, 1] > 5 * errors[4096, 2] and errors[4096, 1] > 3 * errors[256, 1]  # 256 keys: mostly QK^T


def test_accumulation_options_are_their_own_schemes_with_their_own_run_ids():
    from evalkit.kv.scheme import AttentionPrecision, parse_scheme
    from evalkit.sweep.spec import ModelSpec, RunSpec

    names = ["fp8_e4m3/head/dynamic+attn=fa3", "fp8_e4m3/head/dynamic+attn=fa3:acc1", "nvfp4+attn=fa3:acc2"]
    assert [str(parse_scheme(s)) for s in names] == names
    assert parse_scheme(names[1]).attention is AttentionPrecision.FA3_ACC1
    ids = {RunSpec(ModelSpec("tiny"), s, "toy", "{}", "{}").run_id for s in (names[0], names[0] + ":acc1", names[1])}
    assert len(ids) == 2  # the string is the scheme: acc1 differs from fa3, and is the same run written either way
    with pytest.raises(SchemeError, match="attn=fa3:acc1 or attn=fa3:acc2"):
        parse_scheme("fp8_e4m3/head/dynamic+attn=fa3:acc3")


@pytest.mark.parametrize("option", ["fa3:acc1", "fa3:acc2"])
def test_accumulation_modes_run_through_the_model_and_stay_causal(option):
    model = tiny_model("llama")
    ids = torch.randint(0, 128, (1, 24), generator=torch.Generator().manual_seed(8))
    other = ids.clone()
    other[0, 12:] = (other[0, 12:] + 1) % 128
    with torch.no_grad():
        with quantized_kv(model, "fp8_e4m3/token/dynamic+attn=fa3"):
            plain = model(ids).logits
        with quantized_kv(model, f"fp8_e4m3/token/dynamic+attn={option}"):
            a, b = model(ids).logits, model(other).logits
    assert torch.equal(a[0, :12], b[0, :12]) and not torch.equal(a, plain)
