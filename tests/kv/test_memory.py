"""KV bytes per token and per sequence, checked against plain arithmetic written out here and
against the tensors a real cache holds after generate()."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from evalkit.errors import SchemeError
from evalkit.integration.hf_compat import cache_inputs, output_cache
from evalkit.kv.memory import bytes_per_token, bytes_per_token_at, model_cache_bytes
from evalkit.kv.scheme import parse_scheme as P
from evalkit.models.info import kv_layout
from evalkit.models.presets import PRESETS, config_namespace


def preset_layout(name):
    return kv_layout(config_namespace(PRESETS[name]["config"]))


def llama_layout(layers=3, heads=8, kv_heads=8, head_dim=16):
    return kv_layout(
        tf.LlamaConfig(
            hidden_size=heads * head_dim,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            vocab_size=64,
        )
    )


# -- MLA: the published Kimi K2 / DeepSeek-V3 figures ---------------------------------------
@pytest.mark.parametrize("name", ["kimi-k2", "deepseek-v3"])
def test_mla_bytes_per_token_match_the_engine_layouts(name):
    layout = preset_layout(name)
    assert (layout.num_layers, layout.mla_latent_dim, layout.mla_rope_dim) == (61, 512, 64)
    assert bytes_per_token(layout, P("auto")) == 61 * (512 + 64) * 2 == 70_272
    assert bytes_per_token(layout, P("fp8_e4m3/tensor/dynamic")) == 61 * (512 + 64) == 35_136
    # FP8 latent, 4 float32 tile scales per 512 values, RoPE key in BF16: 656 bytes per layer
    assert bytes_per_token(layout, P("fp8_e4m3/group128/dynamic+rope=bf16")) == 61 * (512 + 4 * 4 + 64 * 2) == 40_016
    # RoPE quantized too, one scale per token for each of the two parts
    assert bytes_per_token(layout, P("fp8_e4m3/token/dynamic")) == 61 * (512 + 4 + 64 + 4)
    # the RoPE key (64 wide) under group128: one scale per token for it
    assert bytes_per_token(layout, P("fp8_e4m3/group128/dynamic")) == 61 * (512 + 16 + 64 + 4)


def test_mla_fp4_bytes_per_token():
    layout = preset_layout("kimi-k2")
    # NVFP4: 0.5 B per value + one E4M3 byte per 16; the per-tensor FP32 scale is per sequence, nothing per token
    assert bytes_per_token(layout, P("nvfp4")) == 61 * (256 + 32 + 32 + 4) == 19_764
    assert bytes_per_token(layout, P("nvfp4+rope=bf16")) == 61 * (256 + 32 + 128) == 25_376
    assert bytes_per_token(layout, P("mxfp4+rope=bf16")) == 61 * (256 + 16 + 128) == 24_400
    assert bytes_per_token(layout, P("mxfp8_e4m3+rope=bf16")) == 61 * (512 + 16 + 128)
    # per sequence: the NVFP4 global scales of latent and RoPE key, 4 bytes each per layer
    assert model_cache_bytes(layout, P("nvfp4"), 1000) == 1000 * 19_764 + 61 * 2 * 4


def test_dense_fp4_and_mx_bytes_per_token():
    layout = preset_layout("llama-3.1-8b")
    elems = 32 * 2 * 8 * 128  # layers x (K, V) x KV heads x head_dim
    assert bytes_per_token(layout, P("auto")) == 2 * elems == 131_072
    assert bytes_per_token(layout, P("nvfp4")) == elems * (0.5 + 1 / 16) == 36_864
    assert bytes_per_token(layout, P("sglang_fp4")) == 36_864  # SGLang's docs: 4.5 bits per value, 3.56x BF16
    assert bytes_per_token(layout, P("mxfp4")) == elems * (0.5 + 1 / 32) == 34_816
    assert bytes_per_token(layout, P("mxfp8_e4m3")) == elems * (1 + 1 / 32) == 67_584
    assert bytes_per_token(layout, P("fp4_e2m1/group16/dynamic")) == elems * (0.5 + 4 / 16)  # fp32 scales: 4 bytes
    assert model_cache_bytes(layout, P("nvfp4"), 100, batch=3) == 3 * 100 * 36_864 + 3 * 32 * 2 * 4
    assert model_cache_bytes(layout, P("mxfp4"), 100, batch=3) == 3 * 100 * 34_816


def test_a_group_that_does_not_divide_head_dim_is_refused():
    layout = llama_layout(layers=2, heads=4, kv_heads=2, head_dim=48)
    with pytest.raises(SchemeError, match="group32 does not divide head_dim 48"):
        bytes_per_token(layout, P("mxfp4"))
    assert bytes_per_token(layout, P("nvfp4")) == 2 * 2 * 2 * 48 * (0.5 + 1 / 16)


def test_mla_refuses_head_granularity_and_non_dividing_groups():
    layout = preset_layout("kimi-k2")
    with pytest.raises(SchemeError, match="tensor, token or group"):
        bytes_per_token(layout, P("fp8_e4m3/head/dynamic"))
    with pytest.raises(SchemeError, match="divide the latent width 512"):
        bytes_per_token(layout, P("fp8_e4m3/group96/dynamic"))


def test_mla_skipped_layers_are_bf16():
    layout = preset_layout("kimi-k2")
    got = bytes_per_token(layout, P("fp8_e4m3/tensor/dynamic+skip=0,60"))
    assert got == 59 * 576 + 2 * 1152


# -- full attention: MHA, GQA, MQA --------------------------------------------------------------
@pytest.mark.parametrize("kv_heads", [8, 2, 1])  # MHA, GQA, MQA
def test_full_attention_bytes_per_token(kv_heads):
    layout = llama_layout(layers=3, heads=8, kv_heads=kv_heads, head_dim=16)
    elems = 3 * 2 * kv_heads * 16  # layers x (K, V) x heads x head_dim
    assert bytes_per_token(layout, P("auto")) == 2 * elems
    assert bytes_per_token(layout, P("fp8_e4m3/tensor/dynamic")) == elems
    assert bytes_per_token(layout, P("fp8_e4m3/head/static+scales=x.safetensors")) == elems
    assert bytes_per_token(layout, P("fp8_e4m3/token/dynamic")) == elems + 3 * 2 * kv_heads * 4
    assert bytes_per_token(layout, P("fp8_e4m3/group8/dynamic")) == elems + 3 * 2 * kv_heads * 2 * 4
    assert bytes_per_token(layout, P("fp8_e4m3/block16/dynamic")) == elems + 3 * 2 * kv_heads * 4 / 16
    assert bytes_per_token(layout, P("int4/group8/dynamic")) == elems / 2 + 3 * 2 * kv_heads * 2 * 4
    assert bytes_per_token(layout, P("int8_asym/token/dynamic")) == elems + 3 * 2 * kv_heads * 8


def test_preset_dense_models():
    assert bytes_per_token(preset_layout("llama-3.1-8b"), P("auto")) == 32 * 2 * 8 * 128 * 2 == 131_072
    assert bytes_per_token(preset_layout("llama-3.1-70b"), P("auto")) == 80 * 2 * 8 * 128 * 2 == 327_680
    assert bytes_per_token(preset_layout("qwen3-32b"), P("fp8_e4m3/tensor/dynamic")) == 64 * 2 * 8 * 128 == 131_072


def test_sequence_bytes_exact_with_partial_blocks_and_per_sequence_scales():
    layout = llama_layout(layers=2, heads=4, kv_heads=2, head_dim=16)
    # 17 tokens, batch 3: data 2 layers x 2 (K,V) x 3 seqs x 2 heads x 17 x 16 bytes; block16 -> 2 blocks
    data = 2 * 2 * 3 * 2 * 17 * 16
    assert model_cache_bytes(layout, P("fp8_e4m3/block16/dynamic"), 17, batch=3) == data + 2 * 2 * 3 * 2 * 2 * 4
    assert model_cache_bytes(layout, P("fp8_e4m3/tensor/dynamic"), 17, batch=3) == data + 2 * 2 * 3 * 4
    assert model_cache_bytes(layout, P("fp8_e4m3/tensor/unit"), 17, batch=3) == data + 2 * 2 * 4
    # unit scales are one constant per layer whatever the granularity: nothing stored per block or token
    for fixed in ("fp8_e4m3/block16/unit", "fp8_e4m3/token/unit", "int4/group8/unit"):
        bits = 4 if fixed.startswith("int4") else 8
        assert model_cache_bytes(layout, P(fixed), 17, batch=3) == data * bits // 8 + 2 * 2 * 4
    assert model_cache_bytes(layout, P("fp8_e4m3/head/dynamic"), 17, batch=3) == data + 2 * 2 * 3 * 2 * 4
    assert model_cache_bytes(layout, P("auto"), 17, batch=3) == 2 * data
    assert bytes_per_token_at(layout, P("auto"), 17) == 2 * 2 * 2 * 2 * 16


def test_sliding_window_layers_are_capped_by_their_window():
    cfg = tf.Gemma3TextConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=8,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
    )
    layout = kv_layout(cfg)
    per_layer_token = 2 * 2 * 16 * 2  # K,V x heads x head_dim x BF16
    for seq in (5, 8, 100):
        want = per_layer_token * (3 * min(seq, 8) + seq)
        assert model_cache_bytes(layout, P("auto"), seq) == want
    # long-context rate: all four layers store a token up to the window
    assert bytes_per_token(layout, P("auto")) == 4 * per_layer_token
    # skip=sliding keeps the sliding layers in BF16, the full layer in FP8
    fp8 = model_cache_bytes(layout, P("fp8_e4m3/tensor/unit+skip=sliding"), 100)
    assert fp8 == per_layer_token * 3 * 8 + (per_layer_token // 2) * 100 + 2 * 4


def test_skipped_layers_are_bf16_without_scales():
    layout = llama_layout(layers=4, heads=4, kv_heads=2, head_dim=16)
    got = model_cache_bytes(layout, P("fp8_e4m3/token/dynamic+skip=0,3"), 10)
    per_tok_bf16 = 2 * 2 * 16 * 2
    per_tok_fp8 = 2 * 2 * (16 + 4)
    assert got == 10 * (2 * per_tok_bf16 + 2 * per_tok_fp8)


def test_per_tensor_scales_are_a_per_sequence_constant():
    """Kimi K2 FP8 with per-tensor scales: 35,136 B per token plus one float32 scale per cached tensor and layer."""
    layout, scheme = preset_layout("kimi-k2"), P("fp8_e4m3/tensor/dynamic")
    assert model_cache_bytes(layout, scheme, 4096) == 35_136 * 4096 + 61 * 2 * 4
    assert model_cache_bytes(layout, P("auto"), 4096) == 70_272 * 4096


def test_bf16_bytes_equal_what_transformers_dynamic_cache_holds():
    """The BF16 baseline: 2 bytes for every element transformers' own cache keeps after generate()."""
    from tests.tiny_models import tiny_model

    model = tiny_model("qwen3")
    ids = torch.randint(0, 100, (2, 7))
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=4,
        do_sample=False,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    cache = output_cache(out)
    elems = sum(layer.keys.numel() + layer.values.numel() for layer in cache.layers)
    seq = cache.get_seq_length()
    assert seq == 7 + 4 - 1
    assert model_cache_bytes(kv_layout(model.config), P("auto"), seq, batch=2) == 2 * elems


# -- against the real storage cache (evalkit.integration.storage) after generate() ---------------------------
def tiny_mla_model():
    cfg = tf.DeepseekV3Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=32,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(cfg).eval()


@pytest.fixture(scope="module")
def cache_models():
    from tests.tiny_models import tiny_model

    torch.manual_seed(0)
    head32 = tf.AutoModelForCausalLM.from_config(
        tf.LlamaConfig(
            vocab_size=128,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=512,
        )
    ).eval()  # head_dim 32, for the 32-wide MX groups
    return {"llama": tiny_model("llama"), "gemma3": tiny_model("gemma3"), "mla": tiny_mla_model(), "llama32": head32}


CACHE_CASES = [
    ("llama", "fp8_e4m3/tensor/dynamic"),
    ("llama", "fp8_e4m3/head/dynamic"),
    ("llama", "fp8_e4m3/block16/dynamic"),
    ("llama", "fp8_e4m3/token/dynamic"),
    ("llama", "int4_asym/group8/dynamic"),
    ("llama", "fp8_e5m2/tensor/unit+skip=0"),
    ("llama", "auto"),
    ("gemma3", "fp8_e4m3/tensor/dynamic"),
    ("gemma3", "fp8_e4m3/head/dynamic"),
    ("gemma3", "fp8_e4m3/block16/dynamic"),
    ("gemma3", "fp8_e4m3/token/dynamic+skip=sliding"),
    ("mla", "fp8_e4m3/tensor/dynamic"),
    ("mla", "fp8_e4m3/token/dynamic"),
    ("mla", "fp8_e4m3/group16/dynamic"),
    ("mla", "fp8_e4m3/group16/dynamic+rope=bf16"),
    ("mla", "auto"),
    ("llama", "nvfp4"),
    ("llama", "sglang_fp4"),
    ("llama", "fp4_e2m1/group8/dynamic+scale_dtype=e4m3+skip=0"),
    ("llama32", "mxfp4"),
    ("llama32", "mxfp8_e4m3"),
    ("gemma3", "nvfp4"),
    ("gemma3", "sglang_fp4+skip=sliding"),
    ("mla", "nvfp4"),
    ("mla", "mxfp4+rope=bf16"),
    ("mla", "mxfp8_e4m3"),
]


@pytest.mark.slow
@pytest.mark.parametrize("arch,scheme", CACHE_CASES)
def test_bytes_equal_the_real_cache_after_generate(cache_models, arch, scheme):
    """Exact equality with what evalkit's storage cache holds after a padded-batch generate()."""
    from evalkit import quantized_kv

    model = cache_models[arch]
    ids = torch.randint(3, 100, (2, 9), generator=torch.Generator().manual_seed(1))
    am = torch.ones_like(ids)
    am[0, :2] = 0  # left padding: padded slots are stored too
    s = P(scheme)
    with quantized_kv(model, s) as session:
        cache = session.new_cache(am)
        model.generate(
            ids, attention_mask=am, **cache_inputs(model, cache), max_new_tokens=10, do_sample=False, pad_token_id=0
        )
    seq = cache.get_seq_length()
    assert seq == 9 + 10 - 1
    want = model_cache_bytes(kv_layout(model.config), s, seq, batch=2, keep="transformers")
    assert cache.nbytes() == want
