"""vllm:fp8_ds_mla and vllm:nvfp4_ds_mla: the bytes evalkit's MLA store holds are vLLM's documented
rows (flashmla_sparse.py), written here independently in numpy from a reading of DeepSeek V3.2's
writer (deepseek_v32/common/kernels.py, _fused_norm_rope_kernel), and read back by an independent
decoding of those bytes. FP8/FP4 casts are held to cvt.rn.satfinite by an exhaustive nearest-even
search over each format's values. Also: vllm:fp8 on MLA is a 576-wide E4M3 latent under one scale."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers as tf

from evalkit import quantized_kv
from evalkit.errors import SchemeError
from evalkit.integration.hf_compat import cache_inputs
from evalkit.kv.codecs.vllm import ds_mla
from evalkit.kv.memory import bytes_per_token
from evalkit.kv.microscaling import round_to_e2m1
from evalkit.kv.scheme import parse_scheme
from evalkit.models.info import kv_layout

from tests.integration.test_mla import capture_attention_inputs, independent_latent
from tests.tiny_models import ds_mla_config, tiny_model


# -- independent references: every value of the format, nearest, ties to the even code, saturating --------
def e4m3_table() -> np.ndarray:
    """float64 value of each E4M3 ('fn') code 0..255 from its bits (S EEEE MMM, bias 7); NaN at 0x7F/0xFF."""
    out = np.empty(256)
    for c in range(256):
        sign, e, m = -1.0 if c & 0x80 else 1.0, (c >> 3) & 0xF, c & 7
        out[c] = np.nan if (c & 0x7F) == 0x7F else sign * (m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return out


E4M3 = e4m3_table()
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def nearest_even(y: float, magnitudes: np.ndarray) -> int:
    """Index of the magnitude nearest |y| (ties: the even index, i.e. mantissa bit 0), saturating at the top."""
    a = min(abs(y), magnitudes[-1])
    d = np.abs(magnitudes - a)
    best = np.flatnonzero(d == d.min())
    return int(best[0] if len(best) == 1 or best[0] % 2 == 0 else best[1])


def ref_e4m3_code(y: float) -> int:
    if math.isnan(y):
        return 0x7F
    i = nearest_even(y, E4M3[:127])  # the 127 non-negative finite magnitudes, code order
    return i | (0x80 if math.copysign(1.0, y) < 0 else 0)


def ref_e2m1_code(y: float) -> int:
    return nearest_even(y, E2M1) | (8 if math.copysign(1.0, y) < 0 else 0)


def edge_values(table: np.ndarray, top: float) -> np.ndarray:
    mags = table[np.isfinite(table) & (table >= 0)]
    mags = np.unique(mags)
    mids = (mags[:-1] + mags[1:]) / 2
    near = np.concatenate(
        [mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf), mags, [top * 1.03, top * 5, np.inf]]
    )
    rng = np.random.default_rng(0)
    vals = np.concatenate([near, rng.uniform(0, top * 1.1, 4000), 2.0 ** rng.uniform(-12, 9, 4000)])
    vals = np.concatenate([vals, -vals]).astype(np.float32)
    return vals[np.isfinite(vals) | np.isinf(vals)]


def test_e4m3_cast_is_cvt_rn_satfinite():
    y = edge_values(E4M3, 448.0)
    got = ds_mla.e4m3(torch.from_numpy(y)).view(torch.uint8).numpy()
    want = np.array([ref_e4m3_code(float(v)) for v in y], dtype=np.uint8)
    assert (got == want).all(), y[got != want][:10]
    assert ds_mla.e4m3(torch.tensor([float("nan")])).float().isnan().all()


def test_e2m1_cast_is_cvt_rn_satfinite():
    y = np.concatenate([edge_values(E2M1, 6.0), [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.0]]).astype(np.float32)
    got = round_to_e2m1(torch.from_numpy(y)).numpy()
    want = np.array([E2M1[ref_e2m1_code(float(v)) & 7] * (-1 if ref_e2m1_code(float(v)) & 8 else 1) for v in y])
    assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want))


# -- independent writers and readers of the rows -------------------------------------------------------
def ref_fp8_row(latent: np.ndarray, rope: np.ndarray) -> bytes:
    out = bytearray()
    scales = []
    for t in latent.reshape(4, 128).astype(np.float32):
        s = max(np.float32(np.abs(t).max()) * np.float32(1 / 448), np.float32(1e-4))
        m, e = math.frexp(float(s))
        s = np.float32(2.0 ** (e - 1 if m == 0.5 else e))
        scales.append(s)
        out += bytes(ref_e4m3_code(float(np.float32(v) / s)) for v in t)
    out += np.array(scales, dtype="<f4").tobytes()
    bf16 = (
        rope.astype(np.float32).view(np.uint32) + 0x7FFF + ((rope.astype(np.float32).view(np.uint32) >> 16) & 1)
    ) >> 16
    out += bf16.astype("<u2").tobytes()  # round to nearest even on the upper 16 bits (finite inputs)
    return bytes(out)


def read_fp8_row(row: bytes) -> tuple[np.ndarray, np.ndarray]:
    b = np.frombuffer(row, dtype=np.uint8)
    assert b.size == 656
    scales = b[512:528].view("<f4").astype(np.float64)
    latent = E4M3[b[:512]].reshape(4, 128) * scales[:, None]
    rope = (b[528:].view("<u2").astype(np.uint32) << 16).view(np.float32)
    return latent.reshape(-1), rope.astype(np.float64)


def ref_nvfp4_row(latent: np.ndarray, rope: np.ndarray) -> bytes:
    codes, sfs = [], []
    for g in latent.reshape(32, 16).astype(np.float32):
        want = max(np.float32(np.abs(g).max()) * np.float32(1 / 6), np.float32(2.0**-9))
        sf = ref_e4m3_code(float(want))
        sfs.append(sf)
        inv = np.float32(1) / np.float32(E4M3[sf])
        codes += [ref_e2m1_code(float(np.float32(v) * inv)) for v in g]
    data = bytes(codes[i] | (codes[i + 1] << 4) for i in range(0, 512, 2))
    rope_b = bytes(ref_e4m3_code(float(v)) for v in rope.astype(np.float32))
    perm = bytearray(32)
    for s, sf in enumerate(sfs):
        perm[8 * (s % 4) + s // 4] = sf
    return data + rope_b + bytes(perm)


def read_nvfp4_row(row: bytes) -> tuple[np.ndarray, np.ndarray]:
    b = np.frombuffer(row, dtype=np.uint8)
    assert b.size == 352
    nib = np.stack([b[:256] & 0xF, b[:256] >> 4], axis=-1).reshape(-1)
    e2m1 = E2M1[nib & 7] * np.where(nib & 8, -1.0, 1.0)
    sf = np.array([E4M3[b[320 + 8 * (s % 4) + s // 4]] for s in range(32)])
    return (e2m1.reshape(32, 16) * sf[:, None]).reshape(-1), E4M3[b[256:320]]


ROWS = {"fp8_ds_mla": (ref_fp8_row, read_fp8_row), "nvfp4_ds_mla": (ref_nvfp4_row, read_nvfp4_row)}


@pytest.fixture(scope="module")
def v3():
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(ds_mla_config()).eval()


def stored(model, scheme, ids):
    seen, handles = capture_attention_inputs(model)
    try:
        with torch.no_grad(), quantized_kv(model, scheme) as session:
            cache = session.new_cache()
            model(ids, **cache_inputs(model, cache))
    finally:
        for h in handles:
            h.remove()
    return cache, seen


@torch.no_grad()
@pytest.mark.parametrize("name", ["fp8_ds_mla", "nvfp4_ds_mla"])
def test_storage_holds_vllms_row_byte_for_byte_and_reads_it_back(v3, name):
    ids = torch.randint(3, 128, (1, 9), generator=torch.Generator().manual_seed(5))
    cache, seen = stored(v3, f"vllm:{name}", ids)
    write, read = ROWS[name]
    for idx, layer in enumerate(cache.layers):
        latent, rope = independent_latent(v3.model.layers[idx].self_attn, *seen[idx])
        rows = ds_mla.row(name, layer.k.codes, layer.v.codes)
        assert rows.shape == (1, 1, 9, ds_mla.FP8_ROW if name == "fp8_ds_mla" else ds_mla.NVFP4_ROW)
        for t in range(9):
            got = rows[0, 0, t].numpy().tobytes()
            assert got == write(latent[0, 0, t].numpy(), rope[0, 0, t].numpy()), (idx, t)
            want_latent, want_rope = read(got)
            assert np.array_equal(layer.k.values[0, 0, t].double().numpy(), want_latent)
            assert np.array_equal(layer.v.values[0, 0, t].double().numpy(), want_rope)
        assert torch.equal(layer.k.decoded(), layer.k.values.float())
        assert torch.equal(layer.v.decoded(), layer.v.values.float())
    assert cache.nbytes() == 9 * 2 * (ds_mla.FP8_ROW if name == "fp8_ds_mla" else ds_mla.NVFP4_ROW)


@pytest.mark.parametrize("name", ["fp8_ds_mla", "nvfp4_ds_mla"])
def test_edge_latents_match_the_independent_row(name):
    """All-zero tiles (the scale floors), a tile beyond nvfp4's 6 * 448, tiny values, exact powers of two."""
    g = torch.Generator().manual_seed(1)
    lat = torch.randn(4, 512, generator=g)
    lat[0, :128] = 0.0
    lat[1] = lat[1] * 3000.0
    lat[2] = lat[2] * 1e-6
    lat[3, :128] = 448.0 * 2.0 ** torch.randint(-8, 4, (128,), generator=g).float()
    rope = torch.randn(4, 64, generator=g) * torch.tensor([1.0, 600.0, 1e-4, 1.0])[:, None]
    codec = {c.name: c for c in ds_mla.CODECS}[name]
    k, v = codec.encode(lat, "k"), codec.encode(rope, "v")
    write, read = ROWS[name]
    for i in range(4):
        got = ds_mla.row(name, k.stored[i], v.stored[i]).numpy().tobytes()
        assert got == write(lat[i].numpy(), rope[i].numpy()), i
        want_latent, want_rope = read(got)
        assert np.array_equal(k.values[i].double().numpy(), want_latent)
        assert np.array_equal(v.values[i].double().numpy(), want_rope)


def test_bytes_per_token_are_the_rows():
    layout = kv_layout(ds_mla_config())
    assert bytes_per_token(layout, parse_scheme("vllm:fp8_ds_mla")) == 656 * 2
    assert bytes_per_token(layout, parse_scheme("vllm:nvfp4_ds_mla")) == 352 * 2
    assert bytes_per_token(layout, parse_scheme("vllm:fp8")) == 576 * 2
    assert str(parse_scheme("vllm:nvfp4_ds_mla")) == "vllm:nvfp4_ds_mla"


@torch.no_grad()
def test_dense_fp8_on_mla_is_one_576_wide_e4m3_latent_under_one_scale(v3):
    """concat_and_cache_mla_kernel (dense MLA backends, kv_cache_dtype fp8): x / k_scale for all 576 values,
    one scale (1.0 without checkpoint scales), RNE satfinite; evalkit's vllm:fp8 stores the same bytes."""
    ids = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(6))
    cache, seen = stored(v3, "vllm:fp8", ids)
    for idx, layer in enumerate(cache.layers):
        latent, rope = independent_latent(v3.model.layers[idx].self_attn, *seen[idx])
        got = torch.cat([layer.k.codes.view(torch.uint8), layer.v.codes.view(torch.uint8)], dim=-1)[0, 0].numpy()
        x = torch.cat([latent, rope], dim=-1)[0, 0].numpy()
        want = np.array([[ref_e4m3_code(float(np.float32(v) / np.float32(1.0))) for v in r] for r in x], np.uint8)
        assert got.shape == (6, 576) and np.array_equal(got, want)


def test_refused_in_one_line_where_vllm_does_not_store_them(v3):
    llama = tiny_model("llama")
    small_mla = tiny_model("deepseek_v3")  # kv_lora_rank 32, RoPE 8
    for name in ("fp8_ds_mla", "nvfp4_ds_mla"):
        for model, scheme, match in (
            (llama, f"vllm:{name}", "does not apply to standard attention"),
            (small_mla, f"vllm:{name}", "kv_lora_rank == 512"),
            (v3, f"vllm:{name}+rope=bf16", "drop \\+rope=bf16"),
        ):
            with pytest.raises(SchemeError, match=match) as e:
                with quantized_kv(model, scheme):
                    pass
            assert "\n" not in str(e.value)
