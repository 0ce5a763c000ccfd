"""vllm:int4_per_token_head, vllm:turboquant_* and vllm:ultraquant_4bit: each store's bytes against
an independent numpy reading of vLLM's kernel (float32 step by step: the butterflies written out as
loops, the bit packing by hand), the Lloyd-Max codebook against the optimality conditions, the
scheme strings and refusals, the bytes per token, and the storage path of a tiny model."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
import transformers as tf
from scipy import stats

from evalkit import quantized_kv
from evalkit.errors import SchemeError
from evalkit.integration.hf_compat import output_cache
from evalkit.kv.codecs.vllm.turboquant import codebook
from evalkit.kv.memory import bytes_per_token, check_layout_scheme, model_cache_bytes
from evalkit.kv.quantize import dequantize, quantize
from evalkit.kv.scheme import parse_scheme
from evalkit.models.info import kv_layout

F32 = np.float32
ROTATED = ["int4_per_token_head", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"]
ALL = [*ROTATED, "ultraquant_4bit"]
TQ = {"turboquant_k8v4": (8, 4, False), "turboquant_4bit_nc": (4, 4, True), "turboquant_k3v4_nc": (3, 4, True)}
TQ["turboquant_3bit_nc"] = (3, 3, True)


# -- independent readings of the kernels ---------------------------------------------------------
def np_butterfly(x: np.ndarray, c: np.float32 | None = None) -> np.ndarray:
    """fast_hadamard_transform's butterfly, pair by pair: (a + b, a - b), times c after each stage if given."""
    x = x.astype(F32).copy()
    d, h = x.shape[-1], 1
    while h < d:
        for i in range(0, d, 2 * h):
            a, b = x[..., i : i + h].copy(), x[..., i + h : i + 2 * h].copy()
            x[..., i : i + h], x[..., i + h : i + 2 * h] = a + b, a - b
            if c is not None:
                x[..., i : i + h] *= c
                x[..., i + h : i + 2 * h] *= c
        h *= 2
    return x


def np_pairwise_sum(x: np.ndarray) -> np.ndarray:
    """Sum over the last axis (a power of two), float32: the upper half added onto the lower half until one is left."""
    x = x.astype(F32)
    while x.shape[-1] > 1:
        h = x.shape[-1] // 2
        x = (x[..., :h] + x[..., h:]).astype(F32)
    return x


def vllm_signs(d: int) -> np.ndarray:
    """_get_rht_signs(d, 0): a CPU generator seeded 0x9E3779B9, bernoulli(0.5) -> 2b - 1."""
    gen = torch.Generator().manual_seed(0x9E3779B9)
    return (2.0 * torch.bernoulli(torch.full((d,), 0.5), generator=gen) - 1.0).numpy()


def np_nibbles(q: np.ndarray) -> np.ndarray:
    q = q.astype(np.uint8)
    return q[..., 0::2] | (q[..., 1::2] << 4)


def np_3bit(q: np.ndarray) -> np.ndarray:
    out = []
    for g in range(q.shape[-1] // 8):
        word = sum(q[..., 8 * g + j].astype(np.int64) << (3 * j) for j in range(8))
        out += [word & 0xFF, (word >> 8) & 0xFF, (word >> 16) & 0xFF]
    return np.stack(out, axis=-1).astype(np.uint8)


def half_away(t):
    return np.trunc(np.where(t >= 0, t + F32(0.5), t - F32(0.5)).astype(F32))


def np_int4(x: np.ndarray) -> np.ndarray:
    """reshape_and_cache_int4 + _reshape_cache_int4_kernel, for a power-of-two or blocked head: bytes."""
    d = x.shape[-1]
    b = d & -d
    blocks = x.reshape(*x.shape[:-1], d // b, b)
    y = np_butterfly(blocks * vllm_signs(b).astype(F32)).reshape(x.shape)
    lo, hi = y.min(-1, keepdims=True), y.max(-1, keepdims=True)
    scale = np.maximum(((hi - lo).astype(F32) / F32(15)).astype(F32), F32(1e-6))
    zp = np.clip(half_away((-lo / scale).astype(F32)), 0, 15)
    s = ((y * (F32(1) / scale).astype(F32)).astype(F32) + zp).astype(F32)
    q = np.clip(half_away(s), 0, 15)
    stego = ((scale.view(np.int32) & -16) | zp.astype(np.int32)).view(np.float32)
    return np.concatenate([np_nibbles(q), stego.view(np.uint8)], axis=-1)


def np_value(v: np.ndarray, bits: int) -> np.ndarray:
    """_store_quantized_value: division, round half up, float16 scale and min."""
    top = F32(2**bits - 1)
    lo = v.min(-1, keepdims=True)
    scale = ((v.max(-1, keepdims=True) - lo).astype(F32) / top).astype(F32)
    scale = np.where(scale > F32(1e-8), scale, F32(1e-8)).astype(F32)
    q = np.clip(np.trunc(((v - lo) / scale).astype(F32) + F32(0.5)), 0, top)
    data = np_nibbles(q) if bits == 4 else np_3bit(q.astype(np.int64))
    return np.concatenate([data, scale.astype(np.float16).view(np.uint8), lo.astype(np.float16).view(np.uint8)], -1)


def np_tq_key(k: np.ndarray, name: str) -> np.ndarray:
    kb = TQ[name][0]
    if kb == 8:
        return np.clip(k, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    d = k.shape[-1]
    norm = np.sqrt(np_pairwise_sum(k * k))  # the launcher's torch norm, in evalkit's fixed order
    xhat = (k / (norm + F32(1e-8))).astype(F32)
    y = (np_butterfly(xhat) * (F32(1) / F32(math.sqrt(d)))).astype(F32)
    _, mid = codebook(d, kb)
    idx = np.searchsorted(mid.numpy(), y, side="right")  # how many midpoints are <= y
    data = np_nibbles(idx) if kb == 4 else np_3bit(idx)
    return np.concatenate([data, norm.astype(np.float16).view(np.uint8)], axis=-1)


SORTED_TO_BITS = (15, 14, 13, 12, 11, 10, 9, 0, 1, 2, 3, 4, 5, 6, 7)  # ultraquant/format.py
FP4_SORTED = (-6, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, 4, 6)


def np_ultraquant(x: np.ndarray, rotate: bool) -> np.ndarray:
    y = np_butterfly(x, F32(0.7071067811865476)) if rotate else x.astype(F32)
    g = y.reshape(*y.shape[:-1], -1, 32)
    amax = np.abs(g).max(-1)
    zero = amax == 0
    s_raw = (amax * F32(0.156)).astype(F32)
    e = np.floor(np.log2(np.where(zero, F32(1), s_raw)).astype(F32) + F32(0.5))
    div = np.where(zero, F32(1), np.exp2(e).astype(F32))
    z = (g / div[..., None]).astype(F32)
    mids = [F32((FP4_SORTED[i] + FP4_SORTED[i + 1]) / 2) for i in range(14)]
    idx = sum((z > m).astype(np.int64) for m in mids)
    idx = np.where(zero[..., None], 7, idx)
    bits = np.array(SORTED_TO_BITS)[idx].reshape(y.shape)
    byte = np.where(zero, 0, e + 127)
    byte = np.where((byte < 0) | (byte > 255), 0, byte).astype(np.uint8)
    return np.concatenate([np_nibbles(bits), byte], axis=-1)


def sample(d: int = 64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 11, d, generator=g) * torch.logspace(-3, 2, 11)[None, None, :, None]
    x[0, 0, 0] = 0.0  # an all-zero head
    x[0, 1, 1, :] = 2.0  # a constant head: zero range
    x[1, 2, 3, 5] = 300.0  # one outlier channel
    return x


def stored(name: str, x: torch.Tensor, role: str) -> np.ndarray:
    s = parse_scheme(f"vllm:{name}")
    return quantize(x, s.kv_format, s.granularity, role=role).stored.numpy()


# -- the stores, byte for byte -------------------------------------------------------------------
@pytest.mark.parametrize("d", [64, 96])
def test_int4_bytes_equal_a_plain_reading_of_the_kernel(d):
    x = sample(d)
    for role in "kv":
        assert np.array_equal(stored("int4_per_token_head", x, role), np_int4(x.numpy()))


@pytest.mark.parametrize("name", list(TQ))
def test_turboquant_bytes_equal_a_plain_reading_of_the_kernel(name):
    x = sample(64)
    assert np.array_equal(stored(name, x, "k"), np_tq_key(x.numpy(), name))
    assert np.array_equal(stored(name, x, "v"), np_value(x.numpy(), TQ[name][1]))


def test_ultraquant_bytes_equal_a_plain_reading_of_the_kernel():
    x = sample(64).to(torch.bfloat16)  # the kernel takes bf16 K/V
    xf = x.float().numpy()
    assert np.array_equal(stored("ultraquant_4bit", x, "k"), np_ultraquant(xf, rotate=True))
    assert np.array_equal(stored("ultraquant_4bit", x, "v"), np_ultraquant(xf, rotate=False))


def test_the_signs_and_rotations_are_the_sylvester_hadamard():
    from evalkit.kv import hadamard

    h = np.array([[1.0]])
    while h.shape[0] < 64:
        h = np.block([[h, h], [h, -h]])
    x = np.random.default_rng(0).standard_normal((5, 64))
    assert np.array_equal(hadamard.rht_signs(64).numpy(), vllm_signs(64))
    ours = hadamard.single_rht(torch.tensor(x, dtype=torch.float32)).numpy()
    assert np.allclose(ours, (x * vllm_signs(64)) @ h.T, atol=1e-4)
    y = torch.tensor(x, dtype=torch.float32)
    assert torch.allclose(hadamard.single_rht_inverse(hadamard.single_rht(y)), y, atol=1e-5)
    for fn in (hadamard.fwht_orthonormal, hadamard.fwht_orthonormal_stagewise):
        assert np.allclose(fn(y).numpy(), x @ h / 8, atol=1e-5)


@pytest.mark.parametrize("d,bits", [(64, 3), (64, 4), (128, 3), (128, 4)])
def test_the_codebook_meets_the_lloyd_max_conditions_for_n_0_1_over_d(d, bits):
    c, mid = (t.double().numpy() for t in codebook(d, bits))
    sigma = 1 / math.sqrt(d)
    edges = np.concatenate([[-np.inf], mid, [np.inf]]) / sigma
    mean = sigma * (stats.norm.pdf(edges[:-1]) - stats.norm.pdf(edges[1:])) / np.diff(stats.norm.cdf(edges))
    assert len(c) == 2**bits and np.all(np.diff(c) > 0) and np.allclose(c, -c[::-1], atol=1e-6)
    # each centroid the mean of its cell; the engine's trapezoid rule (200 intervals, the outer cells cut at
    # 10.5 sigma) puts the outermost ones within 1e-3 sigma of it, the inner ones within 1e-5 sigma
    assert np.allclose(c, mean, atol=1e-3 * sigma) and np.allclose(c[1:-1], mean[1:-1], atol=1e-5 * sigma)


@pytest.mark.parametrize("name", ALL)
def test_the_read_values_decode_the_bytes_and_approximate_the_input(name):
    from evalkit.kv.codec import codec_for

    s = parse_scheme(f"vllm:{name}")
    x = torch.randn(2, 3, 7, 64, generator=torch.Generator().manual_seed(2))
    for role in "kv":
        q = quantize(x, s.kv_format, s.granularity, role=role)
        assert torch.equal(codec_for(s.recipe).decode(q.stored, role, 64), dequantize(q))
        err = float((dequantize(q) - x).norm() / x.norm())
        assert err < 0.25, (role, err)


def test_int4_dequantizes_with_the_masked_scale_and_the_hidden_zero_point():
    x = sample(64)
    got = parse_scheme("vllm:int4_per_token_head")
    q = quantize(x, got.kv_format, got.granularity)
    raw = np_int4(x.numpy())
    codes = np.stack([raw[..., :32] & 15, raw[..., :32] >> 4], -1).reshape(*x.shape).astype(np.float64)
    bits = raw[..., 32:].copy().view(np.int32)
    scale, zp = (bits & -16).view(np.float32).astype(np.float64), (bits & 15).astype(np.float64)
    h = np.array([[1.0]])
    while h.shape[0] < 64:
        h = np.block([[h, h], [h, -h]])
    want = (((codes - zp) * scale) @ h.T) * vllm_signs(64) / 64  # D H y / b
    assert np.allclose(q.values.numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


# -- schemes, refusals, bytes --------------------------------------------------------------------
def test_scheme_strings_round_trip():
    for name in ALL:
        for text in (f"vllm:{name}", f"vllm:{name}+skip=5"):
            assert str(parse_scheme(text)) == text and parse_scheme(str(parse_scheme(text))) == parse_scheme(text)


def _llama(head_dim: int, layers: int = 2, kv_heads: int = 2):
    cfg = tf.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(cfg).eval()


@pytest.mark.parametrize(
    "name,head_dim,words",
    [
        ("int4_per_token_head", 16, "head_size >= 32"),
        ("turboquant_4bit_nc", 96, "power-of-two head_size"),
        ("turboquant_k8v4", 12, "multiple of 8"),
        ("ultraquant_4bit", 48, "power-of-two head_size"),
    ],
)
def test_a_head_size_the_kernel_does_not_take_is_refused_in_one_line(name, head_dim, words):
    with pytest.raises(SchemeError) as e:
        check_layout_scheme(parse_scheme(f"vllm:{name}"), kv_layout(_llama(head_dim).config))
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", ALL)
def test_mla_models_and_foreign_recipes_are_refused_in_one_line(name):
    mla = tf.DeepseekV3Config(
        vocab_size=64, hidden_size=64, num_hidden_layers=1, num_attention_heads=2, kv_lora_rank=32
    )
    with pytest.raises(SchemeError, match="no MLA backend") as e:
        check_layout_scheme(parse_scheme(f"vllm:{name}"), kv_layout(mla))
    assert "\n" not in str(e.value)
    with pytest.raises(SchemeError, match=f"write vllm:{name}"):
        parse_scheme(f"int8/token/dynamic+recipe=vllm_{name}")


def test_bytes_per_token_are_the_slots_and_boundary_layers_stay_bf16():
    layout = kv_layout(_llama(64, layers=6).config)
    h, bf16_layer = 2, 2 * 2 * 2 * 64  # K and V, 2 heads, 2 bytes
    slots = {  # K + V bytes per (token, head), vLLM's customize_spec
        "int4_per_token_head": 32 + 32 + 8,
        "turboquant_k8v4": 64 + 32 + 4,
        "turboquant_4bit_nc": 32 + 2 + 32 + 4,
        "turboquant_k3v4_nc": 24 + 2 + 32 + 4,
        "turboquant_3bit_nc": 24 + 2 + 24 + 4,
        "ultraquant_4bit": 2 * (32 + 2),
    }
    for name, slot in slots.items():
        boundary = 0 if name.startswith("int4") else 4  # layers 0, 1, 4, 5
        want = (6 - boundary) * h * slot + boundary * bf16_layer
        assert bytes_per_token(layout, parse_scheme(f"vllm:{name}")) == want, name


# -- the storage path ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
@torch.no_grad()
def test_the_storage_path_stores_the_kernels_bytes_and_reads_them_back(name):
    model = _llama(64, layers=6)
    if name == "ultraquant_4bit":
        model = model.to(torch.bfloat16)
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    with quantized_kv(model, "auto"):
        base = model(ids[:, :9])
        raw = [layer.k.values.clone() for layer in output_cache(base).layers]
    scheme = parse_scheme(f"vllm:{name}")
    with quantized_kv(model, str(scheme)):
        out = model(ids[:, :9])
        cache = output_cache(out)
        model(ids[:, 9:], cache=cache, use_cache=True)
    tq = not name.startswith("int4")
    layers = cache.layers
    assert [layer.active for layer in layers] == ([False, False, True, True, False, False] if tq else [True] * 6)
    i = 2 if tq else 0  # the first quantized layer whose prefill K equals the unquantized run's
    k = layers[i].k
    assert k.codes.shape[2] == 12
    ref = {
        "int4_per_token_head": lambda r: np_int4(r),
        "ultraquant_4bit": lambda r: np_ultraquant(r, rotate=True),
    }.get(name, lambda r: np_tq_key(r, name))
    assert np.array_equal(k.codes[:, :, :9].numpy(), ref(raw[i].float().numpy()))
    for layer in layers:
        for st in (layer.k, layer.v):
            assert torch.allclose(st.decoded(), st.values.float(), rtol=1e-2 if tq else 1e-6, atol=1e-6)
    assert cache.nbytes() == model_cache_bytes(kv_layout(model.config), scheme, 12, batch=2)
    # TurboQuant/UltraQuant attend a first-chunk prefill from the raw K/V; INT4 reads its cache
    assert torch.equal(out.logits, base.logits) == tq
