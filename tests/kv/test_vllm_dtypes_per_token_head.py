"""vllm:int8_per_token_head and vllm:fp8_per_token_head: the quantizer against an independent
numpy reading of vLLM's ``_reshape_cache_per_token_head`` (float32 arithmetic step by step,
ml_dtypes for the E4M3 cast), the scheme strings, and the storage path of a tiny model."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
import transformers as tf

from evalkit import quantized_kv
from evalkit.errors import SchemeError
from evalkit.integration.hf_compat import output_cache
from evalkit.kv.memory import bytes_per_token, check_layout_scheme
from evalkit.kv.quantize import decode, dequantize, encode_quantized, quantize
from evalkit.kv.scheme import parse_scheme, parse_schemes
from evalkit.models.info import kv_layout

F32 = np.float32


def numpy_kernel(x: np.ndarray, int8: bool) -> tuple[np.ndarray, np.ndarray]:
    """A plain reading of the kernel for x (..., D) float32: (codes, scales), one op at a time in float32.
    ``amax / QUANT_MAX`` as the compiled kernel computes it (measured on an H200): ``amax * fl(1/QUANT_MAX)``."""
    qmax = F32(127.0) if int8 else F32(448.0)
    amax = np.abs(x).max(axis=-1, keepdims=True).astype(F32)
    scale = np.maximum((amax * (F32(1.0) / qmax)).astype(F32), F32(1e-6)).astype(F32)
    y = (x * (F32(1.0) / scale).astype(F32)).astype(F32)
    if int8:
        y = np.where(y >= 0, y + F32(0.5), y - F32(0.5)).astype(F32)
        return np.trunc(np.clip(y, F32(-128), F32(127))).astype(np.int8), scale
    y = np.clip(y, -qmax, qmax).astype(F32)
    return y.astype(ml_dtypes.float8_e4m3fn), scale


def sample(seed: int = 0, shape=(2, 3, 37, 64)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.logspace(-3, 2, shape[2])[None, None, :, None]
    x[0, 0, 0] = 0.0  # an all-zero head: scale 1e-6, codes 0
    x[0, 1, 1] = 1e-9  # below the scale floor
    x[1, 0, 2, :4] = torch.tensor([127.0, -63.5, 0.5, -0.5])  # exact halves after scaling by 1
    x[1, 0, 3, :2] = torch.tensor([127.0, 0.49999997 * 1.0])  # the float32 +0.5 rounds up to 1.0
    return x


@pytest.mark.parametrize("name,int8", [("vllm:int8_per_token_head", True), ("vllm:fp8_per_token_head", False)])
def test_codes_and_scales_equal_a_plain_reading_of_the_kernel(name, int8):
    scheme = parse_scheme(name)
    x = sample()
    q = quantize(x, scheme.kv_format, scheme.granularity)
    codes, scale = numpy_kernel(x.numpy(), int8)
    stored = encode_quantized(q, scheme.kv_format)
    assert q.scale.shape == (*x.shape[:3], 1) and q.scale.dtype == torch.float32
    assert np.array_equal(q.scale.numpy(), scale)
    if int8:
        assert stored.dtype == torch.int8 and np.array_equal(stored.numpy(), codes)
    else:
        assert stored.dtype == torch.float8_e4m3fn
        assert np.array_equal(stored.view(torch.uint8).numpy(), codes.view(np.uint8))
    assert torch.equal(dequantize(q), decode(stored, scheme.kv_format) * q.scale)
    assert float(q.scale[0, 0, 0, 0]) == F32(1e-6) and not bool(q.codes[0, 0, 0].any())


def test_int8_rounds_half_away_from_zero_as_the_float32_addition_does():
    scheme = parse_scheme("vllm:int8_per_token_head")
    x = torch.tensor([127.0, -63.5, 0.5, -0.5, 2.5, -2.5, 0.49999997, 1.0]).reshape(1, 1, 1, 8)
    x = torch.cat([x, torch.zeros(1, 1, 1, 24)], dim=-1)  # scale = 127/127 = 1
    q = quantize(x, scheme.kv_format, scheme.granularity)
    assert q.codes[0, 0, 0, :8].tolist() == [127, -64, 1, -1, 3, -3, 1, 1]  # 0.49999997 + 0.5 == 1.0 in float32


def test_scheme_strings_round_trip_and_resolve_as_the_profile_maps_fp8():
    from evalkit.engines.registry import get_profile

    for text in ("vllm:int8_per_token_head", "vllm:fp8_per_token_head+skip=0,1"):
        assert str(parse_scheme(text)) == text and parse_scheme(str(parse_scheme(text))) == parse_scheme(text)
    cuda = get_profile("vllm-cuda")
    for d in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        assert parse_scheme(f"vllm:{d}") == cuda.scheme_for(d)
    assert parse_scheme("vllm:auto").is_identity and str(parse_scheme("vllm:bfloat16")) == "bf16"
    assert str(parse_scheme("vllm:float16")) == "fp16" and parse_scheme("vllm:float16").is_unscaled
    got = [str(s) for s in parse_schemes("auto,vllm:int8_per_token_head+skip=0,1,vllm:fp8,nvfp4")]
    assert got == ["auto", "vllm:int8_per_token_head+skip=0,1", "fp8_e4m3/tensor/unit", "nvfp4"]


@pytest.mark.parametrize(
    "text,words",
    [
        ("fp4_e2m1/group16/dynamic+scale_dtype=e4m3+recipe=vllm_nvfp4_4over6+rounding=rtz", "vllm:nvfp4_4over6"),
        ("int4_asym/token/dynamic+recipe=vllm_turboquant_k3v4_nc+rounding=rtz", "vllm:turboquant_k3v4_nc"),
        ("vllm:fp8_inc", "Gaudi"),
        ("vllm:int9", "has no kv_cache_dtype"),
        ("int8/token/dynamic+recipe=vllm_per_token_head+rounding=rna", "vllm:int8_per_token_head"),
        ("vllm:auto+skip=0", "takes no options"),
    ],
)
def test_refusals_are_one_line(text, words):
    with pytest.raises(SchemeError) as e:
        parse_scheme(text)
    assert words in str(e.value) and "\n" not in str(e.value)


def _llama(head_dim: int):
    cfg = tf.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(cfg).eval()


def test_per_token_head_refuses_small_heads_and_mla():
    with pytest.raises(SchemeError, match="head_size >= 32"):
        check_layout_scheme(parse_scheme("vllm:int8_per_token_head"), kv_layout(_llama(16).config))
    mla = tf.DeepseekV3Config(
        vocab_size=64, hidden_size=64, num_hidden_layers=1, num_attention_heads=2, kv_lora_rank=32
    )
    with pytest.raises(SchemeError, match="no MLA backend"):
        check_layout_scheme(parse_scheme("vllm:fp8_per_token_head"), kv_layout(mla))


@pytest.mark.parametrize("name,int8", [("vllm:int8_per_token_head", True), ("vllm:fp8_per_token_head", False)])
@torch.no_grad()
def test_the_storage_path_stores_the_kernels_codes_for_prefill_and_decode(name, int8):
    model = _llama(32)
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    with quantized_kv(model, "auto"):
        raw = output_cache(model(ids)).layers[0].k.values  # layer 0's K is unchanged by quantization
    with quantized_kv(model, name):
        cache = output_cache(model(ids[:, :9]))
        model(ids[:, 9:], cache=cache, use_cache=True)
    k = cache.layers[0].k
    codes, scale = numpy_kernel(raw.float().numpy(), int8)
    stored = k.codes if int8 else k.codes.view(torch.uint8)
    assert np.array_equal(stored.numpy(), codes if int8 else codes.view(np.uint8))
    assert np.array_equal(k.scale.numpy(), scale)
    layout = kv_layout(model.config)
    per_token = 2 * layout.num_layers * layout.num_kv_heads * (32 + 4)  # codes + one float32 scale, K and V
    assert bytes_per_token(layout, parse_scheme(name)) == per_token
    assert cache.nbytes() == 2 * 12 * per_token
