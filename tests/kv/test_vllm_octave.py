"""vLLM 0.33's Octave caches (``vllm:octave_k3v4``, ``octave_k3v3``, ``octave_k3v3_compact``) held byte for byte
against vLLM's own reference: ``vllm/v1/attention/ops/rocm_octave.py`` of the 0.33.0 wheel, loaded from its
source file on the CPU (the module imports torch only; vLLM itself is never imported), its
``reference_quantize`` slots and ``reference_dequantize`` values against evalkit's encoder and decoder;
``OctaveFormat.slot_bytes`` against evalkit's bytes; the sign pattern, the packing (a plain loop over the
layout the file documents), the scale's ``x . x_hat = |x|^2`` (float64), the rotary dims read from a config,
the storage cache (a short prefill reads the cache, a long one attends raw) and the one-line refusals.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
import transformers as tf

from evalkit.errors import SchemeError
from evalkit.integration.install import quantized_kv
from evalkit.kv.codecs.vllm import octave
from evalkit.kv.memory import bytes_per_token, check_layout_scheme, model_cache_bytes
from evalkit.kv.scheme import parse_scheme
from evalkit.models.info import kv_layout

from tests.tiny_models import VOCAB

NAMES = tuple(octave.PRESETS)


@pytest.fixture(scope="module")
def ref():
    """vLLM 0.33.0's rocm_octave.py, executed from the unpacked wheel's source without importing vLLM."""
    from tests.engines.vllm_wheels import RegistryUnreachable, vllm_source

    try:
        tree = vllm_source("0.33.0")
    except RegistryUnreachable as exc:
        pytest.skip(str(exc))
    spec = importlib.util.spec_from_file_location(
        "vllm_0_33_rocm_octave", tree / "vllm/v1/attention/ops/rocm_octave.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _kv(d: int, dtype: torch.dtype, seed: int = 0, s: int = 37) -> tuple[torch.Tensor, torch.Tensor]:
    """(2, 3, s, D) K and V over six decades of channel magnitudes, one all-zero (token, head), one outlier."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(2, 3, s, d, generator=g) * torch.logspace(-3, 2, d)[torch.randperm(d, generator=g)]
    v = torch.randn(2, 3, s, d, generator=g)
    k[0, 0, 0], v[0, 0, 0] = 0.0, 0.0
    k[1, 2, 5, 3], v[1, 1, 7, 0] = 3.0e3, -500.0
    return k.to(dtype), v.to(dtype)


def _as_tokens(x: torch.Tensor) -> torch.Tensor:
    """(B, H, S, X) -> the reference's (T, H, X), tokens in (batch, position) order."""
    b, h, s, n = x.shape
    return x.permute(0, 2, 1, 3).reshape(b * s, h, n)


def _from_tokens(x: torch.Tensor, b: int) -> torch.Tensor:
    t, h, n = x.shape
    return x.reshape(b, t // b, h, n).permute(0, 2, 1, 3)


LAYOUTS = ((64, 64), (64, 0), (128, 64), (128, 128), (256, 64), (192, 64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d,rope", LAYOUTS)
@pytest.mark.parametrize("name", NAMES)
def test_slots_and_read_back_equal_vllms_reference(ref, name, d, rope, dtype):
    if name.endswith("compact") and d & (d - 1):
        pytest.skip("compact K needs a power-of-two head_size (refused: see the refusal test)")
    lay = octave.layout(name, d, rope)
    k, v = _kv(d, dtype, seed=d + rope)
    qk, qv = octave.encode(name, k, "k", rope), octave.encode(name, v, "v", rope)
    fmt = ref.OctaveFormat.from_cache_dtype(name, d, rope)
    theirs = ref.reference_quantize(_as_tokens(k), _as_tokens(v), fmt)
    ours = octave.slot(qk.stored, qv.stored, lay)
    assert ours.dtype == torch.uint8 and torch.equal(_as_tokens(ours), theirs)  # every byte of every slot
    rk, rv = ref.reference_dequantize(theirs, fmt)
    assert torch.equal(qk.values, _from_tokens(rk, 2)) and torch.equal(qv.values, _from_tokens(rv, 2))
    # the decoder reads the bytes on its own: the same values, and split() undoes slot()
    sk, sv = octave.split(ours, lay)
    assert torch.equal(sk, qk.stored) and torch.equal(sv, qv.stored)
    assert torch.equal(octave.decode(name, sk, "k", d, rope), qk.values)
    assert torch.equal(octave.decode(name, sv, "v", d, rope), qv.values)


def test_bytes_equal_octave_format_slot_bytes_and_refusals_match(ref):
    """Every head size and rotary width in steps of 32 up to 512: evalkit's slot is OctaveFormat.slot_bytes (its
    K and V sides add up to it), and evalkit refuses exactly what OctaveFormat refuses."""
    for name in NAMES:
        for d in range(32, 513, 32):
            for rope in range(0, d + 1, 32):
                try:
                    want = ref.OctaveFormat.from_cache_dtype(name, d, rope).slot_bytes
                except ValueError:
                    with pytest.raises(SchemeError, match=f"vllm:{name} needs"):
                        octave.layout(name, d, rope)
                    continue
                lay = octave.layout(name, d, rope)
                assert lay.slot_bytes == want == lay.width("k") + lay.width("v"), (name, d, rope)
    # the figures of the format's docstring-level arithmetic, by hand: head 64 -> 72 / 64 / 52 bytes
    # (k3v4: 32 B of 4-bit K + 32 B of 4-bit V + 2 fp16 scales = 68, padded to 8), head 128 full rotary 136 / 120 / 100
    assert [octave.layout(n, 64).slot_bytes for n in NAMES] == [72, 64, 52]
    assert [octave.layout(n, 128).slot_bytes for n in NAMES] == [136, 120, 100]


def test_the_signs_are_vllms_seeded_draw(ref):
    for n in (64, 128, 256):
        assert torch.equal(octave.signs(n), ref.signs(n, "cpu"))
    # pinned: torch's CPU generator seeded 0x5E17 (rocm_octave.py:50, 183-186), bit i set where the sign is -1
    words = [int(w) & 0xFFFFFFFF for w in ref.sign_bits(128)]
    assert words == [0x82C270EB, 0x9E0D4635, 0x41D23DB1, 0x68C675E6]
    neg = (octave.signs(128) < 0).tolist()
    assert [sum(1 << i for i in range(32) if neg[32 * w + i]) for w in range(4)] == words


@pytest.mark.parametrize("bits", [3, 4])
def test_packing_is_the_documented_layout(bits):
    """A plain loop over the layout rocm_octave.py documents (lines 32-38), against evalkit's packer."""
    n = 64
    g = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 2**bits, (5, n), generator=g)
    want = []
    for row in codes.tolist():
        out = [0] * (n * bits // 8)
        if bits == 4:  # per 8 dims a word; byte j: dim j low nibble, dim j + 4 high nibble
            for dim, c in enumerate(row):
                word, pos = divmod(dim, 8)
                out[4 * word + pos % 4] |= c << (4 * (pos // 4))
        else:  # 2-bit plane (a word per 16 dims: dim 4i + j at byte j, bits 2i), then 1-bit plane (per 32 dims)
            for dim, c in enumerate(row):
                word, pos = divmod(dim, 16)
                out[4 * word + pos % 4] |= (c & 3) << (2 * (pos // 4))
                word, pos = divmod(dim, 32)
                out[n // 4 + 4 * word + pos % 4] |= (c >> 2) << (pos // 4)
        want.append(out)
    packed = octave.pack(codes, bits)
    assert packed.tolist() == want
    assert torch.equal(octave.unpack(packed, n, bits), codes)


@pytest.mark.parametrize("name", NAMES)
def test_the_scale_makes_x_dot_xhat_the_squared_norm(name):
    """In the rotated space, per scale block, sum(x * x_hat) = sum(x**2) up to the fp16 scale's rounding (float64)."""
    d = 128
    lay = octave.layout(name, d, 64)
    k, v = _kv(d, torch.float32, seed=3)
    for role, x, block in (("k", k, d if lay.compact else 64), ("v", v, d)):
        rot = octave.rotate(x, lay.k_block if role == "k" else lay.v_block).double()
        xhat = octave.rotate(octave.encode(name, x, role, 64).values, lay.k_block if role == "k" else lay.v_block)
        xs, hs = rot.reshape(-1, block), xhat.double().reshape(-1, block)
        norm2, dot = (xs * xs).sum(-1), (xs * hs).sum(-1)
        live = norm2 > 0
        assert torch.allclose(dot[live] / norm2[live], torch.ones_like(dot[live]), rtol=0, atol=2.0**-10)
        assert (hs[~live] == 0).all()


def test_the_rotary_dims_come_from_the_config():
    base = dict(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2)
    assert kv_layout(tf.LlamaConfig(**base, head_dim=128)).rotary_dim == 128  # no factor: vLLM's 1.0
    assert kv_layout(tf.LlamaConfig(**base, head_dim=128, partial_rotary_factor=0.5)).rotary_dim == 64
    cfg = tf.LlamaConfig(**base, head_dim=256)
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25}
    layout = kv_layout(cfg)
    assert layout.rotary_dim == 64  # Qwen3-Next's shape: the one the ROCm kernels take (256, 64)
    for name, v_bits in (("octave_k3v4", 4), ("octave_k3v3", 3)):
        # by hand: 64 dims x 4 bits + 192 x 3 = 104 B of K, 256 x v_bits / 8 of V, 4 + 1 fp16 scales, pad to 8
        slot = -(-(104 + 256 * v_bits // 8 + 10) // 8) * 8
        assert slot == (248 if v_bits == 4 else 216)
        assert bytes_per_token(layout, parse_scheme(f"vllm:{name}")) == 2 * 2 * slot
    assert bytes_per_token(kv_layout(tf.LlamaConfig(**base, head_dim=128)), parse_scheme("vllm:octave_k3v4")) == 4 * 136


def test_the_embedded_model_bytes_per_token():
    from evalkit.models.presets import PRESETS, config_namespace

    layout = kv_layout(config_namespace(PRESETS["smollm2-135m"]["config"]))
    assert (layout.head_dim, layout.rotary_dim, layout.num_layers, layout.num_kv_heads) == (64, 64, 30, 3)
    got = [bytes_per_token(layout, parse_scheme(f"vllm:{n}")) for n in NAMES]
    assert got == [30 * 3 * 72, 30 * 3 * 64, 30 * 3 * 52]  # 6,480 / 5,760 / 4,680 B against bf16's 23,040


def test_refusals_are_one_line():
    base = dict(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2)
    cases = (
        (
            tf.LlamaConfig(**base, head_dim=64, partial_rotary_factor=0.5),
            "vllm:octave_k3v4",
            "rotary dims in multiples",
        ),
        (tf.LlamaConfig(**base, head_dim=80), "vllm:octave_k3v3", "multiples of 64"),
        (tf.LlamaConfig(**base, head_dim=192), "vllm:octave_k3v3_compact", "power-of-two head_size"),
    )
    for cfg, text, needle in cases:
        with pytest.raises(SchemeError, match=needle) as err:
            check_layout_scheme(parse_scheme(text), kv_layout(cfg))
        assert "\n" not in str(err.value) and "use vllm:" in str(err.value)
    from tests.tiny_models import ds_mla_config

    with pytest.raises(SchemeError, match="standard-attention dtype"):
        check_layout_scheme(parse_scheme("vllm:octave_k3v4"), kv_layout(ds_mla_config()))


def _tiny(head_dim: int = 128, factor: float = 0.5):
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=head_dim,
        partial_rotary_factor=factor,
        max_position_embeddings=512,
    )
    return tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()


@pytest.mark.parametrize("name", NAMES)
@torch.inference_mode()
def test_the_storage_cache_reads_what_vllm_reads(ref, name):
    """A prefill of at most 128 tokens reads every token from the cache (vLLM's decode kernel serves it), a longer
    one attends its own K/V raw; later steps read the cache; the bytes held are the slots'. The model's 64 rotary
    dims of 128 reach the codec through the binding."""
    model = _tiny()
    fmt = ref.OctaveFormat.from_cache_dtype(name, 128, 64)
    for prefill, raw in ((40, False), (129, True)):
        k, v = _kv(128, torch.float32, seed=prefill, s=prefill)
        k, v = k[:1, :2], v[:1, :2]
        with quantized_kv(model, parse_scheme(f"vllm:{name}")) as session:
            cache = session.new_cache(torch.ones(1, prefill, dtype=torch.long))
            keys, values = cache.update(k, v, 0)
            rk, rv = ref.reference_dequantize(ref.reference_quantize(_as_tokens(k), _as_tokens(v), fmt), fmt)
            if raw:
                assert torch.equal(keys, k) and torch.equal(values, v)
            else:
                assert torch.equal(keys, _from_tokens(rk, 1)) and torch.equal(values, _from_tokens(rv, 1))
            step_k, step_v = _kv(128, torch.float32, seed=99)
            keys, values = cache.update(step_k[:1, :2, :1], step_v[:1, :2, :1], 0)
            both_k, both_v = torch.cat((k, step_k[:1, :2, :1]), 2), torch.cat((v, step_v[:1, :2, :1]), 2)
            rk, rv = ref.reference_dequantize(ref.reference_quantize(_as_tokens(both_k), _as_tokens(both_v), fmt), fmt)
            assert torch.equal(keys, _from_tokens(rk, 1)) and torch.equal(values, _from_tokens(rv, 1))
            layer = cache.storage_layers()[0]
            assert layer.k.nbytes() + layer.v.nbytes() == 2 * (prefill + 1) * fmt.slot_bytes
    layout = kv_layout(model.config)
    assert model_cache_bytes(layout, parse_scheme(f"vllm:{name}"), 10) == 2 * 2 * 10 * fmt.slot_bytes


def test_the_reference_ran_without_vllm(ref):
    """Loading and running the reference imported no part of vLLM (its one vLLM import, in
    ``registered_rope_dim``, is never reached: evalkit passes the rotary dims itself)."""
    assert ref.OctaveFormat(256, 64, 4).slot_bytes == octave.layout("octave_k3v4", 256, 64).slot_bytes
    assert not any(name == "vllm" or name.startswith("vllm.") for name in sys.modules)
