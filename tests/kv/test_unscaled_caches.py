"""The unscaled 16-bit caches: ``auto`` is the identity (the model's own dtype), ``bf16`` and ``fp16``
store K/V rounded to that dtype (torch's cast, nearest even) and hand attention those values back in
the model's dtype; on a model computing in that dtype they are the identity too. Checked against
plain torch casts of what the identity cache holds, never against evalkit's own cast."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from evalkit import quantized_kv
from evalkit.engines.llamacpp.engine import cache_types
from evalkit.engines.vllm.config import engine_config
from evalkit.errors import SchemeError
from evalkit.integration.hf_compat import output_cache
from evalkit.kv.memory import bytes_per_element
from evalkit.kv.scheme import Scheme, parse_scheme


def _llama(dtype: torch.dtype = torch.float32):
    cfg = tf.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(cfg).eval().to(dtype)


IDS = torch.randint(3, 128, (2, 10), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
def _run(model, scheme: str):
    """Logits and what layer 0's cache hands attention (K, V), for a prefill and two decode steps."""
    with quantized_kv(model, scheme):
        out = model(IDS[:, :8])
        cache = output_cache(out)
        logits = [out.logits]
        for t in (8, 9):
            logits.append(model(IDS[:, t : t + 1], cache=cache, use_cache=True).logits)
        layer = cache.layers[0]
        return torch.cat(logits, dim=1), layer.k.values.clone(), layer.v.values.clone(), cache.nbytes()


def test_the_names_parse_and_print_back():
    assert parse_scheme("auto") == Scheme() and parse_scheme("auto").is_identity and str(Scheme()) == "auto"
    for name in ("bf16", "fp16"):
        s = parse_scheme(name)
        assert str(s) == name and s.is_unscaled and not s.is_identity and bytes_per_element(s, 64) == 2
        with pytest.raises(SchemeError, match=f"{name} is an unscaled 16-bit cache and takes no options"):
            parse_scheme(f"{name}+skip=0")


@pytest.mark.parametrize("name, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_a_float32_model_reads_its_kv_rounded_to_16_bits(name, dtype):
    model = _llama()
    plain, k, v, nbytes = _run(model, "auto")
    got, k16, v16, nbytes16 = _run(model, name)
    # the cache was written with the identity's K/V up to the first divergence: compare the prefill's part
    assert torch.equal(k16[:, :, :8], k[:, :, :8].to(dtype).to(torch.float32))
    assert torch.equal(v16[:, :, :8], v[:, :, :8].to(dtype).to(torch.float32))
    assert k16.dtype == torch.float32 and not torch.equal(k16, k)  # rounding did something
    assert not torch.equal(got, plain) and (got - plain).abs().max() < 0.05
    assert nbytes16 == nbytes  # both counted at 2 bytes per element, as served


def test_the_cast_holds_the_16_bit_values_it_counts():
    model = _llama()
    with quantized_kv(model, "bf16"), torch.no_grad():
        cache = output_cache(model(IDS[:, :8]))
        stored = cache.layers[0].k
        assert stored._raw.dtype == torch.bfloat16  # held in 16 bits, not a float32 copy
        assert stored.held_bytes() == stored._raw.numel() * 2


def test_on_a_bf16_model_bf16_is_the_identity():
    model = _llama(torch.bfloat16)
    plain, k, v, _ = _run(model, "auto")
    got, k16, v16, _ = _run(model, "bf16")
    assert torch.equal(got, plain) and torch.equal(k16, k) and torch.equal(v16, v)


def test_the_static_decode_cache_casts_too():
    """The compiled-decode path's preallocated buffers hold the cast values as the dynamic cache does."""
    from evalkit.integration.static_cache import StaticStoredTensor
    from evalkit.integration.stored import StoredTensor

    fmt = parse_scheme("bf16").kv_format
    first = StoredTensor(fmt, parse_scheme("bf16").granularity, None, False)
    x = torch.randn(1, 2, 4, 8, generator=torch.Generator().manual_seed(2))
    first.append(x)
    st = StaticStoredTensor(first, x, 6)
    step = torch.randn(1, 2, 1, 8, generator=torch.Generator().manual_seed(3))
    st.write_token(step)
    want = torch.cat([x, step], dim=2).to(torch.bfloat16).to(torch.float32)
    assert st.raw.dtype == torch.bfloat16 and torch.equal(st.read()[:, :, :5], want)


def test_engines_name_the_same_caches():
    assert str(parse_scheme("vllm:auto")) == "auto"
    assert str(parse_scheme("vllm:bfloat16")) == "bf16" and str(parse_scheme("vllm:float16")) == "fp16"
    assert [(engine_config(s).kv_cache_dtype, engine_config(s).emulation) for s in ("auto", "bf16", "fp16")] == [
        ("auto", "auto"),
        ("bfloat16", "bf16"),
        ("float16", "fp16"),
    ]
    assert cache_types("auto") == ("f16", "f16")  # llama.cpp's default cache is its baseline
    assert cache_types("bf16") == ("bf16", "bf16") and cache_types("fp16") == ("f16", "f16")
