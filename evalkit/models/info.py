"""Architecture facts evalkit needs from a transformers config: layers, KV heads, head_dim,
which layers use a sliding window, and whether attention is multi-head latent attention (MLA).

Everything is read from the config, so the same code answers for a loaded model, a local
config.json and a capacity-planning preset. Two fingerprints key the evaluations' baseline caches:
:func:`config_hash` (the config) and :func:`weights_fingerprint` (the weights themselves).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from evalkit.errors import UnsupportedModelError

MLA_MODEL_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_linear", "longcat_flash"})
# DeepSeek V4 / V4.1: one 512-value entry per token shared by K and V (448 NoPE + 64 RoPE values, held as an
# MLA latent and RoPE key); every layer keeps a sliding window of them plus, where its compress ratio is not
# 0, one compressed entry per ratio tokens (transformers' DeepseekV4Config: layer_types and compress_rates)
DSV4_MODEL_TYPES = frozenset({"deepseek_v4", "deepseek_v41"})
DSV4_COMPRESS = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
NO_INTERFACE_MODEL_TYPES = frozenset({"falcon", "bloom", "mpt"})


@dataclass(frozen=True)
class KVLayout:
    model_type: str
    num_layers: int
    num_kv_heads: int
    head_dim: int  # for K; equals the V head dim except for MLA
    v_head_dim: int
    sliding_layers: tuple[int, ...]
    sliding_window: int | None
    max_positions: int | None
    mla_latent_dim: int = 0  # kv_lora_rank for MLA models
    mla_rope_dim: int = 0  # qk_rope_head_dim for MLA models
    attention_layers: tuple[int, ...] | None = None  # None: every layer has attention
    compress_ratios: tuple[int, ...] | None = None  # DeepSeek V4: per layer, 0 (window only) or tokens per entry
    # standard attention: the dims RoPE rotates, int(head_dim x partial_rotary_factor) as vLLM reads it
    # (rocm_octave.py rope_dim_from_hf_config); None on MLA models and on layouts recorded before it
    rotary_dim: int | None = None

    @property
    def is_mla(self) -> bool:
        return self.mla_latent_dim > 0

    def is_sliding(self, layer_idx: int) -> bool:
        return layer_idx in self.sliding_layers


def text_config(config):
    get = getattr(config, "get_text_config", None)
    return get(decoder=True) if get else config


def kv_layout(config) -> KVLayout:
    cfg = text_config(config)
    model_type = getattr(cfg, "model_type", "unknown")
    n_layers = _first(cfg, "num_hidden_layers", "n_layer", "num_layers")
    n_heads = _first(cfg, "num_attention_heads", "n_head")
    n_kv = getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "multi_query_group_num", None) or n_heads
    if getattr(cfg, "multi_query", False):
        n_kv = 1
    hidden = _first(cfg, "hidden_size", "n_embd", "d_model")
    head_dim = getattr(cfg, "head_dim", None) or hidden // n_heads
    layer_types = list(getattr(cfg, "layer_types", None) or [])
    sliding = tuple(i for i, t in enumerate(layer_types) if t in ("sliding_attention", "chunked_attention"))
    window = getattr(cfg, "sliding_window", None) if sliding else None
    if (
        not layer_types
        and getattr(cfg, "sliding_window", None)
        and getattr(cfg, "use_sliding_window", True)
        and model_type in ("mistral",)
    ):
        sliding, window = tuple(range(n_layers)), cfg.sliding_window
    max_pos = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    latent = getattr(cfg, "kv_lora_rank", 0) or 0 if model_type in MLA_MODEL_TYPES else 0
    rope = getattr(cfg, "qk_rope_head_dim", 0) or 0 if latent else 0
    v_head_dim = getattr(cfg, "v_head_dim", None) or head_dim
    compress = None
    if model_type in DSV4_MODEL_TYPES:
        latent, rope, compress = _dsv4(cfg, head_dim, n_layers)
        sliding, window, layer_types = tuple(range(n_layers)), cfg.sliding_window, []
    attention_layers = None
    if layer_types and any(t not in ("full_attention", "sliding_attention", "chunked_attention") for t in layer_types):
        attention_layers = tuple(
            i for i, t in enumerate(layer_types) if t in ("full_attention", "sliding_attention", "chunked_attention")
        )
    return KVLayout(
        model_type, n_layers, n_kv, head_dim, v_head_dim, sliding, window, max_pos, latent, rope, attention_layers,
        compress, None if latent else rotary_dim(cfg, head_dim),
    )  # fmt: skip


def rotary_dim(cfg, head_dim: int) -> int:
    """The dims RoPE rotates, as vLLM 0.33 reads them (``vllm/v1/attention/ops/rocm_octave.py``
    ``rope_dim_from_hf_config``): ``int(head_dim * factor)``, the factor the config's ``partial_rotary_factor``,
    else its ``rope_parameters``' (a dict), else 1.0."""
    factor = getattr(cfg, "partial_rotary_factor", None)
    if factor is None:
        params = getattr(cfg, "rope_parameters", None) or {}
        factor = params.get("partial_rotary_factor", 1.0) if isinstance(params, dict) else 1.0
    return int(head_dim * factor)


def _dsv4(cfg, head_dim: int, n_layers: int) -> tuple[int, int, tuple[int, ...]]:
    """DeepSeek V4's (NoPE width, RoPE width, compress ratio per layer) from its config: ``qk_rope_head_dim`` (or
    ``partial_rotary_factor`` x ``head_dim``, default 64 of 512), ``compress_ratios`` (V4.1's per-layer list) or
    ``layer_types`` with ``compress_rates``."""
    rope = getattr(cfg, "qk_rope_head_dim", None) or round(
        head_dim * (getattr(cfg, "partial_rotary_factor", None) or 0.125)
    )
    ratios = getattr(cfg, "compress_ratios", None)
    if ratios is None:
        rates = {**DSV4_COMPRESS, **(getattr(cfg, "compress_rates", None) or {})}
        types = getattr(cfg, "layer_types", None)
        if not types:
            raise UnsupportedModelError(
                f"config of model type {cfg.model_type!r} has neither compress_ratios nor layer_types: evalkit cannot "
                "tell which layers compress their cache: give the model's config.json"
            )
        ratios = [rates.get(t, 0) for t in types]
    return head_dim - rope, rope, tuple(int(r) for r in list(ratios)[:n_layers])


def _first(cfg, *names):
    for name in names:
        value = getattr(cfg, name, None)
        if value is not None:
            return value
    raise UnsupportedModelError(
        f"config of model type {getattr(cfg, 'model_type', '?')!r} has none of {names}: evalkit cannot size its KV cache"
    )


def check_supported(model) -> None:
    """Refuse models whose attention does not go through transformers' attention interface."""
    model_type = getattr(text_config(model.config), "model_type", "unknown")
    if model_type in NO_INTERFACE_MODEL_TYPES or not getattr(model, "_supports_attention_backend", False):
        raise UnsupportedModelError(
            f"model type {model_type!r} does not route attention through transformers' AttentionInterface, "
            "so evalkit cannot intercept its KV cache: use a model such as llama, mistral, qwen2/3, gemma, phi3, gpt2, gpt_neox or opt"
        )


def config_hash(config) -> str:
    """A stable hash of the parts of a config that decide the KV cache shape and the weights' meaning."""
    cfg = text_config(config).to_dict()
    for volatile in (
        "_name_or_path",
        "transformers_version",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "torch_dtype",
        "dtype",
        "use_cache",
        "quantization_config",
        "architectures",
        "_commit_hash",
    ):
        cfg.pop(volatile, None)
    blob = json.dumps(cfg, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def hash_weights(h, model) -> None:
    """Feed ``h`` (a hashlib object) every parameter's name, shape, dtype and first/last 64 values:
    a cheap fingerprint of the weights themselves, for baseline-cache keys."""
    import torch

    with torch.no_grad():
        for name, t in model.named_parameters():
            flat = t.detach().reshape(-1)
            h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
            h.update(torch.cat([flat[:64], flat[-64:]]).float().cpu().numpy().tobytes())


def weights_fingerprint(model) -> str:
    """SHA-256 hex of :func:`hash_weights`: the one weight fingerprint of every evaluation's baseline cache."""
    h = hashlib.sha256()
    hash_weights(h, model)
    return h.hexdigest()
