"""The storage fingerprint: the caches evalkit installs, fed fixed K/V, hashed to the bit.

Each scheme below gets a cache from ``quantized_kv(model, scheme).new_cache(mask)`` (the dynamic
:class:`~evalkit.integration.storage.StorageCache`) and ``new_static_cache(max_len, mask)`` (the
static, compiled-decode :class:`~evalkit.integration.static_cache.StaticStorageCache`), and every
layer is written directly through ``cache.update(key_states, value_states, layer_idx)``: a prefill of
:data:`PREFILL` tokens with a left-padded row, then :data:`STEPS` one-token decode steps. The K/V are
exact values (:func:`tests.numerics.exact.exact_values`), in float32 and in bfloat16. The tiny models
only describe a cache's layout (layers, heads, widths, sliding windows, MLA): no matrix product runs,
so every hash is the same on every processor.

Hashed (SHA-256, exact bytes): what attention reads back from every ``update`` (the returned K and
V, with -0.0 taken as +0.0: attention cannot tell them apart, and a first write's values, handed
over from the quantizer, may carry -0.0 where the same code read back from the stored bytes is +0),
then per layer what is stored (codes, scales, zero points, NVFP4's tensor scale) and the bytes the
cache counts (``nbytes()``).

What the schemes cover: the unscaled formats (every ``FormatKind.NONE`` format and vLLM's 16-bit
dtypes); dynamic scales per tensor, head, block, token and group (FP8, INT8/INT4 symmetric and
asymmetric, E8M0 scales, rounding modes); the named microscaling schemes; unit scales (vLLM's CPU
store too); static scales from a scale table (per tensor and per head); vLLM's per-token-head,
rotation and NVFP4 dtypes (TurboQuant's prefill reads raw K/V; its first and last two layers stay
unquantized), llama.cpp cache types, ``+skip=`` layers; sliding-window layers (dynamic cache: the
static one refuses them); an MLA layout (latent and RoPE key, vLLM's DeepSeek rows, ``+rope=bf16``);
vLLM 0.33's Octave caches on a head_dim 128 layout with 64 rotary dims (a group of their own).

If this test fails, the numbers a cache stores or hands to attention changed: when that is meant, bump
``evalkit.sweep.code_identity.NUMERICS_VERSION`` and re-pin with ``python -m tests.numerics --write`` (from
the repository root; ``python -m tests.numerics.test_storage_fingerprint`` prints this file's entries); when it is
not meant, the change is a bug.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import transformers as tf

from evalkit.errors import SchemeError
from evalkit.integration.install import quantized_kv
from evalkit.kv.codecs.vllm.dtypes import VLLM_DTYPES, Status
from evalkit.kv.formats import FORMATS
from evalkit.kv.scale_table import ScaleTable
from evalkit.kv.scheme import ScaleSource, parse_scheme
from evalkit.models.info import kv_layout

from tests.numerics.exact import TensorHash, check_pins, exact_values, one_thread, pin_entry, reference
from tests.tiny_models import VOCAB, ds_mla_config

PINNED = {  # NUMERICS_VERSION -> group -> SHA-256 of fingerprints()[group]
    2: {
        "standard/dynamic": "234e57311e162e4a1a7d6be677ebda638eabd5b46efbcd8b58a89da6706e03a5",
        "standard/static": "bf0ccbe9dca20f8f4cda91197d5a33d1a8a1e30f5ea2228e11ed10566580021b",
        "sliding/dynamic": "58648689aed91958b9424e963c44961b66011a973771f6fc18d4e2f22f581cb6",
        "mla/dynamic": "e94461c1b47f319d466e1e45f71c914c030696ab26ae4c50d38a7db499fc5c8d",
        "mla/static": "0cd576af9bb68d38b8ab04400c78c6efc8c6c240a18ac40a7056dbded6121554",
    },
    3: {
        "standard/dynamic": "4f8b022445ca152aaf27d96c45c6a117d0a5d199e69aa67dfa22f0d14a5b9fba",
        "standard/static": "66743a865f9d3193942b0e32d7cd4d400ca4593dde88229fe88eac0fc14383b1",
        "sliding/dynamic": "0067b22fc9adc4aaae0373a704f5eeb606530f34b5a749b066daeea66c8a1514",
        "mla/dynamic": "ad22f55ef00d3b234a52b588590eba1ccda6874766c5698e006c523ce7577b41",
        "mla/static": "2110d3420a7734319914336037c20a38485a8cd5ce6c1b007f9a438f7f50a985",
        "octave/dynamic": "a99328d32220dc8f8249fca2bea252e7c62d03aad161ba8026688e407bfc6f27",
        "octave/static": "0409d1060c806dd44a0dd08221aecdfb0bdff6c66583bc382cf9f22d44110ab2",
    },
}

BATCH, PREFILL, STEPS = 2, 40, 9  # 9 steps: block8 and block16 blocks fill and new ones open
PADDED = 5  # row 1's first 5 positions are padding
DTYPES = (torch.float32, torch.bfloat16)
TABLE = "fingerprint.safetensors"  # named by the scheme; the table itself is handed to quantized_kv


def identity_schemes() -> list[str]:
    """Every unscaled format (FormatKind.NONE) that is a scheme by its name, and every vLLM baseline dtype."""
    out = []
    for text in [name for name, f in FORMATS.items() if f.is_unscaled] + [
        f"vllm:{name}" for name, d in VLLM_DTYPES.items() if d.status is Status.BASELINE
    ]:
        try:
            parse_scheme(text)
        except SchemeError:  # a format only reachable through other names
            continue
        out.append(text)
    return out


STANDARD = (  # head_dim 64, 2 KV heads, 5 layers (TurboQuant keeps layers 0, 1, 3, 4 unquantized)
    "fp8_e4m3/tensor/dynamic",
    "fp8_e4m3/head/dynamic",
    "int8_asym/tensor/dynamic",
    "int8_asym/head/dynamic",
    "fp8_e5m2/block16/dynamic",
    "int4/block8/dynamic",
    "fp8_e4m3/block16/dynamic+rounding=rtz",
    "fp8_e4m3/token/dynamic",
    "int8/token/dynamic+rounding=rna",
    "int4_asym/group16/dynamic",
    "int4/group32/dynamic",
    "fp8_e4m3/group32/dynamic+scale_dtype=e8m0",
    "nvfp4",
    "mxfp4",
    "mxfp8_e4m3",
    "sglang_fp4",
    "fp8_e4m3/tensor/unit",
    "fp8_e5m2/head/unit",
    "int8/block16/unit",
    "fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz",
    f"fp8_e4m3/tensor/static+scales={TABLE}",
    f"fp8_e4m3/head/static+scales={TABLE}",
    f"int4/head/static+scales={TABLE}+rounding=rtz",
    "vllm:fp8",
    "vllm:int8_per_token_head",
    "vllm:fp8_per_token_head",
    "vllm:int4_per_token_head",
    "vllm:turboquant_k8v4",
    "vllm:turboquant_4bit_nc",
    "vllm:turboquant_3bit_nc",
    "vllm:ultraquant_4bit",
    "vllm:nvfp4",
    "llamacpp:q8_0",
    "llamacpp:q4_0/q8_0",
    "llamacpp:iq4_nl",
    "llamacpp:f16",
    "fp8_e4m3/head/dynamic+skip=0,3",
    "nvfp4+skip=1",
)
SLIDING = (  # layers 0, 1 and 3 slide over 8 tokens, layer 2 is full
    "fp8_e4m3/head/dynamic",
    "fp8_e5m2/block4/dynamic",
    "int4_asym/group16/dynamic",
    "nvfp4",
    "fp8_e4m3/token/dynamic+skip=sliding",
    "vllm:int8_per_token_head",
    "llamacpp:q4_0",
)
MLA = (  # a 512-value latent and a 64-value RoPE key (DeepSeek V3.2's widths), 2 layers
    "fp8_e4m3/tensor/dynamic",
    "fp8_e4m3/token/dynamic+rope=bf16",
    "int4/group32/dynamic",
    "nvfp4",
    "vllm:fp8",
    "vllm:fp8_ds_mla",
    "vllm:nvfp4_ds_mla",
)


def standard_config():
    return tf.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=64,
        num_hidden_layers=5,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
    )


OCTAVE = (  # vLLM 0.33's Octave caches, pinned apart (added after the groups above were pinned): head_dim 128
    "vllm:octave_k3v4",  # with 64 rotary dims (4-bit K block, then a 3-bit one); the 40-token prefill reads the
    "vllm:octave_k3v3",  # cache (a step of at most 128 query tokens does)
    "vllm:octave_k3v3_compact",
    "vllm:octave_k3v4+skip=1",
)


def octave_config():
    return tf.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=128,
        partial_rotary_factor=0.5,
        max_position_embeddings=512,
    )


def sliding_config():
    return tf.Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        max_position_embeddings=512,
    )


@dataclass(frozen=True)
class Layout:
    config: object
    schemes: tuple[str, ...]
    caches: tuple[str, ...]  # "dynamic", "static"


def layouts() -> dict[str, Layout]:
    return {
        "standard": Layout(standard_config, (*identity_schemes(), *STANDARD), ("dynamic", "static")),
        "sliding": Layout(sliding_config, ("auto", "bf16", "fp16", *SLIDING), ("dynamic",)),
        "mla": Layout(ds_mla_config, ("auto", "bf16", *MLA), ("dynamic", "static")),
        "octave": Layout(octave_config, OCTAVE, ("dynamic", "static")),
    }


def groups() -> list[str]:
    return [f"{name}/{cache}" for name, layout in layouts().items() for cache in layout.caches]


# -- fixed K/V, masks, tables ---------------------------------------------------------------------------
def given_kv(config, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, K and V (or the MLA latent and RoPE key) for PREFILL + STEPS tokens: exact values."""
    layout = kv_layout(config)
    n = PREFILL + STEPS
    if layout.is_mla:
        shapes = ((BATCH, 1, n, layout.mla_latent_dim), (BATCH, 1, n, layout.mla_rope_dim))
    else:
        shapes = ((BATCH, layout.num_kv_heads, n, layout.head_dim), (BATCH, layout.num_kv_heads, n, layout.v_head_dim))
    return [
        tuple(exact_values(shape, seed=1000 + 2 * i + j).to(dtype) for j, shape in enumerate(shapes))
        for i in range(layout.num_layers)
    ]


def prefill_mask() -> torch.Tensor:
    mask = torch.ones(BATCH, PREFILL, dtype=torch.long)
    mask[1, :PADDED] = 0
    return mask


def scale_table(scheme, config) -> ScaleTable | None:
    """A static table per layer (tensor) or per layer and head: exact powers-of-two-times-mantissa values."""
    if scheme.scales is not ScaleSource.STATIC:
        return None
    layout = kv_layout(config)
    shape = (
        (layout.num_layers,) if scheme.granularity.kind.value == "tensor" else (layout.num_layers, layout.num_kv_heads)
    )
    k, v = (exact_values(shape, seed=seed, low_exp=-7, high_exp=-1).abs() for seed in (7, 8))
    return ScaleTable(k, v, {"format": scheme.format})


def model_for(config_fn):
    """A model of the layout, only for ``quantized_kv`` to bind to (its weights are never used)."""
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(config_fn(), attn_implementation="sdpa").eval()


# -- hashing ------------------------------------------------------------------------------------------
def _hash_dynamic_store(h: TensorHash, st) -> None:
    for part in (st.codes, st.scale, st.zero, st.tensor_scale, st.fixed):
        h.tensor(part)
    h.value(st.nbytes())


def _hash_static_store(h: TensorHash, st) -> None:
    n = int(st.length)
    if not st.quantized:
        h.tensor(st.raw[:, :, :n])
        return
    h.tensor(st.codes[:, :, :n])
    for part in (st.token_scale, st.token_zero):
        h.tensor(None if part is None else part[:, :, :n])
    for part in (st.scale, st.zero, st.tensor_scale, st.fixed):
        h.tensor(part)


@torch.inference_mode()
def hash_run(h: TensorHash, model, text: str, cache_kind: str, dtype: torch.dtype) -> None:
    """One scheme, one cache kind, one dtype: prefill, decode steps, what each returns, what is stored."""
    scheme = parse_scheme(text)
    kv = given_kv(model.config, dtype)
    h.label(f"{text} {cache_kind} {dtype}")
    with quantized_kv(model, scheme, scale_table=scale_table(scheme, model.config)) as session:
        if cache_kind == "dynamic":
            cache = session.new_cache(prefill_mask())
        else:
            cache = session.new_static_cache(PREFILL + STEPS, prefill_mask())
        for span in [slice(0, PREFILL)] + [slice(t, t + 1) for t in range(PREFILL, PREFILL + STEPS)]:
            for i, (k, v) in enumerate(kv):
                keys, values = cache.update(k[:, :, span], v[:, :, span], i)
                h.read_values(keys)
                h.read_values(values)
        for layer in cache.storage_layers():
            for st in (layer.k, layer.v):
                (_hash_dynamic_store if cache_kind == "dynamic" else _hash_static_store)(h, st)
        h.value(cache.nbytes())
        session.check_finite()


def fingerprints(only: Iterable[str] | None = None) -> dict[str, str]:
    """Group (layout/cache kind) -> SHA-256 over every scheme and dtype of :func:`hash_run`."""
    out = {}
    for name, layout in layouts().items():
        for cache_kind in layout.caches:
            group = f"{name}/{cache_kind}"
            if only is not None and group not in only:
                continue
            model = model_for(layout.config)
            h = TensorHash()
            with one_thread():
                for text in layout.schemes:
                    for dtype in DTYPES:
                        hash_run(h, model, text, cache_kind, dtype)
            out[group] = h.hexdigest()
    return out


# -- tests --------------------------------------------------------------------------------------------
def test_the_storage_fingerprints_are_pinned_with_the_numerics_version():
    check_pins(PINNED, fingerprints(), "test_storage_fingerprint", "the storage caches' numbers")


def test_the_schemes_cover_every_storage_kind():
    """Every granularity and scale source, unscaled formats, engine codecs, skips, sliding and MLA layouts."""
    parsed = [parse_scheme(t) for t in STANDARD]
    assert {s.granularity.kind.value for s in parsed} == {"tensor", "head", "block", "token", "group"}
    assert {s.scales for s in parsed} == set(ScaleSource)
    assert any(s.is_identity for s in map(parse_scheme, identity_schemes()))
    assert any(s.skip_layers for s in parsed) and any(parse_scheme(t).skip_layers == "sliding" for t in SLIDING)
    assert {"vllm:turboquant_k8v4", "llamacpp:q8_0", "vllm:int8_per_token_head"} <= set(STANDARD)
    assert kv_layout(sliding_config()).sliding_layers == (0, 1, 3)
    assert kv_layout(ds_mla_config()).is_mla and "vllm:fp8_ds_mla" in MLA
    assert kv_layout(octave_config()).rotary_dim == 64  # Octave's K: one 4-bit rotary block, one 3-bit block


def assert_changed(group: str, unpatched: str, patched: str) -> None:
    """A mutation's fingerprint differs from the unpatched one and from the pin (the pin test holds the two equal)."""
    assert patched != unpatched
    assert patched != reference(PINNED, group, lambda: unpatched)


def test_a_changed_read_of_the_stored_bytes_changes_the_fingerprint(monkeypatch):
    """Mutation: the stored codes read back with every value one part in 2**20 too large."""
    import evalkit.integration.stored_read as stored_read

    real = stored_read.dequantize_stored
    group = "standard/dynamic"
    unpatched = fingerprints([group])[group]
    monkeypatch.setattr(stored_read, "dequantize_stored", lambda *a, **k: real(*a, **k) * (1 + 2.0**-20))
    assert_changed(group, unpatched, fingerprints([group])[group])


def test_padding_counted_in_the_scales_changes_the_fingerprint(monkeypatch):
    """Mutation: the cache ignores the prefill's padding mask (padded positions enter every amax)."""
    from evalkit.integration.growing import Padding

    real = Padding.__init__

    def unmasked(self, attention_mask):
        real(self, None)

    group = "standard/static"
    unpatched = fingerprints([group])[group]
    monkeypatch.setattr(Padding, "__init__", unmasked)
    assert_changed(group, unpatched, fingerprints([group])[group])


def test_a_change_that_keeps_the_numbers_keeps_the_fingerprint(monkeypatch):
    """Control: a first write's values decoded afresh from the stored bytes instead of handed over from
    the quantizer (the same bits by design) is a refactor, not a numerics change: nothing to re-pin."""
    from evalkit.integration.stored import StoredTensor

    real = StoredTensor.read

    def read_afresh(self, dtype=None):
        self._fresh = None
        return real(self, dtype)

    group = "standard/dynamic"
    unpatched = fingerprints([group])[group]
    monkeypatch.setattr(StoredTensor, "read", read_afresh)
    assert fingerprints([group])[group] == unpatched


if __name__ == "__main__":
    from tests.numerics.exact import prepare_process

    prepare_process()
    print(f"PINNED entry:\n{pin_entry(fingerprints())}")
