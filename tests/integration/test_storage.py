"""The storage cache: real codes, engine scale semantics, exact bytes, device- and dtype-clean.

The semantics are checked on layer 0, whose K/V depend only on the tokens (not on earlier
layers' quantization), by teacher-forced decoding (a prefill, then one token per step) against a
reference written here step by step from the raw K/V: dynamic tensor/head scales from each
sequence's prefill and then frozen, blocks counted from each sequence's first real token and
re-encoded from their raw K/V when tokens join them, per-token scales independent of everything else.
"""

from __future__ import annotations

import pytest
import torch

from evalkit import quantized_kv
from evalkit.integration.hf_compat import cache_inputs, output_cache
from evalkit.integration.storage import StorageCache
from evalkit.kv.memory import layer_cache_bytes
from evalkit.kv.quantize import dequantize, quantize, quantize_dequantize
from evalkit.kv.scheme import GranularityKind, parse_scheme
from evalkit.models.info import kv_layout

from tests.tiny_models import tiny_model

PREFILL, STEPS = 13, 9


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def inputs(pad=True, length=PREFILL + STEPS):
    ids = torch.randint(3, 128, (2, length), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    if pad:
        mask[1, :4] = 0
    return ids, mask


@torch.no_grad()
def teacher_forced(model, scheme, ids, mask, prefill=PREFILL) -> StorageCache:
    """Prefill, then one token per forward, continuing the storage cache the first forward made."""
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with quantized_kv(model, scheme):
        cache = output_cache(model(ids[:, :prefill], attention_mask=mask[:, :prefill], position_ids=pos[:, :prefill]))
        for t in range(prefill, ids.shape[1]):
            model(
                ids[:, t : t + 1],
                attention_mask=mask[:, : t + 1],
                position_ids=pos[:, t : t + 1],
                **cache_inputs(model, cache),
            )
    return cache


def reference_layer0(raw: torch.Tensor, scheme_text: str, mask: torch.Tensor, prefill: int) -> torch.Tensor:
    """What an engine stores for raw layer-0 K (B, H, S, D), one sequence at a time (real tokens only)."""
    s = parse_scheme(scheme_text)
    fmt, gran = s.kv_format, s.granularity
    out = torch.zeros_like(raw)
    for b in range(raw.shape[0]):
        start = int(mask[b].long().argmax())
        x = raw[b : b + 1, :, start:]
        p = prefill - start
        if s.scales.value == "unit":
            y = quantize_dequantize(x, fmt, gran, scale=torch.ones(1, 1, 1, 1))
        elif fmt.tensor_scale:  # NVFP4: per-token group scales under the prefill's per-tensor scale, frozen
            frozen = quantize(x[:, :, :p], fmt, gran).tensor_scale
            y = torch.cat(
                [dequantize(quantize(x[:, :, t : t + 1], fmt, gran, tensor_scale=frozen)) for t in range(x.shape[2])],
                dim=2,
            )
        elif gran.kind in (GranularityKind.TOKEN, GranularityKind.GROUP):
            y = torch.cat([quantize_dequantize(x[:, :, t : t + 1], fmt, gran) for t in range(x.shape[2])], dim=2)
        elif gran.kind in (GranularityKind.TENSOR, GranularityKind.HEAD):
            q = quantize(x[:, :, :p], fmt, gran)
            rest = quantize(x[:, :, p:], fmt, gran, scale=q.scale, zero=q.zero)
            y = torch.cat([dequantize(q), dequantize(rest)], dim=2)
        else:  # blocks of n from the sequence's first token; a partly filled block is re-encoded, from
            # its raw K/V, as tokens join
            n, y = gran.size, x[:, :, :0]
            for lo, hi in [(0, p)] + [(t, t + 1) for t in range(p, x.shape[2])]:
                first = lo // n * n
                y = torch.cat([y[:, :, :first], quantize_dequantize(x[:, :, first:hi], fmt, gran)], dim=2)
        out[b : b + 1, :, start:] = y
    return out


SEMANTIC_SCHEMES = [
    "fp8_e4m3/tensor/dynamic",
    "fp8_e4m3/head/dynamic",
    "int8_asym/head/dynamic",
    "fp8_e5m2/block4/dynamic",
    "int4/block8/dynamic",
    "fp8_e4m3/token/dynamic",
    "int4_asym/group8/dynamic",
    "int8_asym/group8/dynamic",
    "fp8_e4m3/tensor/unit",
    "fp8_e5m2/block4/unit",
]


@pytest.mark.parametrize("scheme", SEMANTIC_SCHEMES)
def test_layer0_stores_what_an_engine_stores(llama, scheme):
    ids, mask = inputs()
    raw = teacher_forced(llama, "auto", ids, mask).layers[0].k.values
    cache = teacher_forced(llama, scheme, ids, mask)
    expected = reference_layer0(raw, scheme, mask, PREFILL)
    got = cache.layers[0].k.values
    real = mask.bool()[:, None, :, None].expand_as(got)
    assert torch.equal(got[real], expected[real])


@pytest.mark.parametrize(
    "scheme", ["fp8_e5m2/block4/dynamic", "int4/block8/dynamic", "fp8_e4m3/block16/dynamic", "fp8_e5m2/block4/unit"]
)
def test_layer0_stores_what_an_engine_stores_unpadded_blocks(llama, scheme):
    """Without padding every sequence's blocks start together, and the cache takes its one-piece
    block path (StoredTensor._extend_blocks): still what the step-by-step reference stores."""
    ids, mask = inputs(pad=False)
    raw = teacher_forced(llama, "auto", ids, mask).layers[0].k.values
    cache = teacher_forced(llama, scheme, ids, mask)
    assert torch.equal(cache.layers[0].k.values, reference_layer0(raw, scheme, mask, PREFILL))


@pytest.mark.parametrize(
    "scheme", ["fp8_e4m3/block4/dynamic", "fp8_e5m2/block16/dynamic", "int8/block8/dynamic", "int4/block4/dynamic"]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_piece_block_path_equals_the_per_sequence_path(scheme, dtype):
    """The same token stream stored twice, bit for bit the same codes, values and scales: as row 1 of
    an unpadded batch (the one-piece path) and as row 1 of a batch whose first write left-pads it
    by 5 tokens (blocks start per sequence: the per-region path), over a prefill, single-token steps
    across block boundaries and multi-token writes."""
    from evalkit.integration.growing import Padding
    from evalkit.integration.stored import StoredTensor

    s, pad = parse_scheme(scheme), 5
    g = torch.Generator().manual_seed(3)
    stream = [torch.randn(2, 3, n, 16, generator=g).to(dtype) * 4 for n in (8, 1, 1, 1, 5, 1, 1, 1, 1, 17, 1)]
    fast, region = (StoredTensor(s.kv_format, s.granularity, None, True) for _ in range(2))
    for i, x in enumerate(stream):
        fast.append(x)
        if i == 0:  # row 0: 13 other tokens; row 1: 5 padding positions, then the stream's first 8 tokens
            first = torch.cat([torch.randn(2, 3, pad, 16, generator=g).to(dtype), x], dim=2)
            first[0] = torch.randn(3, 13, 16, generator=g).to(dtype)
            mask = torch.ones(2, 13, dtype=torch.long)
            mask[1, :pad] = 0
            region.append(first, Padding(mask))
        else:
            region.append(x)
    length = fast.values.shape[2]
    assert region.starts == [0, pad] and fast.starts == [0, 0]
    for name in ("codes", "values"):
        a, b = getattr(fast, name)[1], getattr(region, name)[1, :, pad:]
        assert a.dtype == b.dtype and torch.equal(a.float(), b.float()), name
    blocks = -(-length // s.granularity.size)
    assert torch.equal(fast.scale[1], region.scale[1, :, :blocks])
    expected = fast.decoded().to(dtype)  # the values attention reads are the decoded bytes, in the K/V's dtype
    assert torch.equal(fast.values, expected)


@pytest.mark.parametrize("scheme", SEMANTIC_SCHEMES + ["int4/group8/dynamic", "fp8_e4m3fnuz/head/dynamic", "auto"])
def test_values_attention_reads_equal_the_decoded_stored_bytes(llama, scheme):
    ids, mask = inputs()
    cache = teacher_forced(llama, scheme, ids, mask)
    for layer in cache.layers:
        for st in (layer.k, layer.v):
            real = mask.bool()[:, None, :, None].expand_as(st.values)
            assert torch.equal(st.decoded()[real], st.values.float()[real])


# FP4 and microscaling schemes; the 32-wide groups of MX need a model with head_dim 32
@pytest.fixture(scope="module")
def models(llama):
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
    )
    return {"llama": llama, "llama32": tf.AutoModelForCausalLM.from_config(cfg).eval()}


MICRO_SCHEMES = [
    ("llama", "nvfp4"),
    ("llama", "sglang_fp4"),
    ("llama", "fp4_e2m1/group8/dynamic+scale_dtype=e4m3"),
    ("llama", "fp4_e2m1/group16/dynamic"),
    ("llama32", "mxfp4"),
    ("llama32", "mxfp8_e4m3"),
    ("llama32", "nvfp4+skip=1"),
]


@pytest.mark.parametrize("arch,scheme", MICRO_SCHEMES)
def test_layer0_stores_what_an_engine_stores_microscaling(models, arch, scheme):
    ids, mask = inputs()
    raw = teacher_forced(models[arch], "auto", ids, mask).layers[0].k.values
    cache = teacher_forced(models[arch], scheme, ids, mask)
    expected = reference_layer0(raw, scheme, mask, PREFILL)
    got = cache.layers[0].k.values
    real = mask.bool()[:, None, :, None].expand_as(got)
    assert torch.equal(got[real], expected[real])


@pytest.mark.parametrize("arch,scheme", MICRO_SCHEMES)
def test_values_attention_reads_equal_the_decoded_stored_bytes_microscaling(models, arch, scheme):
    ids, mask = inputs()
    cache = teacher_forced(models[arch], scheme, ids, mask)
    fmt = parse_scheme(scheme).kv_format
    for layer in cache.layers:
        for st in (layer.k, layer.v):
            real = mask.bool()[:, None, :, None].expand_as(st.values)
            assert torch.equal(st.decoded()[real], st.values.float()[real])
            if st.quantized and fmt.packed:  # two E2M1 codes per stored byte
                assert st.codes.dtype == torch.uint8 and st.codes.shape[-1] * 2 == st.values.shape[-1]


@pytest.mark.parametrize("arch,scheme", MICRO_SCHEMES)
def test_bytes_equal_the_analytic_count_microscaling(models, arch, scheme):
    ids, mask = inputs(pad=False, length=21)
    _, cache = generate(models[arch], ids, mask, scheme)
    seq = ids.shape[1] + NEW_TOKENS - 1
    assert cache.nbytes() == expected_bytes(models[arch], scheme, 2, lambda layer: seq)


def test_scales_are_counted_at_their_storage_size(llama):
    """Per K (or V) tensor of one layer: codes + one byte per E4M3/E8M0 scale (+ 4 per sequence for NVFP4's global)."""
    ids, mask = inputs(pad=False, length=21)
    seq = ids.shape[1] + NEW_TOKENS - 1
    for scheme, per_token in (
        ("nvfp4", 2 * 8 + 2 * 1),
        ("sglang_fp4", 2 * 8 + 2 * 1),
        ("fp4_e2m1/group16/dynamic", 2 * 8 + 2 * 4),
    ):  # 2 KV heads x (16 / 2 code bytes + scales)
        _, cache = generate(llama, ids, mask, scheme)
        st = cache.layers[0].k
        extra = 2 * 4 if scheme == "nvfp4" else 0
        assert st.nbytes() == 2 * seq * per_token + extra, scheme
        assert (st.tensor_scale is not None) == (scheme == "nvfp4")


def test_frozen_tensor_scales_saturate_later_tokens(llama):
    """A decode token beyond the prefill's range saturates at the frozen scale (what engines do)."""
    from evalkit.integration.stored import StoredTensor

    fmt_scheme = parse_scheme("fp8_e4m3/tensor/dynamic")
    st = StoredTensor(fmt_scheme.kv_format, fmt_scheme.granularity, None, True)
    st.append(torch.full((1, 1, 4, 8), 2.0))
    st.append(torch.full((1, 1, 1, 8), 10.0))
    assert st.values[0, 0, -1].tolist() == [2.0] * 8
    assert st.scale.flatten()[0] == torch.tensor(2.0, dtype=torch.float32) / 448


def expected_bytes(model, scheme_text, batch, stored_per_layer):
    scheme = parse_scheme(scheme_text)
    layout = kv_layout(model.config)
    total = 0
    for layer in range(layout.num_layers):
        quantized = not scheme.is_identity and not scheme.skips_layer(layer, layout.is_sliding(layer))
        for dim in (layout.head_dim, layout.v_head_dim):
            total += layer_cache_bytes(scheme, batch, layout.num_kv_heads, stored_per_layer(layer), dim, quantized)
    return total


NEW_TOKENS = 9


def generate(model, ids, mask, scheme):
    with torch.no_grad(), quantized_kv(model, scheme) as session:
        cache = session.new_cache(mask)
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            **cache_inputs(model, cache),
            output_scores=True,
            return_dict_in_generate=True,
        )
    return out, cache


@pytest.mark.parametrize(
    "scheme",
    [
        "auto",
        "fp8_e4m3/tensor/dynamic",
        "fp8_e4m3/head/dynamic",
        "fp8_e4m3/block16/dynamic",
        "fp8_e4m3/token/dynamic",
        "int4/group8/dynamic",
        "int4_asym/token/dynamic",
        "fp8_e4m3/tensor/unit",
        "fp8_e4m3/head/unit",
        "fp8_e4m3/block16/unit",
        "fp8_e4m3/token/unit",
        "fp8_e5m2/head/dynamic+skip=1",
    ],
)
def test_bytes_equal_the_analytic_count(llama, scheme):
    ids, mask = inputs(pad=False, length=21)
    _, cache = generate(llama, ids, mask, scheme)
    seq = ids.shape[1] + NEW_TOKENS - 1  # the last generated token is never written
    assert cache.get_seq_length() == seq
    assert cache.nbytes() == expected_bytes(llama, scheme, 2, lambda layer: seq)


def test_codes_are_one_byte_and_int4_packs_two_per_byte(llama):
    ids, mask = inputs(length=21)
    _, fp8 = generate(llama, ids, mask, "fp8_e4m3/head/dynamic")
    _, int4 = generate(llama, ids, mask, "int4/token/dynamic")
    layer = fp8.layers[0]
    assert layer.k.codes.dtype == torch.float8_e4m3fn and layer.k.codes.shape[-1] == 16
    assert int4.layers[0].k.codes.dtype == torch.uint8 and int4.layers[0].k.codes.shape[-1] == 8
    assert isinstance(fp8, StorageCache)


def test_sliding_window_layers_are_capped():
    model = tiny_model("gemma3")  # layers 0-2 slide over 8 tokens, layer 3 is full
    ids, mask = inputs(pad=False, length=21)
    layout = kv_layout(model.config)
    seq = ids.shape[1] + NEW_TOKENS - 1
    for scheme in ("fp8_e4m3/token/dynamic", "fp8_e4m3/head/dynamic", "auto"):
        _, cache = generate(model, ids, mask, scheme)
        stored = lambda layer: min(seq, layout.sliding_window - 1) if layout.is_sliding(layer) else seq  # noqa: E731
        assert cache.nbytes() == expected_bytes(model, scheme, 2, stored)
    plain = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        output_scores=True,
        return_dict_in_generate=True,
    )
    ours, _ = generate(model, ids, mask, "auto")
    assert all(torch.equal(a, b) for a, b in zip(plain.scores, ours.scores))


def test_every_kept_tensor_lives_on_the_kv_device_in_fp32_scales(llama):
    ids, mask = inputs(length=21)
    for scheme in (
        "fp8_e4m3/head/unit",
        "fp8_e4m3/block4/dynamic",
        "int4_asym/group8/dynamic",
        "fp8_e4m3/tensor/dynamic",
    ):
        _, cache = generate(llama, ids, mask, scheme)
        for layer in cache.layers:
            for st in (layer.k, layer.v):
                for t in (st.codes, st.values, st.scale, st.zero, st.fixed, st.nonfinite):
                    if t is not None:
                        assert t.device == layer.keys.device
                for t in (st.scale, st.zero, st.fixed):
                    if t is not None:
                        assert t.dtype == torch.float32


def test_bfloat16_identity_is_exact_and_fp8_is_close_to_float32():
    model32 = tiny_model("llama")
    model16 = tiny_model("llama").to(torch.bfloat16)
    ids, mask = inputs()
    with torch.no_grad():
        ref16 = model16(ids, attention_mask=mask).logits
        with quantized_kv(model16, "auto"):
            assert torch.equal(model16(ids, attention_mask=mask).logits, ref16)
        for scheme in ("fp8_e4m3/tensor/dynamic", "fp8_e4m3/block16/dynamic", "int8/token/dynamic"):
            with quantized_kv(model16, scheme):
                out16 = model16(ids, attention_mask=mask).logits.float()
            with quantized_kv(model32, scheme):
                out32 = model32(ids, attention_mask=mask).logits
            real = mask.bool()
            # bf16 weights and activations alone move these logits by up to ~0.05; FP8 K/V must not add to that
            assert (out16[real] - out32[real]).abs().max() < 0.1, scheme
            assert (out16[real] - out32[real]).abs().max() < 2 * (
                ref16.float()[real] - model32(ids, attention_mask=mask).logits[real]
            ).abs().max() + 0.02


def _count_host_reads(fn) -> int:
    """How often ``fn`` reads a tensor value back to the host (bool(), item(), tolist())."""
    calls = {"n": 0}
    originals = {name: getattr(torch.Tensor, name) for name in ("__bool__", "item", "tolist")}

    def counting(name):
        def wrapper(self, *a, **k):
            calls["n"] += 1
            return originals[name](self, *a, **k)

        return wrapper

    for name in originals:
        setattr(torch.Tensor, name, counting(name))
    try:
        fn()
    finally:
        for name, f in originals.items():
            setattr(torch.Tensor, name, f)
    return calls["n"]


@pytest.mark.parametrize(
    "scheme", ["fp8_e4m3/tensor/dynamic", "fp8_e4m3/block16/dynamic", "fp8_e4m3/head/unit", "int4_asym/group8/dynamic"]
)
def test_host_reads_do_not_grow_with_the_number_of_layers(scheme):
    """No host synchronisation per layer: a 6-layer model reads back as often as a 2-layer one."""
    import transformers as tf

    from tests.tiny_models import tiny_config

    counts = []
    for layers in (2, 6):
        torch.manual_seed(0)
        cfg = tiny_config("llama")
        cfg.num_hidden_layers = layers
        model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
        ids, mask = inputs()
        with torch.no_grad(), quantized_kv(model, scheme):

            def step(model=model, ids=ids, mask=mask):
                cache = output_cache(model(ids[:, :PREFILL], attention_mask=mask[:, :PREFILL]))
                model(
                    ids[:, PREFILL : PREFILL + 1], attention_mask=mask[:, : PREFILL + 1], **cache_inputs(model, cache)
                )

            counts.append(_count_host_reads(step))
    assert counts[0] == counts[1], counts
