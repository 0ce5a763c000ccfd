"""The codec fingerprint: every KV codec evalkit has, on fixed inputs, hashed to the bit.

What runs, enumerated from evalkit's own tables rather than listed by hand (so a new format, option
or engine dtype joins by itself, and changes the fingerprint until it is pinned):

* **formats**: every quantizing format of :data:`evalkit.kv.formats.FORMATS` (the unscaled ones,
  ``FormatKind.NONE``, store values, not codes: the storage fingerprint holds them) x granularity
  (tensor, head, block16, block64, token, group16, group32) x scale source (dynamic, unit, a given
  static scale per tensor or head) x scale dtype (fp32, e4m3, e8m0) x ``tensor_scale`` x recipe
  (standard, sglang, vllm_cpu) x rounding (rne, rtz, rna): every combination that
  :func:`~evalkit.kv.scheme.parse_scheme` accepts, each once under its canonical string (the
  :data:`~evalkit.kv.named_schemes.NAMED_SCHEMES` among them); dynamic ones also with a padding mask;
* **every registered codec family** (:func:`evalkit.kv.codec.families`: vLLM's, llama.cpp's, and any a
  plugin registers), one group named by its prefix: every ``<prefix>:<name>`` of the family's own
  :meth:`~evalkit.kv.codec.CodecFamily.names` that parses to a quantizing scheme on standard attention
  (every ``<k>/<v>`` pair where the family's grammar takes K and V types apart, as llama.cpp's does), K and
  V; its MLA codecs (codecs marked ``mla``: vLLM's DeepSeek rows) in a group of their own (``mla`` for vLLM,
  ``<prefix>_mla`` for another family), on a 512-value latent (role K) and a 64-value RoPE key (role V); a
  codec with a ``numerics_group`` (one added after its family was pinned: vLLM 0.33's Octave caches) in
  ``<prefix>_<group>`` (``vllm_octave``), so adding it moved no pin; a codec whose slot follows the rotary
  dims (``rope_aware``) also with none rotary.

Each group is pinned under its component's numerics version (:func:`tests.numerics.exact.pin_name`): a
format's :data:`evalkit.kv.formats.FORMAT_NUMERICS`, a family's ``numerics_version``. A registered family
without a pin fails the pin test with a line naming it.

Hashed (SHA-256, exact bytes): codes, scales, zero points, NVFP4's tensor scale, the NaN flag, the
stored tensor, the stored tensor read back (``decode``, or an engine codec's own ``decode``), and
the dequantized values in float32 and bfloat16, for inputs in float32 and in bfloat16. Inputs are
exact (:func:`tests.numerics.exact.exact_values`) and the arithmetic is elementwise or an exact
reduction (amax, :mod:`evalkit.kv.device_exact`), so the hashes are the same on every processor.

If this test fails, a codec's numbers changed: when that is meant, bump its format's or its family's
numerics version (see above) and re-pin with ``python -m tests.numerics --write`` (from
the repository root; ``python -m tests.numerics.test_codec_fingerprint`` prints this file's entries); when it is
not meant, the change is a bug.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
from collections.abc import Iterable

import torch

from evalkit.errors import SchemeError
from evalkit.kv import formats as kv_formats
from evalkit.kv.codec import codec_for, families, family_for_prefix, is_codec
from evalkit.kv.quantize import decode, dequantize, encode_quantized, quantize
from evalkit.kv.scheme import NAMED_SCHEMES, ScaleSource, parse_scheme

from tests.numerics.exact import TensorHash, check_pins, exact_values, one_thread, pin_entry, reference, versioned

PINNED = {  # NUMERICS_VERSION -> group -> SHA-256 of fingerprints()[group]
    # before this file, tests/sweep/test_numerics_fingerprint.py hashed 16 schemes and 16 engine codecs into one
    # pin: a0441bc39a540a5ab574b40de47b3cfeaad97e5493c6f68288eacd064578539c at version 1,
    # d074a49c9d61d7118be4de781e86ba4478eec4996ee88a364f893033c2c6b289 at version 2
    2: {
        "fp8_e4m3": "66d8340641293dbdca905e856e4ca8a3bf33ca1583698a389dc32eb834dcb2bf",
        "fp8_e4m3fnuz": "d82a881f07a53bec7dc56d4908358938a59aade15e6dd705842c7f035c43b401",
        "fp8_e5m2": "ce3766d65a85a73fe0ce3b6f88667e6109dc3a56281663a0bc2405206218be2e",
        "int8": "f0159ec4ba9cff0f31e98f814d6c2de0ca7b42f18114f8766eca5f938f986efa",
        "int8_asym": "06f9a8ac34b496d8e50b489d07fdc404f757e0c50c12c39ab741bf05190105bc",
        "int4": "ca76016fd21b1fd29ee0cbd1e520fa69d5f1c0c18656a6bed83ddc830960b288",
        "int4_asym": "191e3471145b1ca377a59d0a497d3700c5f33ad4f32632f4034ffa10056796fe",
        "fp4_e2m1": "5e6a1595ee7c23134a0c3d1678c65a3098afe29db42a0fda1b08fb46e3cb16c4",
        "vllm": "cbdb60ec61654ae0635b7cd10af5ebd56e6cbda14c274a9798e27aa60761568b",
        "llamacpp": "2f7f4a0a53b38e7f9a27a17a1361f97f17f4350fe36eb55c077d2fcc0e41aaba",
        "mla": "ad7cf50560b40c3f429f65ace624d087590280c0dc7cb8ec422f2364939baedf",
    },
    3: {
        "fp8_e4m3": "66d8340641293dbdca905e856e4ca8a3bf33ca1583698a389dc32eb834dcb2bf",
        "fp8_e4m3fnuz": "d82a881f07a53bec7dc56d4908358938a59aade15e6dd705842c7f035c43b401",
        "fp8_e5m2": "ce3766d65a85a73fe0ce3b6f88667e6109dc3a56281663a0bc2405206218be2e",
        "int8": "f0159ec4ba9cff0f31e98f814d6c2de0ca7b42f18114f8766eca5f938f986efa",
        "int8_asym": "06f9a8ac34b496d8e50b489d07fdc404f757e0c50c12c39ab741bf05190105bc",
        "int4": "ca76016fd21b1fd29ee0cbd1e520fa69d5f1c0c18656a6bed83ddc830960b288",
        "int4_asym": "191e3471145b1ca377a59d0a497d3700c5f33ad4f32632f4034ffa10056796fe",
        "fp4_e2m1": "5e6a1595ee7c23134a0c3d1678c65a3098afe29db42a0fda1b08fb46e3cb16c4",
        "dsv4": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "dsv4_mla": "7219293f346717f79de0fa61e1cbf3450e7084db86b600a1864d58caecdda14a",
        "llamacpp": "2f7f4a0a53b38e7f9a27a17a1361f97f17f4350fe36eb55c077d2fcc0e41aaba",
        "vllm": "cbdb60ec61654ae0635b7cd10af5ebd56e6cbda14c274a9798e27aa60761568b",
        "mla": "ad7cf50560b40c3f429f65ace624d087590280c0dc7cb8ec422f2364939baedf",
        # vLLM 0.33's Octave caches (kv/codecs/vllm/octave.py), pinned apart: their sums are torch's, as vLLM's
        # reference computes them (its CPU reduction order)
        "vllm_octave": "47ccf02cce54e735b3160e2892122db4dc053b8bf35c4fdc1719581f37bd6387",
        # SGLang 0.5.23's mxfp8 (kv/codecs/sglang/), a family of its own
        "sglang": "572dfa18b617d54e103db35e1d9178f412d796b3e9e3164069c56dd9185628f3",
    },
}

SHAPE = (2, 3, 40, 64)  # (batch, KV heads, tokens, head_dim)
MLA_SHAPES = {"k": (2, 1, 40, 512), "v": (2, 1, 40, 64)}  # the latent and the RoPE key (DeepSeek V3.2 widths)
GRANULARITIES = ("tensor", "head", "block16", "block64", "token", "group16", "group32")  # block64: one block
SOURCES = ("dynamic", "unit", "static")
OPTIONS = (  # each a choice of one scheme option ("" leaves it out)
    ("", "+scale_dtype=e4m3", "+scale_dtype=e8m0"),
    ("", "+tensor_scale=fp32"),
    ("", "+recipe=sglang", "+recipe=vllm_cpu"),
    ("", "+rounding=rtz", "+rounding=rna"),
)
STATIC_PATH = "fingerprint.safetensors"  # named by the scheme only: the scale below is handed in, never read
STATIC_TENSOR = 0.0123  # a given per-tensor scale: outliers saturate
STATIC_HEADS = (0.0123, 0.25, 1.5)  # a given scale per KV head
DTYPES = (torch.float32, torch.bfloat16)


def inputs(seed: int = 0, shape: tuple[int, ...] = SHAPE) -> torch.Tensor:
    return exact_values(shape, seed)


def padding_mask(batch: int, tokens: int) -> torch.Tensor:
    """Real tokens (B, S): row 1 left-padded by 5 tokens."""
    valid = torch.ones(batch, tokens, dtype=torch.bool)
    valid[1, :5] = False
    return valid


# -- what runs ----------------------------------------------------------------------------------------
def format_schemes() -> dict[str, list[str]]:
    """Per quantizing format, the canonical strings of every scheme on it that parses (see the module doc)."""
    out: dict[str, dict[str, None]] = {}
    for name, fmt in kv_formats.FORMATS.items():
        if fmt.is_unscaled:
            continue
        found: dict[str, None] = {}
        for gran, source, *opts in itertools.product(GRANULARITIES, SOURCES, *OPTIONS):
            text = f"{name}/{gran}/{source}" + "".join(opts)
            if source == "static":
                text += f"+scales={STATIC_PATH}"
            try:
                found[str(parse_scheme(text))] = None
            except SchemeError:
                continue
        out[name] = found
    for named in NAMED_SCHEMES:  # every named scheme is reached by its long form above; listed again, harmlessly
        out[parse_scheme(named).format][named] = None
    return {name: list(found) for name, found in out.items()}


def family_schemes(prefix: str) -> tuple[list[str], list[str], dict[str, list[str]]]:
    """(standard-attention schemes, MLA schemes, {numerics group: schemes}) of the registered family ``prefix``:
    each name of its own listing that parses to a quantizing scheme (every K/V pair where its grammar takes
    ``<k>/<v>``); a codec with a ``numerics_group`` (one added after its family was pinned) goes to that group."""
    family = family_for_prefix(prefix)
    names = family.names()
    texts = [f"{k}/{v}" for k in names for v in names] if "<k>[/<v>]" in family.grammar else names
    standard, mla, apart = [], [], {}
    for name in texts:
        try:
            scheme = parse_scheme(f"{prefix}:{name}")
        except SchemeError:  # refused or not modelled: nothing to fingerprint
            continue
        if scheme.is_unscaled:
            continue
        codec = codec_for(scheme.recipe) if is_codec(scheme.recipe) else None
        if codec is not None and codec.numerics_group:
            apart.setdefault(f"{prefix}_{codec.numerics_group}", []).append(f"{prefix}:{name}")
            continue
        (mla if codec is not None and codec.mla else standard).append(f"{prefix}:{name}")
    return standard, mla, apart


def family_groups() -> dict[str, list[str]]:
    """Group -> schemes of every registered codec family (MLA codecs apart: ``mla`` for vLLM's; codecs with a
    numerics group in ``<prefix>_<group>``: ``vllm_octave``)."""
    out = {}
    for prefix in families():
        standard, mla, apart = family_schemes(prefix)
        out[prefix] = standard
        if mla:
            out["mla" if prefix == "vllm" else f"{prefix}_mla"] = mla
        out.update(apart)
    return out


def group_prefix(group: str) -> str:
    """The codec family a family group belongs to (``mla`` is vLLM's)."""
    if group == "mla":
        return "vllm"
    return next(p for p in sorted(families(), key=len, reverse=True) if group == p or group.startswith(p + "_"))


def group_version(group: str) -> int:
    """The numerics version of the component a group belongs to: its format or its codec family."""
    if group in kv_formats.FORMATS:
        return int(kv_formats.FORMAT_NUMERICS.get(group, 0))
    return int(family_for_prefix(group_prefix(group)).numerics_version)


def groups() -> dict[str, list[str]]:
    """Group name -> the scheme strings it fingerprints (built afresh: a patched table takes effect)."""
    return {**format_schemes(), **family_groups()}


# -- hashing ----------------------------------------------------------------------------------------
def given_scale(scheme) -> torch.Tensor | None:
    """The scale a static or unit scheme is handed (None: dynamic)."""
    if scheme.scales is ScaleSource.UNIT:
        return torch.ones(1, 1, 1, 1)
    if scheme.scales is ScaleSource.STATIC:
        if scheme.granularity.kind.value == "head":
            return torch.tensor(STATIC_HEADS, dtype=torch.float32).reshape(1, -1, 1, 1)
        return torch.tensor(STATIC_TENSOR, dtype=torch.float32).reshape(1, 1, 1, 1)
    return None


def _hash_quantized(h: TensorHash, q, fmt, dtype: torch.dtype, role: str, dim: int) -> None:
    for part in (q.codes, q.scale, q.zero, q.tensor_scale, q.nonfinite):
        h.tensor(part)
    stored = encode_quantized(q, fmt)
    h.tensor(stored)
    if is_codec(fmt.recipe):  # the engine's bytes read back by the codec itself
        codec = codec_for(fmt.recipe)
        h.tensor(codec.decode(stored, role, dim, **codec.rope(fmt.rope_dim)))
    else:
        h.tensor(decode(stored, fmt))
    h.tensor(dequantize(q, torch.float32))
    h.tensor(dequantize(q, dtype))


def hash_scheme(h: TensorHash, text: str) -> None:
    """Everything one scheme makes of the fixed inputs, in float32 and bfloat16."""
    scheme = parse_scheme(text)
    fmt, gran = scheme.kv_format, scheme.granularity
    codec = codec_for(fmt.recipe) if is_codec(fmt.recipe) else None
    for dtype in DTYPES:
        for role in ("k", "v") if codec is not None else ("k",):
            shape = MLA_SHAPES[role] if codec is not None and codec.mla else SHAPE
            x = inputs(seed=0 if role == "k" else 1, shape=shape).to(dtype)
            h.label(f"{text} {role} {dtype}")
            if codec is not None:
                _hash_quantized(h, quantize(x, fmt, gran, role=role), fmt, dtype, role, shape[-1])
                if codec.rope_aware:  # its slot follows the rotary dims: also none rotary (every dim; 0)
                    h.label(f"{text} {role} {dtype} rope_dim=0")
                    bound = dataclasses.replace(fmt, rope_dim=0)
                    _hash_quantized(h, quantize(x, bound, gran, role=role), bound, dtype, role, shape[-1])
                continue
            scale = given_scale(scheme)
            q = quantize(x, fmt, gran, scale=scale)
            _hash_quantized(h, q, fmt, dtype, role, shape[-1])
            if scale is None and dtype == torch.float32:  # padding left out of every amax
                h.label(f"{text} padded")
                valid = padding_mask(shape[0], shape[2])
                _hash_quantized(h, quantize(x, fmt, gran, valid=valid), fmt, dtype, role, shape[-1])


def fingerprints(only: Iterable[str] | None = None) -> dict[str, str]:
    """Pin name (the group at its component's version) -> SHA-256 over its schemes' strings and everything
    :func:`hash_scheme` hashes."""
    out = {}
    for group, schemes in groups().items():
        if only is not None and group not in only:
            continue
        h = TensorHash()
        with one_thread():
            for text in schemes:
                hash_scheme(h, text)
        out[group] = h.hexdigest()
    return versioned(out, group_version)


# -- tests ------------------------------------------------------------------------------------------
@contextlib.contextmanager
def package_families():
    """The registry without the test-only families (tests/toy_codec.py, tests/toy_int6_codec.py) that other
    tests' imports register for the session: the package's and plugins' families are what is pinned; the
    test-only ones are put back after."""
    from evalkit.kv import codec

    test_only = [f for f in families().values() if type(f).__module__.startswith("tests.")]
    for family in test_only:
        codec.unregister_family(family.prefix)
    try:
        yield
    finally:
        for family in test_only:
            codec.register_family(family)


def test_the_codec_fingerprints_are_pinned_with_the_numerics_version():
    with package_families():
        check_pins(PINNED, fingerprints(), "test_codec_fingerprint", "the KV codecs' numbers")


def test_the_inputs_are_fixed_bits():
    x = inputs(seed=0)
    assert x.shape == SHAPE and x.dtype == torch.float32
    assert hashlib.sha256(x.numpy().tobytes()).hexdigest() == INPUTS_SHA256  # the first fingerprint's inputs
    assert (x == 0).sum() > 0 and torch.signbit(x[x == 0]).any() and x.abs().max() < 128


INPUTS_SHA256 = "d4bea4af3a365a26118c38cca5272053f579f03d527f1ff9e473c6e8838eaada"


def test_the_enumeration_reaches_every_codec_family():
    """Every quantizing format, every named scheme, scale dtype, rounding and recipe, every modelled
    vLLM dtype and llama.cpp pair is fingerprinted (a table entry the enumeration missed would go unguarded)."""
    with package_families():
        g = groups()
    quantizing = [n for n, f in kv_formats.FORMATS.items() if not f.is_unscaled]
    families_groups = ("vllm", "llamacpp", "mla", "dsv4", "dsv4_mla", "vllm_octave", "sglang")
    assert sorted(n for n in g if n not in families_groups) == sorted(quantizing)
    texts = [t for n in quantizing for t in g[n]]
    assert set(NAMED_SCHEMES) <= set(texts)
    for needle in ("+scale_dtype=e8m0", "+rounding=rtz", "+rounding=rna", "+recipe=vllm_cpu", "/unit", "/static"):
        assert any(needle in t for t in texts), needle
    fp8 = [parse_scheme(t) for t in g["fp8_e4m3"]]  # a format with fp32 scales: every granularity and source
    assert {str(s.granularity) for s in fp8} == set(GRANULARITIES)
    assert {s.scales for s in fp8} == set(ScaleSource)
    from evalkit.kv.codecs.llamacpp.family import LLAMACPP_TYPES
    from evalkit.kv.codecs.vllm.dtypes import VLLM_DTYPES

    modelled = {n for n, d in VLLM_DTYPES.items() if d.status.value == "modelled"}
    assert {t.removeprefix("vllm:") for t in g["vllm"] + g["mla"] + g["vllm_octave"]} == modelled
    assert g["vllm_octave"] == ["vllm:octave_k3v4", "vllm:octave_k3v3", "vllm:octave_k3v3_compact"]
    assert len(g["llamacpp"]) == len(LLAMACPP_TYPES) ** 2
    assert {"vllm:fp8_ds_mla", "vllm:nvfp4_ds_mla"} <= set(g["mla"])
    assert g["dsv4_mla"] == ["dsv4:fp8_ds_mla", "dsv4:fp8_ds_mla_v41"] and g["dsv4"] == []  # MLA records only
    assert g["sglang"] == ["sglang:mxfp8"]


def assert_changed(group: str, unpatched: str, patched: str) -> None:
    """A mutation's fingerprint differs from the unpatched one and from the pin (the pin test holds the two equal)."""
    assert patched != unpatched
    assert patched != reference(PINNED, group, lambda: unpatched)


def test_a_changed_fp8_max_changes_the_fingerprint(monkeypatch):
    """Mutation: E4M3's largest finite value taken as 440 instead of 448 (a scale rule's constant)."""
    unpatched = fingerprints(["fp8_e4m3"])["fp8_e4m3"]
    fmt = kv_formats.FORMATS["fp8_e4m3"]
    monkeypatch.setitem(kv_formats.FORMATS, "fp8_e4m3", dataclasses.replace(fmt, max=440.0))
    assert_changed("fp8_e4m3", unpatched, fingerprints(["fp8_e4m3"])["fp8_e4m3"])


def test_a_changed_integer_rounding_changes_the_fingerprint(monkeypatch):
    """Mutation: integer codes rounded half away from zero where nearest-even was meant."""
    import evalkit.kv.quantize as quantize_module
    from evalkit.kv.rounding import Rounding, round_integer

    def half_away(y, rounding=Rounding.RNE):
        return round_integer(y, Rounding.RNA if rounding is Rounding.RNE else rounding)

    unpatched = fingerprints(["int8"])["int8"]
    monkeypatch.setattr(quantize_module, "round_integer", half_away)
    assert_changed("int8", unpatched, fingerprints(["int8"])["int8"])


def test_a_changed_llamacpp_block_encoder_changes_the_fingerprint(monkeypatch):
    """Mutation: an engine codec's bytes (ggml's q8_0 block scale off by one ulp)."""
    from evalkit.kv.codecs.llamacpp import ggml_blocks

    real = ggml_blocks.encode

    def encode(type_name, rows):
        out = real(type_name, rows)
        if type_name == "q8_0":
            out = out.clone()
            out[..., 0] ^= 1  # the low byte of each row's first block scale (fp16)
        return out

    unpatched = fingerprints(["llamacpp"])["llamacpp"]
    monkeypatch.setattr(ggml_blocks, "encode", encode)
    assert_changed("llamacpp", unpatched, fingerprints(["llamacpp"])["llamacpp"])


if __name__ == "__main__":
    from tests.numerics.exact import prepare_process

    prepare_process()
    print(f"PINNED entry:\n{pin_entry(fingerprints())}")


def test_a_registered_family_without_a_pin_is_named():
    """A codec family registered without its pin (here the test-only ``toy`` family) fails the pin test with
    a line naming it; a bumped family version asks for its group's pin under the new version."""
    import pytest

    from evalkit.kv import codec

    from tests.toy_codec import TOY_FAMILY

    codec.register_family(TOY_FAMILY)
    try:
        assert "toy" in groups()
        with pytest.raises(AssertionError, match="registered but not pinned: toy"):
            check_pins(PINNED, fingerprints(only=["toy"]), "test_codec_fingerprint", "the KV codecs' numbers")
    finally:
        codec.unregister_family("toy")
    family = family_for_prefix("llamacpp")
    family.numerics_version = 1
    try:
        assert set(fingerprints(only=["llamacpp"])) == {"llamacpp@v1"}
        with pytest.raises(AssertionError, match="registered but not pinned: llamacpp@v1"):
            check_pins(PINNED, fingerprints(only=["llamacpp"]), "test_codec_fingerprint", "the KV codecs' numbers")
    finally:
        family.numerics_version = 0
