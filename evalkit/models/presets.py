"""Capacity-planning presets: the attention numbers of a few models people serve, as published.

Each preset holds only fields copied from the model's published ``config.json`` (the fields that
size the KV cache) plus the published total parameter count and the dtype the weights ship in, so
``evalkit capacity --preset NAME`` can estimate the weight footprint. ``source`` says where the
numbers were checked (copies of the config files, found through public code and docs search,
since this machine has no Hugging Face access). Any other model: ``--config config.json`` or
``--model ID`` (reads the config only, never the weights).
"""

from __future__ import annotations

from types import SimpleNamespace

from evalkit.errors import EvalkitError

PRESETS: dict[str, dict] = {
    "llama-3.1-8b": {
        "hub_id": "meta-llama/Llama-3.1-8B",
        "config": {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "hidden_size": 4096, "max_position_embeddings": 131072},
        "params": 8.03e9, "weights_dtype": "bf16",
        "source": "config.json of meta-llama/Llama-3.1-8B (copy in github.com/citsjtu2020/LLM-Prof sglang/Model_Config.md; "
                  "oumi configs/recipes/llama3_1/README.md)",
    },
    "llama-3.1-70b": {
        "hub_id": "meta-llama/Llama-3.1-70B",
        "config": {"model_type": "llama", "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
                   "hidden_size": 8192, "max_position_embeddings": 131072},
        "params": 70.6e9, "weights_dtype": "bf16",
        "source": "oumi configs/recipes/llama3_1/README.md (Llama 3.1 70B: 80 layers, 64 heads, 8 KV heads, hidden 8192)",
    },
    "qwen3-32b": {
        "hub_id": "Qwen/Qwen3-32B",
        "config": {"model_type": "qwen3", "num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
                   "head_dim": 128, "hidden_size": 5120, "max_position_embeddings": 40960},
        "params": 32.8e9, "weights_dtype": "bf16",
        "source": "Ascend MindSpeed-RL configs/model/qwen3_32b.yaml (64 layers, 64 heads, 8 query groups, kv_channels 128, hidden 5120)",
    },
    "deepseek-v3": {
        "hub_id": "deepseek-ai/DeepSeek-V3",
        "config": {"model_type": "deepseek_v3", "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
                   "hidden_size": 7168, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                   "v_head_dim": 128, "max_position_embeddings": 163840},
        "params": 671e9, "weights_dtype": "fp8",
        "source": "config.json of deepseek-ai/DeepSeek-V3 (copy in gitcode cann-recipes-train llm_rl/deepseek/verl_patches/config.json; "
                  "vLLM DeepseekV3Config defaults)",
    },
    "kimi-k2": {
        "hub_id": "moonshotai/Kimi-K2-Instruct",
        "config": {"model_type": "kimi_k2", "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64,
                   "hidden_size": 7168, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                   "v_head_dim": 128, "max_position_embeddings": 131072},
        "params": 1.04e12, "weights_dtype": "fp8",
        "source": "config of moonshotai/Kimi-K2-Instruct (DeepseekV3 architecture): NVIDIA Megatron-Bridge KimiK2Provider "
                  "(61 layers, 64 heads, hidden 7168) and Megatron launch args --kv-lora-rank 512 --qk-pos-emb-head-dim 64",
    },
}

WEIGHT_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


def preset_names() -> list[str]:
    return list(PRESETS)


def get_preset(name: str) -> dict:
    key = name.strip().lower()
    if key not in PRESETS:
        raise EvalkitError(f"unknown preset {name!r}: use one of {', '.join(PRESETS)} (or --config FILE / --model ID)")
    return PRESETS[key]


def config_namespace(fields: dict) -> SimpleNamespace:
    """A config-like object for :func:`evalkit.models.info.kv_layout` from a plain dict (a config.json)."""
    fields = dict(fields)
    text = fields.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" not in fields:
        fields = {**text, "model_type": text.get("model_type", fields.get("model_type", "unknown"))}
    return SimpleNamespace(**fields)


def weights_bytes(params: float, dtype: str) -> int:
    if dtype not in WEIGHT_BYTES:
        raise EvalkitError(f"unknown weights dtype {dtype!r}: use one of {', '.join(WEIGHT_BYTES)}")
    return int(params * WEIGHT_BYTES[dtype])
