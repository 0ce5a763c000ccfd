"""llama.cpp's cache types (evalkit.kv.codecs.llamacpp.ggml_blocks, evalkit.kv.codecs.llamacpp.family) without llama.cpp: every
block type against a plain numpy reading of ggml's block layout and quantizer arithmetic (loops over
blocks and elements, float32 step by step), round trips, hand-checked bytes, the scheme strings and
refusals, and the storage cache of a tiny model holding exactly the codec's bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf

from evalkit import quantized_kv
from evalkit.errors import SchemeError
from evalkit.integration.hf_compat import output_cache
from evalkit.kv.codecs.llamacpp import ggml_blocks as gb
from evalkit.kv.memory import bytes_per_token, check_layout_scheme, model_cache_bytes
from evalkit.kv.scheme import parse_scheme, parse_schemes
from evalkit.models.info import kv_layout

F32 = np.float32
KVALUES = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
QUANTIZED = ["q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]


# -- a plain reading of ggml's quantizers ------------------------------------------------------------
def f16(v) -> bytes:
    return np.array([v], dtype=F32).astype(np.float16).tobytes()


def c_int(v: F32) -> int:
    """(int8_t)/(uint8_t) of a float on x86: truncation via int32 (INT_MIN when non-finite), low byte."""
    i = -(2**31) if not np.isfinite(v) or abs(v) >= 2**31 else int(np.trunc(v))
    return i & 0xFF


def signed_max(b):
    amax, mx = F32(0), F32(0)
    for v in b:
        if abs(v) > amax:
            amax, mx = abs(v), v
    return mx


def recip(d):
    with np.errstate(over="ignore", divide="ignore"):
        return F32(F32(1) / d) if d != 0 else F32(0)


def nibbles(q) -> bytes:
    return bytes((q[j] & 15) | ((q[j + 16] & 15) << 4) for j in range(16))


def qh(q) -> bytes:
    word = 0
    for i in range(32):
        word |= ((q[i] >> 4) & 1) << i
    return word.to_bytes(4, "little")


def ref_block(name: str, b: np.ndarray) -> bytes:
    b = b.astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        if name == "q8_0":
            amax = F32(max(abs(v) for v in b))
            d = F32(amax / F32(127))
            iscale = F32(F32(127) / amax) if amax != 0 else F32(0)
            q = []
            for v in b:
                p = F32(v * iscale)
                q.append(-128 if not np.isfinite(p) else int(np.clip(np.rint(p), -128, 127)))
            return f16(d) + bytes(x & 0xFF for x in q)
        if name in ("q4_0", "q5_0"):
            nmax, bias, top = (F32(-8), F32(8.5), 15) if name == "q4_0" else (F32(-16), F32(16.5), 31)
            d = F32(signed_max(b) / nmax)
            iscale = recip(d)
            q = []
            for v in b:
                c = c_int(F32(F32(v * iscale) + bias))
                c = c - 256 if c >= 128 else c
                q.append(min(top, c))
            return f16(d) + (b"" if name == "q4_0" else qh(q)) + nibbles(q)
        if name in ("q4_1", "q5_1"):
            lo, hi = F32(np.finfo(F32).max), F32(-np.finfo(F32).max)
            for v in b:
                lo, hi = min(lo, v), max(hi, v)
            levels = F32(15) if name == "q4_1" else F32(31)
            d = F32(F32(hi - lo) / levels)
            iscale = recip(d)
            q = []
            for v in b:
                c = c_int(F32(F32(F32(v - lo) * iscale) + F32(0.5)))
                if name == "q4_1":
                    c = min(15, c - 256 if c >= 128 else c)
                q.append(c)
            return f16(d) + f16(lo) + (b"" if name == "q4_1" else qh(q)) + nibbles(q)
    raise AssertionError(name)


def ref_best_index(x: F32) -> int:
    if x <= KVALUES[0]:
        return 0
    if x >= KVALUES[15]:
        return 15
    ml, mu = 0, 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < KVALUES[mav]:
            mu = mav
        else:
            ml = mav
    return mu - 1 if F32(x - F32(KVALUES[mu - 1])) < F32(F32(KVALUES[mu]) - x) else mu


def ref_iq4_nl_row(row: np.ndarray) -> bytes:
    out, L = b"", [0] * 32
    for blk in row.astype(F32).reshape(-1, 32):
        amax, mx = F32(0), F32(0)
        for v in blk:
            if abs(v) > amax:
                amax, mx = abs(v), v
        if amax < 1e-15:
            out += f16(0) + nibbles(L)  # the previous block's indices, as ggml packs them
            continue
        d = F32(mx / F32(-127))
        iscale = F32(F32(1) / d)
        sumqx = sumq2 = F32(0)
        for j, v in enumerate(blk):
            L[j] = ref_best_index(F32(iscale * v))
            q, w = F32(KVALUES[L[j]]), F32(v * v)
            sumqx = F32(sumqx + F32(F32(w * q) * v))
            sumq2 = F32(sumq2 + F32(F32(w * q) * q))
        out += f16(F32(sumqx / sumq2)) + nibbles(L)
    return out


def ref_row(name: str, row: np.ndarray) -> bytes:
    if name == "iq4_nl":
        return ref_iq4_nl_row(row)
    if name == "f16":
        return row.astype(F32).astype(np.float16).tobytes()
    if name == "f32":
        return row.astype(F32).tobytes()
    if name == "bf16":
        out = b""
        for u in row.astype(F32).view(np.uint32).tolist():
            h = (u >> 16) | 64 if (u & 0x7FFFFFFF) > 0x7F800000 else (u + 0x7FFF + ((u >> 16) & 1)) >> 16
            out += (h & 0xFFFF).to_bytes(2, "little")
        return out
    return b"".join(ref_block(name, b) for b in row.reshape(-1, 32))


def ref_decode_block(name: str, blk: bytes) -> np.ndarray:
    d = np.frombuffer(blk[:2], np.float16).astype(F32)[0]
    lo = lambda qs: [qs[j] & 15 for j in range(16)] + [qs[j] >> 4 for j in range(16)]  # noqa: E731
    if name == "q8_0":
        return np.array([F32(F32(q) * d) for q in np.frombuffer(blk[2:], np.int8)], F32)
    if name == "q4_0":
        return np.array([F32(F32(q - 8) * d) for q in lo(blk[2:])], F32)
    if name == "iq4_nl":
        return np.array([F32(d * F32(KVALUES[q])) for q in lo(blk[2:])], F32)
    m = np.frombuffer(blk[2:4], np.float16).astype(F32)[0]
    if name == "q4_1":
        return np.array([F32(F32(F32(q) * d) + m) for q in lo(blk[4:])], F32)
    if name == "q5_0":
        h = int.from_bytes(blk[2:6], "little")
        return np.array([F32(F32((q | (((h >> i) & 1) << 4)) - 16) * d) for i, q in enumerate(lo(blk[6:]))], F32)
    h = int.from_bytes(blk[4:8], "little")
    return np.array([F32(F32(F32(q | (((h >> i) & 1) << 4)) * d) + m) for i, q in enumerate(lo(blk[8:]))], F32)


def rows(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = [rng.standard_normal((3, 128)) * s for s in (1e-3, 1.0, 30.0, 1e4)]
    ties = np.tile([127.0, 0.5, 1.5, 2.5, -2.5, -0.5, 3.5, -3.5], 16)
    out.append(np.stack([ties, np.tile(np.arange(-8, 8) + 0.5, 8)]))
    z = np.zeros((2, 128))
    z[0, 32:64] = rng.standard_normal(32)  # a zero block on each side of a real one
    out.append(z)
    out.append(rng.standard_normal((3, 128)) * np.array([[1e-40], [1e-30], [3e7]]))
    return np.concatenate(out).astype(F32)


# -- the block types -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(gb.TYPES))
def test_each_type_encodes_as_a_plain_reading_of_ggml(name):
    x = rows()
    got = gb.encode(name, torch.from_numpy(x)).numpy()
    assert got.shape == (x.shape[0], gb.TYPES[name].row_bytes(128))
    for i, row in enumerate(x):
        if name == "iq4_nl" and not np.abs(row[:32]).max() >= 1e-15:
            continue  # a row's first zero block: ggml packs stale stack bytes (d = 0 all the same)
        assert got[i].tobytes() == ref_row(name, row), (name, i)


@pytest.mark.parametrize("name", QUANTIZED)
def test_decode_reads_the_blocks_as_ggml_and_round_trips(name):
    x = rows(1)
    b = gb.encode(name, torch.from_numpy(x))
    y = gb.decode(name, b).numpy()
    per = gb.TYPES[name].nbytes
    for i in range(x.shape[0]):
        with np.errstate(all="ignore"):  # the 3e7 rows overflow fp16's d: inf and NaN, read alike
            want = np.concatenate(
                [ref_decode_block(name, b[i, j : j + per].numpy().tobytes()) for j in range(0, b.shape[1], per)]
            )
        assert np.array_equal(y[i].view(np.uint32), want.view(np.uint32)), (name, i)
    n = np.random.default_rng(2).standard_normal((4, 64)).astype(F32)
    err = np.abs(gb.decode(name, gb.encode(name, torch.from_numpy(n))).numpy() - n).max()
    assert err < {"q8_0": 0.02, "q5_0": 0.15, "q5_1": 0.15}.get(name, 0.4)


def test_plain_types_round_trip():
    x = torch.randn(3, 40)
    assert torch.equal(gb.decode("f32", gb.encode("f32", x)), x)
    assert torch.equal(gb.decode("f16", gb.encode("f16", x)), x.half().float())
    assert torch.equal(gb.decode("bf16", gb.encode("bf16", x)), x.bfloat16().float())  # RNE both
    nan = torch.tensor([float("nan")]).view(torch.int32) | 0x1234
    assert gb.encode("bf16", nan.view(torch.float32)).tolist() == [0xC0, 0x7F]  # (bits >> 16) | 64


def test_hand_checked_blocks():
    x = np.zeros(32, F32)
    x[:8] = [127, 0.5, 1.5, 2.5, -2.5, -0.5, 3.5, -3.5]
    b = gb.encode("q8_0", torch.from_numpy(x)).numpy()
    assert b[:2].tobytes() == b"\x00\x3c"  # d = 1.0
    assert b[2:10].view(np.int8).tolist() == [127, 0, 2, 2, -2, 0, 4, -4]  # half to even
    # q4_0: max -8 -> d = 1, element 0 -> code 0 (low nibble of byte 0), element 16 = 7 -> code 15 (high)
    y = np.zeros(32, F32)
    y[0], y[1], y[16], y[17] = -8, 1, 7, 7.5
    q = gb.encode("q4_0", torch.from_numpy(y)).numpy()
    assert q[:2].tobytes() == b"\x00\x3c"
    assert q[2] == 0x0 | (15 << 4) and q[3] == 9 | (15 << 4)  # 7.5 + 8.5 = 16 clamps to 15
    assert q[4] == 8 | (8 << 4)
    # q5_0: d = max / -16 = 1 for max -16; code 31 for 15 has bit 4 set: qh bit 16
    z = np.zeros(32, F32)
    z[0], z[16], z[3] = -16, 15, 1
    q5 = gb.encode("q5_0", torch.from_numpy(z)).numpy()
    word = int.from_bytes(q5[2:6].tobytes(), "little")
    codes = [16] * 32
    codes[0], codes[16], codes[3] = 0, 31, 17
    assert word == sum(((c >> 4) & 1) << i for i, c in enumerate(codes))
    assert (word >> 16) & 1 and not word & 1 and (word >> 3) & 1
    assert q5[6] == (0 | (31 & 15) << 4) and q5[9] == (1 | 0 << 4)
    # q5_1: min 0 max 31 -> d = 1, m = 0, codes = the values, bit 4 of 16..31 in qh
    w = np.arange(32, dtype=F32)
    q51 = gb.encode("q5_1", torch.from_numpy(w)).numpy()
    assert q51[:4].tobytes() == f16(1.0) + f16(0.0)
    assert int.from_bytes(q51[4:8].tobytes(), "little") == 0xFFFF0000
    assert q51[8:].tolist() == [j | (j << 4) for j in range(16)]


def test_iq4_nl_zero_blocks_repeat_the_rows_last_indices():
    x = np.zeros(128, F32)
    x[32:64] = np.linspace(-1, 1, 32, dtype=F32)
    b = gb.encode("iq4_nl", torch.from_numpy(x)).numpy().reshape(4, 18)
    assert (b[0] == 0).all()  # a row's first zero block: d = 0, index 0
    assert (b[2:, :2] == 0).all() and (b[2:, 2:] == b[1, 2:]).all()
    assert not gb.decode("iq4_nl", torch.from_numpy(b.reshape(-1))).numpy()[64:].any()


def test_the_rotation_is_the_normalised_sylvester_matrix_scaled_first():
    x = torch.randn(5, 256)
    for n in (64, 128, 256):
        h = gb.hadamard_matrix(n)
        want = (x.double().reshape(5, -1, n) @ h).reshape(5, 256)
        assert torch.allclose(gb.fwht_llamacpp(x, n).double(), want, atol=1e-5)
        scaled = (x.reshape(5, -1, n) * gb._inv_sqrtf(n)).numpy()  # butterflies on x * (1/sqrtf(n)), by hand
        for length in [2**i for i in range(int(np.log2(n)))]:
            for i in range(0, n, 2 * length):
                u = scaled[..., i : i + length].copy()
                v = scaled[..., i + length : i + 2 * length].copy()
                scaled[..., i : i + length], scaled[..., i + length : i + 2 * length] = u + v, u - v
        assert np.array_equal(gb.fwht_llamacpp(x, n).numpy(), scaled.reshape(5, 256))
    assert gb.k_rotation(64) == 64 and gb.k_rotation(128) == 128 and gb.k_rotation(192) == 64
    assert gb.k_rotation(80) == 0 and gb.v_rotation(128) == 64 and gb.v_rotation(96) == 0


def test_the_block_table():
    assert {n: (t.ggml_type, t.block, t.nbytes) for n, t in gb.TYPES.items()} == {
        "f32": (0, 1, 4), "f16": (1, 1, 2), "bf16": (30, 1, 2), "q8_0": (8, 32, 34), "q4_0": (2, 32, 18),
        "q4_1": (3, 32, 20), "iq4_nl": (20, 32, 18), "q5_0": (6, 32, 22), "q5_1": (7, 32, 24),
    }  # fmt: skip


# -- schemes -------------------------------------------------------------------------------------
def test_scheme_strings_round_trip():
    for text, canonical in (
        ("llamacpp:q8_0", "llamacpp:q8_0"),
        ("llamacpp:q8_0/q8_0", "llamacpp:q8_0"),
        ("llamacpp:q8_0/q4_0", "llamacpp:q8_0/q4_0"),
        ("llamacpp:iq4_nl+skip=3,0", "llamacpp:iq4_nl+skip=0,3"),
        ("llamacpp:f16/q5_1+skip=sliding", "llamacpp:f16/q5_1+skip=sliding"),
        ("llamacpp:f32", "llamacpp:f32"),
    ):
        s = parse_scheme(text)
        assert str(s) == canonical and parse_scheme(canonical) == s
    assert [str(s) for s in parse_schemes("llamacpp:q8_0+skip=0,1,llamacpp:q4_0/q4_1,bf16")] == [
        "llamacpp:q8_0+skip=0,1",
        "llamacpp:q4_0/q4_1",
        "bf16",
    ]
    assert parse_scheme("llamacpp:q8_0") != parse_scheme("llamacpp:q8_0/q4_0")


@pytest.mark.parametrize(
    "text, words",
    [
        ("llamacpp:q3_K", "use one of f32, f16, bf16, q8_0"),
        ("llamacpp:q8_0/", "malformed"),
        ("llamacpp:q8_0/q4_0/q4_0", "malformed"),
        ("llamacpp:q8_0+rounding=rtz", "does not apply"),
        ("int4/group32/dynamic+recipe=llamacpp_q4_0_q4_0", "write llamacpp:q4_0"),
    ],
)
def test_refusals_are_one_line(text, words):
    with pytest.raises(SchemeError, match=words) as e:
        parse_scheme(text)
    assert "\n" not in str(e.value)


def test_head_dim_and_mla_refusals():
    layout = kv_layout(_llama(48).config)
    with pytest.raises(SchemeError, match="do not divide head_dim 48") as e:
        check_layout_scheme(parse_scheme("llamacpp:q8_0"), layout)
    assert "\n" not in str(e.value)
    check_layout_scheme(parse_scheme("llamacpp:f16"), layout)  # unquantized types take any head_dim
    from evalkit.kv.codec import check_layout

    with pytest.raises(SchemeError, match="multi-head latent attention"):
        check_layout(parse_scheme("llamacpp:q8_0"), True, (512, 64))


def test_bytes_per_token_are_the_block_sizes():
    layout = kv_layout(_llama(64, layers=3).config)  # 2 KV heads of 64
    for k, v in (("q8_0", "q8_0"), ("q8_0", "q4_0"), ("f16", "q5_1"), ("iq4_nl", "bf16"), ("f32", "q4_1")):
        want = 3 * 2 * (gb.TYPES[k].row_bytes(64) + gb.TYPES[v].row_bytes(64))
        assert bytes_per_token(layout, parse_scheme(f"llamacpp:{k}/{v}")) == want
    assert bytes_per_token(layout, parse_scheme("llamacpp:q8_0")) == 3 * 2 * 2 * 68
    assert bytes_per_token(layout, parse_scheme("llamacpp:q4_0+skip=0")) == 2 * 2 * 2 * 36 + 2 * 2 * 128


# -- the storage cache -----------------------------------------------------------------------------
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
    "scheme, head_dim", [("llamacpp:q8_0/q4_0", 64), ("llamacpp:iq4_nl/q5_1", 128), ("llamacpp:f16/q4_1", 64)]
)
@torch.no_grad()
def test_the_storage_cache_holds_the_codecs_bytes(scheme, head_dim):
    model = _llama(head_dim)
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    with quantized_kv(model, "auto"):
        base = model(ids[:, :9])
        raw = [(layer.k.values.clone(), layer.v.values.clone()) for layer in output_cache(base).layers]
    s = parse_scheme(scheme)
    k_type, v_type = scheme.removeprefix("llamacpp:").split("/")
    with quantized_kv(model, scheme):
        out = model(ids[:, :9])
        cache = output_cache(out)
        model(ids[:, 9:], cache=cache, use_cache=True)
    layer = cache.layers[0]
    for st, x, t, nrot in (
        (layer.k, raw[0][0], k_type, gb.k_rotation(head_dim) if t_quant(k_type) else 0),
        (layer.v, raw[0][1], v_type, 64 if t_quant(v_type) else 0),
    ):
        assert st.codes.shape == (2, 2, 12, gb.TYPES[t].row_bytes(head_dim))
        y = gb.fwht_llamacpp(x.float(), nrot) if nrot else x.float()
        rows_ = y.permute(0, 2, 1, 3).reshape(2, 9, -1).numpy()  # one ggml row per token, heads in order
        want = np.stack([np.frombuffer(ref_row(t, r), np.uint8) for r in rows_.reshape(-1, rows_.shape[-1])])
        want = want.reshape(2, 9, 2, -1).transpose(0, 2, 1, 3)
        assert np.array_equal(st.codes[:, :, :9].numpy(), want)
        assert torch.equal(st.decoded(), st.values.float())
        # the values are the dequantized bytes rotated back: close to the unquantized K/V
        err = (st.values[:, :, :9].float() - x.float()).abs().max() / x.float().abs().max()
        assert err < {"f16": 1e-3, "q8_0": 0.02}.get(t, 0.2)
    assert cache.nbytes() == model_cache_bytes(kv_layout(model.config), s, 12, batch=2)
    assert not torch.equal(out.logits, base.logits)


def t_quant(name: str) -> bool:
    return gb.TYPES[name].quantized
