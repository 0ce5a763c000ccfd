"""The static (compiled) decode path: the same stored bytes as the dynamic storage cache for every
scheme kind, a compiled step equal to the eager one, and under the identity scheme transformers'
own static-cache decoding of the same cache length bit for bit.

Compiled here means ``torch.compile(fullgraph=True)`` with the ``eager`` backend: dynamo traces the
whole step (the model's forward with the cache's quantize / store / dequantize ops, no graph
break, no recompile between steps) and runs the captured graph with the same kernels, so equality
is exact; Inductor and CUDA graphs (the GPU's default) are benchmarks/gpu_check.py's to measure.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from evalkit import quantized_kv
from evalkit.errors import EvalkitError, SchemeError
from evalkit.evals.decode.loop import position_ids
from evalkit.integration.compile_cache import cache_length
from evalkit.integration.hf_compat import cache_inputs
from evalkit.integration.static_decode import StaticDecoder, greedy_generate, resolve_decode_path, sampling_warpers

from tests.tiny_models import ds_mla_512, llama_head64, tiny_model

B, P, L = 2, 13, 23

SCHEMES = [  # one per scheme kind: granularities, scale sources, 4-bit formats, engine codecs
    "auto",
    "fp8_e4m3/tensor/dynamic",
    "fp8_e4m3/head/dynamic",
    "fp8_e4m3/tensor/unit",
    "fp8_e5m2/block16/dynamic",
    "int4/block8/dynamic",
    "fp8_e4m3/token/dynamic",
    "int4_asym/group8/dynamic",
    "int8_asym/head/dynamic",
    "nvfp4",
    "mxfp4",
    "fp8_e4m3/tensor/dynamic+skip=0",
    "vllm:int8_per_token_head",
    "vllm:fp8_per_token_head",
    "vllm:int4_per_token_head",
    "vllm:turboquant_k8v4",
    "vllm:turboquant_4bit_nc",
    "vllm:ultraquant_4bit",
    "llamacpp:q8_0",
    "llamacpp:q4_0/q8_0",
]
MLA_SCHEMES = ["bf16", "fp8_e4m3/tensor/dynamic", "fp8_e4m3/token/dynamic+rope=bf16", "vllm:fp8_ds_mla"]


@pytest.fixture(scope="module")
def mha():
    return llama_head64(kv_heads=2)


@pytest.fixture(scope="module")
def gqa():
    return llama_head64(kv_heads=1)


@pytest.fixture(autouse=True)
def eager_backend(monkeypatch):
    monkeypatch.setenv("EVALKIT_COMPILE_BACKEND", "eager")


def batch(pad: bool = True):
    ids = torch.randint(3, 128, (B, L), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    if pad:
        mask[1, :4] = 0
    return ids, mask


@torch.inference_mode()
def static_run(model, scheme, compiled, pad=True):
    """Teacher-forced: prefill P tokens, then one per step to L - 1; the logits and the cache."""
    ids, mask = batch(pad)
    pos = position_ids(mask)
    head = model.get_output_embeddings()
    with quantized_kv(model, scheme) as session:
        dec = StaticDecoder(session, model.base_model, mask, P, L - 1, compiled, bucketed=True)  # one shape for both
        logits = [head(dec.prefill(ids[:, :P], pos[:, :P]))]
        for t in range(P, L - 1):
            logits.append(head(dec.step(ids[:, t : t + 1], pos[:, t : t + 1])))
    return torch.stack(logits), dec.cache


def given_kv(model, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Seeded K/V (or MLA latent / RoPE key) per layer, as the model's attention hands them to the cache."""
    from evalkit.models.info import kv_layout

    layout = kv_layout(model.config)
    g = torch.Generator().manual_seed(7)
    if layout.is_mla:
        shapes = ((B, 1, length, layout.mla_latent_dim), (B, 1, length, layout.mla_rope_dim))
    else:
        shapes = (
            (B, layout.num_kv_heads, length, layout.head_dim),
            (B, layout.num_kv_heads, length, layout.v_head_dim),
        )
    out = []
    for _ in range(layout.num_layers):
        k, v = (torch.randn(shape, generator=g) for shape in shapes)
        k[..., :2] *= 20  # outlier channels
        out.append((k, v))
    return out


@torch.inference_mode()
def feed_both(model, scheme):
    """The same K/V written into a dynamic and a static storage cache: prefill, then one token a step."""
    _, mask = batch()
    kv = given_kv(model, L - 1)
    with quantized_kv(model, scheme) as session:
        dynamic = session.new_cache(mask[:, :P])
        static = session.new_static_cache(L - 1, mask[:, :P])
        for cache in (dynamic, static):
            for i, (k, v) in enumerate(kv):
                cache.update(k[:, :, :P], v[:, :, :P], i)
            for t in range(P, L - 1):
                for i, (k, v) in enumerate(kv):
                    cache.update(k[:, :, t : t + 1], v[:, :, t : t + 1], i)
    return dynamic, static


def same_reads(dynamic, static) -> list[str]:
    """Where the two caches' stored values differ (every written position, every layer and side)."""
    bad = []
    for d_layer, s_layer in zip(dynamic.storage_layers(), static.storage_layers(), strict=True):
        for side, d, s in (("K", d_layer.k, s_layer.k), ("V", d_layer.v, s_layer.v)):
            want = d.decoded()
            got = s.read(torch.float32)[:, :, : want.shape[2]]
            if not torch.equal(got, want):
                bad.append(f"layer {d_layer.layer_idx} {side}: {int((got != want).sum())} values differ")
            if d.quantized and not torch.equal(_bytes(s.codes[:, :, : want.shape[2]]), _bytes(d.codes)):
                bad.append(f"layer {d_layer.layer_idx} {side}: stored bytes differ")
    return bad


def _bytes(t):
    return t.contiguous().view(torch.uint8)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_static_cache_stores_what_the_dynamic_one_stores(gqa, scheme):
    assert same_reads(*feed_both(gqa, scheme)) == []


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_compiled_step_equals_the_eager_one(mha, scheme):
    eager, eager_cache = static_run(mha, scheme, compiled=False)
    compiled, compiled_cache = static_run(mha, scheme, compiled=True)
    assert torch.equal(compiled, eager)
    for a, b in zip(eager_cache.storage_layers(), compiled_cache.storage_layers(), strict=True):
        for x, y in ((a.k, b.k), (a.v, b.v)):
            assert torch.equal(x.read(torch.float32), y.read(torch.float32))


@pytest.mark.slow
def test_with_gqa_compiled_and_eager_store_the_same_bytes(gqa):
    """transformers' sdpa attention packs the query groups of a one-token step in eager mode and
    repeats K/V under dynamo (``sdpa_attention_forward``): the attention's float rounding differs
    there, for the plain model as for every scheme (float32 noise unquantized). The bytes stored
    from the same K/V do not differ (layer 0, whose K/V come from the tokens alone)."""
    eager, _ = static_run(gqa, "auto", compiled=False)
    compiled, _ = static_run(gqa, "auto", compiled=True)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    _, eager_cache = static_run(gqa, "fp8_e4m3/tensor/dynamic", compiled=False)
    _, compiled_cache = static_run(gqa, "fp8_e4m3/tensor/dynamic", compiled=True)
    layer0 = eager_cache.storage_layers()[0], compiled_cache.storage_layers()[0]
    assert torch.equal(_bytes(layer0[0].k.codes), _bytes(layer0[1].k.codes))


@pytest.mark.slow
@pytest.mark.parametrize("scheme", MLA_SCHEMES)
def test_mla_through_the_static_cache(scheme):
    model = ds_mla_512() if "ds_mla" in scheme else tiny_model("deepseek_v3")
    assert same_reads(*feed_both(model, scheme)) == []
    compiled, _ = static_run(model, scheme, compiled=True)
    eager, _ = static_run(model, scheme, compiled=False)
    assert torch.equal(compiled, eager)


@pytest.mark.parametrize("pad", [False, True])
def test_identity_equals_transformers_static_cache_generate(gqa, pad):
    ids, mask = batch(pad)
    ids, mask = ids[:, :P], mask[:, :P]
    n = 9
    with torch.inference_mode():
        ref = gqa.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            past_key_values=tf.StaticCache(config=gqa.config, max_cache_len=cache_length(P + n - 1, False)),
            disable_compile=True,
            output_logits=True,
            return_dict_in_generate=True,
        )
        with quantized_kv(gqa, "auto") as session:
            logits = []
            tokens = greedy_generate(session, gqa, ids, mask, n, [], 0, compiled=False, on_logits=logits.append)
    assert torch.equal(tokens, ref.sequences[:, P:])
    assert all(torch.equal(a, b.float()) for a, b in zip(logits, ref.logits, strict=True))


def test_identity_compiled_equals_transformers_static_cache_compiled(gqa):
    """The same backend compiling transformers' own static-cache step and evalkit's identity step."""
    import inspect

    ids, mask = batch(pad=False)
    pos = position_ids(mask)
    # transformers < 5.20 write a static cache at (and mask by) cache_position, which later releases derive
    by_position = "cache_position" in inspect.signature(type(gqa.base_model).forward).parameters

    def where(start: int, n: int) -> dict:
        return {"cache_position": torch.arange(start, start + n)} if by_position else {}

    with torch.inference_mode():
        length = cache_length(L - 1, True)  # the compiled step's cache: the length's bucket
        cache = tf.StaticCache(config=gqa.config, max_cache_len=length)
        kw = cache_inputs(gqa.base_model, cache)
        gqa.base_model(ids[:, :P], attention_mask=mask[:, :P], position_ids=pos[:, :P], **kw, **where(0, P))
        step = torch.compile(
            lambda i, p, m, extra: gqa.base_model(i, attention_mask=m, position_ids=p, **kw, **extra).last_hidden_state,
            backend="eager",
            fullgraph=True,
        )
        ref = []
        for t in range(P, L - 1):
            m = (torch.arange(length)[None, None, None, :] <= t) & torch.ones(B, 1, 1, length, dtype=torch.bool)
            ref.append(step(ids[:, t : t + 1], pos[:, t : t + 1], m, where(t, 1))[:, -1].clone())
    logits, _ = static_run(gqa, "auto", compiled=True, pad=False)
    head = gqa.get_output_embeddings()
    with torch.inference_mode():
        assert all(torch.equal(head(r), got) for r, got in zip(ref, logits[1:], strict=True))


def test_greedy_generation_stops_and_pads_after_eos(gqa):
    """A row that produced EOS gets the pad token from then on; the other rows are untouched."""
    ids, mask = batch(pad=True)
    ids, mask = ids[:, :P], mask[:, :P]
    with torch.inference_mode(), quantized_kv(gqa, "fp8_e4m3/tensor/dynamic") as session:
        free = greedy_generate(session, gqa, ids, mask, 6, [], 0, compiled=False)
        eos = int(free[0, -1])  # row 0's last token: row 0 stops where it first produces it
        tokens = greedy_generate(session, gqa, ids, mask, 6, [eos], 0, compiled=False)
    for row in range(B):
        hits = (free[row] == eos).nonzero()
        stop = int(hits[0, 0]) + 1 if len(hits) else 6
        assert tokens[row, :stop].tolist() == free[row, :stop].tolist()
        assert set(tokens[row, stop:].tolist()) <= {0}


def test_decode_paths_resolve_by_device_and_refuse_unknown_names():
    assert resolve_decode_path("auto", "cpu") == "eager"
    assert resolve_decode_path("auto", "cuda") == "compiled"
    assert resolve_decode_path("static", "cuda") == "static"
    with pytest.raises(Exception, match="is not one of auto, eager, static, compiled"):
        resolve_decode_path("fast", "cpu")


def test_sliding_window_models_are_refused_in_one_line():
    model = tiny_model("gemma3")
    ids, mask = batch()
    with quantized_kv(model, "fp8_e4m3/tensor/dynamic") as session, pytest.raises(SchemeError) as err:
        StaticDecoder(session, model.base_model, mask, P, L - 1, False)
    assert "sliding_attention" in str(err.value) and "--decode-path eager" in str(err.value)
    assert "\n" not in str(err.value)


def test_static_memory_is_the_engine_bytes_of_max_len(gqa):
    """A static cache holds its buffers for max_len tokens (plus a block's ring): what a preallocated
    engine pool holds; the engine bytes count the tokens written."""
    from evalkit.kv.memory import model_cache_bytes
    from evalkit.kv.scheme import parse_scheme
    from evalkit.models.info import kv_layout

    for scheme in ("fp8_e4m3/tensor/unit", "fp8_e4m3/token/dynamic", "vllm:int8_per_token_head"):
        _, cache = static_run(gqa, scheme, compiled=False, pad=False)
        layout, s = kv_layout(gqa.config), parse_scheme(scheme)
        assert cache.nbytes() == model_cache_bytes(layout, s, L - 1, batch=B)
        held = model_cache_bytes(layout, s, cache_length(L - 1, True), batch=B)  # L - 1's bucket
        assert cache.held_bytes() <= held + 64 * B * 2 * 4 * layout.num_layers


@pytest.mark.parametrize("scheme", ["auto", "fp8_e4m3/tensor/dynamic"])
def test_sampling_on_the_compiled_path_draws_what_generate_draws(gqa, scheme):
    """temperature 0.7, top_p 0.95, two seeds: the compiled static path gives, per seed, the tokens
    that ``generate(do_sample=True)`` gives on the eager path (the dynamic storage cache)."""
    ids, mask = batch(pad=True)
    ids, mask = ids[:, :P], mask[:, :P]
    n, settings = 12, {"do_sample": True, "temperature": 0.7, "top_p": 0.95}
    got = {}
    for seed in (0, 1):
        with torch.inference_mode(), quantized_kv(gqa, scheme) as session:
            torch.manual_seed(seed)
            ref = gqa.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, pad_token_id=0, **settings)
            torch.manual_seed(seed)
            warpers = sampling_warpers(gqa, **settings)
            got[seed] = greedy_generate(session, gqa, ids, mask, n, [], 0, compiled=True, warpers=warpers)
        assert torch.equal(got[seed], ref[:, P:]), seed
    assert not torch.equal(got[0], got[1])  # the seeds drew differently: the test compares samples


def test_sampling_settings_the_static_path_cannot_reproduce_are_refused(gqa):
    with pytest.raises(EvalkitError, match="eager decode path only: pass --decode-path eager"):
        sampling_warpers(gqa, do_sample=True, min_p=0.1)
    assert sampling_warpers(gqa, do_sample=False, temperature=0.7) is None
