"""FP4 / microscaling KV schemes through the one quantization core, against references written here.

Every new scheme (nvfp4, mxfp4, mxfp8_e4m3, sglang_fp4, and fp4_e2m1 with fp32 or one-level e4m3
scales) is quantized by ``evalkit.kv.quantize`` and compared bit for bit with an independent numpy
quantizer of one scale group at a time: element rounding by ml_dtypes' casts (float4_e2m1fn,
float8_e4m3fn) or, for SGLang's ties-away rule, a nearest-value search over the E2M1 table; E4M3
scales by ml_dtypes; E8M0 scales by a float64 search for floor(log2(amax)) and checked to be
exact float8_e8m0fnu values; NVFP4's global scale as ModelOpt's formula in float32. Then: edge
values (ties, saturation, zeros, negative zero, NaN), the stored bytes against ml_dtypes' own
4-bit codes, the scheme strings, one-line CLI errors, and a perplexity run through the storage
path on a tiny model whose head_dim (32) fits every scheme.
"""

from __future__ import annotations

import json
import math

import ml_dtypes
import numpy as np
import pytest
import torch
import transformers as tf

from evalkit.cli import main
from evalkit.errors import SchemeError
from evalkit.kv.quantize import decode, dequantize, encode, quantize, quantize_dequantize
from evalkit.kv.scheme import NAMED_SCHEMES, parse_scheme

from tests.tiny_models import save_llama_dir

F32 = np.float32
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # the format's definition (OCP MX v1.0)
NEW = [
    "nvfp4",
    "mxfp4",
    "mxfp8_e4m3",
    "sglang_fp4",
    "fp4_e2m1/group16/dynamic",
    "fp4_e2m1/group16/dynamic+scale_dtype=e4m3",
    "fp8_e5m2/group32/dynamic+scale_dtype=e8m0",
]


# ---------------------------------------------------------------------------------------------
# The independent reference: one group at a time, numpy float32 and ml_dtypes
# ---------------------------------------------------------------------------------------------
def floor_log2(a: float) -> int:
    """floor(log2(a)) for a > 0 by a float64 search (exact for every float32, subnormals included)."""
    e = math.floor(math.log2(a))
    while 2.0**e > a:
        e -= 1
    while 2.0 ** (e + 1) <= a:
        e += 1
    return e


def e8m0(amax: float, emax: int) -> F32:
    """OCP MX v1.0 shared scale: 2**(floor(log2 amax) - emax), clamped to [2**-127, 2**127]; amax 0 -> 2**-127."""
    e = -127 if amax == 0 else min(max(floor_log2(amax) - emax, -127), 127)
    scale = F32(2.0**e)
    assert F32(np.array(scale).astype(ml_dtypes.float8_e8m0fnu).astype(F32)) == scale  # a real E8M0 value
    return scale


def e4m3(v) -> F32:
    return F32(np.array(v, dtype=F32).astype(ml_dtypes.float8_e4m3fn).astype(F32))


def e2m1_rne(y: np.ndarray) -> np.ndarray:
    return np.clip(y, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(F32)


def e2m1_away(y: np.ndarray) -> np.ndarray:
    """Nearest E2M1 magnitude, ties to the larger one, saturating; sign from y < 0 (SGLang's quantizer)."""
    mag = np.minimum(np.abs(y.astype(np.float64)), 6.0)
    dist = np.abs(mag[:, None] - E2M1[None, :])
    best = len(E2M1) - 1 - np.argmin(dist[:, ::-1], axis=1)  # argmin takes the first: reversed, the larger on ties
    return np.where(y < 0, -E2M1[best], E2M1[best]).astype(F32)


def ref_group(x: np.ndarray, name: str, tensor_amax: float) -> tuple[np.ndarray, F32]:
    """(dequantized values, scale) of one group under a scheme, computed step by step in float32."""
    x = x.astype(F32)
    amax = F32(np.abs(x).max())
    if name == "nvfp4":  # ModelOpt: global = tamax / (448 * 6); group = e4m3(amax / (6 * global))
        glob = F32(1.0) if tensor_amax == 0 else F32(F32(tensor_amax) / F32(2688.0))
        wanted = F32(amax / F32(F32(6.0) * glob))
        group = e4m3(np.clip(wanted if wanted != 0 else F32(1.0), 2.0**-9, 448.0))
        scale = F32(group * glob)
        codes = e2m1_rne(x / scale)
    elif name in ("mxfp4", "mxfp8_e4m3", "fp8_e5m2/group32/dynamic+scale_dtype=e8m0"):
        scale = e8m0(float(amax), {"mxfp4": 2, "mxfp8_e4m3": 8}.get(name, 15))
        y = x / scale
        if name == "mxfp4":
            codes = e2m1_rne(y)
        else:
            ml = ml_dtypes.float8_e4m3fn if name == "mxfp8_e4m3" else ml_dtypes.float8_e5m2
            lim = 448.0 if name == "mxfp8_e4m3" else 57344.0
            codes = np.clip(y, -lim, lim).astype(ml).astype(F32)
    elif name == "sglang_fp4":  # SGLang: 2**ceil(log2(max(amax / 6, 1e-10))), thresholds with ties away
        ratio = max(F32(amax / F32(6.0)), F32(1e-10))
        scale = F32(2.0 ** math.ceil(float(np.log2(F32(ratio)))))
        codes = e2m1_away(x / scale)
    elif name == "fp4_e2m1/group16/dynamic":
        scale = F32(amax / F32(6.0)) if amax > 0 else F32(1.0)
        codes = e2m1_rne(x / scale)
    elif name == "fp4_e2m1/group16/dynamic+scale_dtype=e4m3":
        scale = e4m3(np.clip(F32(amax / F32(6.0)), 2.0**-9, 448.0)) if amax > 0 else F32(1.0)
        codes = e2m1_rne(x / scale)
    else:
        raise KeyError(name)
    return (codes * scale).astype(F32), scale


def reference(x: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(dequantized x, scales (B, H, S, D / N)) group by group along head_dim."""
    size = parse_scheme(name).granularity.size
    b, h, s, d = x.shape
    out, scales = np.empty_like(x), np.empty((b, h, s, d // size), dtype=F32)
    for i in range(b):
        tamax = float(np.abs(x[i]).max())
        for j in range(h):
            for t in range(s):
                for g in range(d // size):
                    sl = slice(g * size, (g + 1) * size)
                    out[i, j, t, sl], scales[i, j, t, g] = ref_group(x[i, j, t, sl], name, tamax)
    return out, scales


def random_kv(seed=7, shape=(2, 3, 6, 64)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.tensor([0.01, 1.0, 300.0]).reshape(1, 3, 1, 1)
    x = x * torch.exp(2 * torch.randn(*shape[:3], 1, generator=g))  # groups of very different ranges
    x[0, 1, 2] = 0.0  # an all-zero token
    x[1, 0, 3, :16] = 0.0  # an all-zero group
    return x


def q(name: str, x: torch.Tensor, **kw):
    s = parse_scheme(name)
    return quantize(x, s.kv_format, s.granularity, **kw)


def bits_equal(a: torch.Tensor, b: np.ndarray) -> bool:
    return np.array_equal(a.numpy().view(np.uint32), np.asarray(b, dtype=F32).view(np.uint32))


# ---------------------------------------------------------------------------------------------
# Quantize-dequantize and scales, bit for bit
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NEW)
def test_quantize_dequantize_matches_the_reference_bit_for_bit(name):
    x = random_kv()
    s = parse_scheme(name)
    ours = quantize_dequantize(x, s.kv_format, s.granularity)
    ref, ref_scales = reference(x.numpy(), name)
    assert bits_equal(ours, ref), f"max diff {np.abs(ours.numpy() - ref).max()}"
    assert bits_equal(q(name, x).scale, ref_scales)


@pytest.mark.parametrize("name,emax", [("mxfp4", 2), ("mxfp8_e4m3", 8)])
def test_e8m0_rule_on_random_data_bit_for_bit(name, emax):
    """Group amaxes over 2**-140 .. 2**120, subnormals included: the scale is 2**(floor(log2 amax) - emax)."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(4, 8, 64, 64, generator=g) * torch.exp2(
        torch.randint(-140, 120, (4, 8, 64, 2, 1), generator=g).float()
    ).repeat_interleave(32, -1).reshape(4, 8, 64, 64)
    scale = q(name, x).scale.numpy()
    amax = np.abs(x.numpy()).reshape(4, 8, 64, 2, 32).max(-1)
    want = np.vectorize(lambda a: e8m0(float(a), emax), otypes=[F32])(amax)
    assert np.array_equal(scale.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(scale.astype(ml_dtypes.float8_e8m0fnu).astype(F32), scale)  # every one a real E8M0 value


def test_nvfp4_group_scales_are_e4m3_values_times_one_global_per_sequence():
    """The scale used is float32(e4m3 group scale x global), as ModelOpt's and vLLM's reference dequantizers form it."""
    x = random_kv(3)
    out = q("nvfp4", x)
    assert out.tensor_scale.shape == (2, 1, 1, 1)
    for i in range(2):
        glob = F32(np.abs(x[i].numpy()).max() / F32(2688))
        assert out.tensor_scale[i].item() == glob
        used = out.scale[i].numpy()
        group = (used / glob).astype(ml_dtypes.float8_e4m3fn).astype(F32)  # the stored E4M3 byte's value
        assert np.array_equal((group * glob).astype(F32), used)
        assert group.min() >= 2.0**-9 and group.max() <= 448


def test_nvfp4_reuses_a_given_tensor_scale_and_saturates_beyond_it():
    """A later token written with the first write's frozen global scale: group scales saturate at 448."""
    first = q("nvfp4", torch.full((1, 1, 1, 16), 1.0))
    later = q("nvfp4", torch.full((1, 1, 1, 16), 10.0), tensor_scale=first.tensor_scale)
    assert torch.equal(later.tensor_scale, first.tensor_scale)
    assert later.scale.item() == (448 * first.tensor_scale).item()
    assert dequantize(later).unique().tolist() == [pytest.approx(1.0, rel=1e-6)]  # 6 * 448 * (1 / 2688)


def test_nvfp4_tensor_scale_leaves_padding_out():
    x = torch.cat([torch.randn(1, 2, 5, 16), torch.full((1, 2, 3, 16), 1e4)], dim=2)
    valid = torch.tensor([[True] * 5 + [False] * 3])
    out = q("nvfp4", x, valid=valid)
    assert out.tensor_scale.item() == F32(np.abs(x[:, :, :5].numpy()).max() / F32(2688))


# ---------------------------------------------------------------------------------------------
# Edge values: ties, saturation, zeros, negative zero, NaN
# ---------------------------------------------------------------------------------------------
TIES = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, -5.0, 0.1, -0.1, 0.0, -0.0, 4.0]


def group(values, width):
    return torch.tensor(values + [0.0] * (width - len(values)), dtype=torch.float32).reshape(1, 1, 1, width)


def test_ties_round_to_even_in_mx_and_away_from_zero_in_sglang():
    # amax 6: the MX scale is 2**(2 - 2) = 1, SGLang's 2**ceil(log2(1)) = 1, so the elements are the values
    mx = dequantize(q("mxfp4", group(TIES, 32))).flatten()[:16].tolist()
    sg = dequantize(q("sglang_fp4", group(TIES, 16))).flatten().tolist()
    assert mx == [6, 0, 1, 1, 2, 2, 4, 4, -0.0, -2, -4, 0, -0.0, 0, -0.0, 4]
    assert sg == [6, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -3, -6, 0, -0.0, 0, 0, 4]
    assert [math.copysign(1, v) for v in mx[12:15]] == [-1, 1, -1]
    assert [math.copysign(1, v) for v in sg[12:15]] == [-1, 1, 1]  # SGLang's sign bit is v < 0: -0.0 -> +0


def test_saturation():
    # MXFP4: amax 7.5 -> 2**(2 - 2) = 1 and 7.5 clamps to 6 (the OCP rule accepts it); SGLang's ceil rule picks 2
    assert dequantize(q("mxfp4", group([7.5, 1.0], 32))).flatten()[:2].tolist() == [6.0, 1.0]
    assert dequantize(q("sglang_fp4", group([7.5, 1.0], 16))).flatten()[:2].tolist() == [8.0, 1.0]
    # MXFP8: amax 500 -> 2**(8 - 8) = 1, 500 clamps to 448
    assert dequantize(q("mxfp8_e4m3", group([500.0, -500.0, 1.0], 32))).flatten()[:3].tolist() == [448.0, -448.0, 1.0]
    # NVFP4 never saturates a group of the first write: its scale comes from the group's own amax
    assert dequantize(q("nvfp4", group([7.5, 1.0], 16))).flatten()[0].item() == pytest.approx(7.5, rel=0.07)


@pytest.mark.parametrize(
    "name,scale",
    [
        ("mxfp4", 2.0**-127),
        ("mxfp8_e4m3", 2.0**-127),
        ("sglang_fp4", 2.0**-33),
        ("fp4_e2m1/group16/dynamic", 1.0),
        ("fp4_e2m1/group16/dynamic+scale_dtype=e4m3", 1.0),
    ],
)
def test_all_zero_groups_stay_zero(name, scale):
    x = torch.zeros(1, 1, 2, 32)
    out = q(name, x)
    assert (dequantize(out) == 0).all() and (out.scale == F32(scale)).all() and not bool(out.nonfinite)
    nv = q("nvfp4", torch.zeros(1, 1, 1, 16))
    assert nv.tensor_scale.item() == 1.0 and nv.scale.item() == 1.0 and (dequantize(nv) == 0).all()


@pytest.mark.parametrize("name", NEW)
def test_nan_is_flagged_and_still_encodes(name):
    x = random_kv(5)
    x[1, 2, 3, 7] = float("nan")
    out = q(name, x)
    assert bool(out.nonfinite)
    s = parse_scheme(name)
    stored = encode(out.codes, s.kv_format)  # never raises: the cache reports the NaN once per forward
    assert stored.shape[-1] == 64 * s.kv_format.bits // 8
    finite = torch.isfinite(out.codes)
    assert torch.equal(decode(stored, s.kv_format)[finite], out.codes[finite])


# ---------------------------------------------------------------------------------------------
# Stored bytes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NEW)
def test_stored_bytes_are_the_engines_codes_and_decode_exactly(name):
    s = parse_scheme(name)
    out = q(name, random_kv(9))
    stored = encode(out.codes, s.kv_format)
    assert torch.equal(decode(stored, s.kv_format), out.codes)
    if s.kv_format.packed:  # two OCP E2M1 codes (S E E M) per byte, element 2i in the low nibble
        codes = out.codes.numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
        if s.name == "sglang_fp4":  # its sign bit is v < 0: no code 8 from a +0 result
            codes = np.where(out.codes.numpy() == 0, np.where(np.signbit(out.codes.numpy()), 8, 0), codes)
        assert stored.dtype == torch.uint8 and np.array_equal(
            stored.numpy(), codes[..., 0::2] | (codes[..., 1::2] << 4)
        )
    else:
        assert stored.dtype == s.kv_format.storage_dtype


# ---------------------------------------------------------------------------------------------
# Scheme strings and one-line errors
# ---------------------------------------------------------------------------------------------
def test_named_schemes_are_their_own_canonical_strings_and_long_forms_parse_to_them():
    for name, named in NAMED_SCHEMES.items():
        assert str(parse_scheme(name)) == name and parse_scheme(named.long_form()) == parse_scheme(name)
        assert str(parse_scheme(name + "+skip=0,3")) == name + "+skip=0,3"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--preset", "llama-3.1-8b", "--schemes", "fp4_e2m1/tensor/dynamic"], "one scale per group of values"),
        (["--preset", "llama-3.1-8b", "--schemes", "fp4_e2m1/group16/unit"], "not unit scales"),
        (
            ["--preset", "llama-3.1-8b", "--schemes", "fp8_e4m3/tensor/static+scales=x.safetensors+scale_dtype=e8m0"],
            "not static scales",
        ),
        (
            ["--preset", "llama-3.1-8b", "--schemes", "fp8_e4m3/group32/dynamic+scale_dtype=e4m3"],
            "does not take e4m3 scales",
        ),
        (["--preset", "llama-3.1-8b", "--schemes", "int4/group32/dynamic+scale_dtype=e8m0"], "takes fp32 scales only"),
        (["--preset", "llama-3.1-8b", "--schemes", "nvfp4+scale_dtype=e8m0"], "nvfp4 fixes its format and scales"),
        (["--preset", "llama-3.1-8b", "--schemes", "int4/group48/dynamic"], "group48 does not divide head_dim 128"),
    ],
)
def test_capacity_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code = main(["capacity", "--gpu-memory", "80GB", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err


def test_run_refuses_a_group_that_does_not_divide_head_dim(capsys, tiny_llama_dir):
    code = main(["run", "--model", str(tiny_llama_dir), "--schemes", "mxfp4", "--eval", "perplexity"])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]  # transformers' load bar aside
    assert code == 2 and len(errors) == 1 and "group32 does not divide head_dim 16" in errors[0]


def test_bad_scheme_values_raise_scheme_error():
    for text in (
        "fp4_e2m1/block16/dynamic",
        "fp4_e2m1",
        "fp8_e4m3/group32/dynamic+recipe=sglang",
        "fp4_e2m1/group16/dynamic+tensor_scale=fp32",
        "mxfp4+scales=a.safetensors",
    ):
        with pytest.raises(SchemeError):
            parse_scheme(text)


# ---------------------------------------------------------------------------------------------
# The harness: perplexity through the storage path on a tiny model with head_dim 32
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def head32_dir(tmp_path_factory, tiny_tokenizer_dir):
    folder = tmp_path_factory.mktemp("llama_hd32")
    shape = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1
    )
    return save_llama_dir(folder, tiny_tokenizer_dir, **shape)


def test_perplexity_through_the_storage_path_for_every_new_scheme(head32_dir, tmp_path, capsys):
    from evalkit.data.corpus import load_corpus
    from evalkit.evals.perplexity.evaluation import PerplexityEval
    from evalkit.models.loading import load_model

    from tests.evals.test_perplexity import reference as plain_reference

    corpus = tmp_path / "prose.txt"
    corpus.write_text(load_corpus("embedded").text[:20_000], encoding="utf-8")
    schemes = "auto,fp8_e4m3/tensor/dynamic,nvfp4,mxfp4,mxfp8_e4m3,sglang_fp4"
    argv = [
        "run",
        "--model",
        str(head32_dir),
        "--schemes",
        schemes,
        "--eval",
        "perplexity",
        "--perplexity-corpus",
        f"file:{corpus}",
        "--perplexity-window",
        "64",
        "--perplexity-max-windows",
        "3",
        "--perplexity-bootstrap-samples",
        "200",
        "--json",
        "--cache-dir",
        str(tmp_path),
    ]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    top = {(r["scheme"], r["metric"]): r["value"] for r in rows if not r["labels"]}
    for name in schemes.split(",")[1:]:
        assert top[(name, "n_tokens")] == 3 * 63 and top[(name, "kl_mean")] > 0, name
    assert top[("mxfp8_e4m3", "kl_mean")] < top[("mxfp4", "kl_mean")]  # 8 bits beat 4 bits
    # the reported perplexity is the plain model's under the same scheme (labels=..., the hook's cache)
    lm = load_model(str(head32_dir))
    ev = PerplexityEval(dict(window=64, max_windows=3, bootstrap_samples=200, corpus=f"file:{corpus}"))
    ev.prepare(lm, tmp_path)
    plain = tf.AutoModelForCausalLM.from_pretrained(str(head32_dir), dtype=torch.float32, attn_implementation="sdpa")
    ppl = plain_reference(ev, lm, parse_scheme("nvfp4"), plain.eval())[0]  # baseline: transformers' model, no hooks
    assert top[("nvfp4", "ppl")] == pytest.approx(ppl, rel=1e-5)


def test_code_magnitudes_are_derived_from_the_fields_and_match_ml_dtypes():
    """E2M1's code table comes from bits / mantissa_bits / min_normal_exp / max, not from its name."""
    import ml_dtypes
    import numpy as np

    from evalkit.kv.formats import FORMATS

    fmt = FORMATS["fp4_e2m1"]
    assert fmt.own_codes and not FORMATS["fp8_e4m3"].own_codes and not FORMATS["int4"].own_codes
    reference = np.arange(8, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    assert fmt.code_magnitudes == tuple(reference) == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
