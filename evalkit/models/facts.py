"""What a sweep's dry run needs to know about a model without loading its weights.

Sizing a sweep (:mod:`evalkit.sweep.estimate`) needs the parameter count and attention shape of
each model (FLOPs per token, bytes per decode step), its tokenizer when it is on this machine
(exact token counts), and whether its weights must still be downloaded. :func:`model_facts` reads
them, in order, from the embedded model's dense copy (or, before its first conversion, its preset:
a dry run converts nothing), a local folder, the local Hugging Face
cache (config only, never the network), or evalkit's capacity presets (found by
:func:`evalkit.models.presets.find_preset`, the look-up ``evalkit capacity --preset`` uses). The
parameter count comes from instantiating the config on PyTorch's ``meta`` device (no memory,
exact), or from the preset's published count. A model known nowhere gets facts with ``params = 0`` and a note.

:func:`read_config` is the same look-up for the config alone (the checks made before a model loads,
:mod:`evalkit.sweep.preflight`: whether a scheme fits the architecture), and :func:`sparse_attention`
reads from it whether the model selects the tokens it attends to (DeepSeek V3.2's indexer).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.models.presets import DTYPE_BYTES, config_namespace, find_preset


@dataclass
class ModelFacts:
    name: str
    params: float = 0.0  # parameters (output head included)
    layers: int = 0
    attn_width: int = 0  # query heads x head dim: attention FLOPs per token and context token
    kv_width: int = 0  # KV heads x head dim: cache bytes per token and layer, for K (and as much for V)
    head_dim: int = 0  # per head: the scale overhead of per-token and codec schemes (bytes per cached element)
    vocab: int | None = None
    max_length: int | None = None
    model_type: str = "unknown"
    dtype_bytes: float = 4.0  # bytes per weight as the sweep loads it (its dtype on its device)
    download_bytes: int = 0  # weights still to download into the Hugging Face cache (0: local or cached)
    weights_local: bool = False  # the weights are on this machine (the probe can load them)
    tokenizer: object | None = None
    source: str = "unknown"  # where the facts come from (printed)
    notes: list[str] = field(default_factory=list)

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def known(self) -> bool:
        return self.params > 0 and self.layers > 0


def _load_dtype_bytes(dtype: str, device: str) -> float:
    """Bytes per weight as :func:`evalkit.models.loading.load_model` will load them (its dtype rule)."""
    from evalkit.models.loading import resolve_dtype

    return float(resolve_dtype(dtype, device).itemsize)


def _from_config(facts: ModelFacts, config: dict) -> None:
    """Shape from a config dict; the exact parameter count from the config built on the meta device."""
    from evalkit.models.info import kv_layout

    layout = kv_layout(config_namespace(config))
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    heads = text.get("num_attention_heads") or text.get("n_head") or layout.num_kv_heads
    facts.layers = layout.num_layers
    facts.attn_width = int(heads) * layout.head_dim
    facts.kv_width = (
        layout.num_kv_heads * layout.head_dim if not layout.is_mla else layout.mla_latent_dim + layout.mla_rope_dim
    )
    facts.head_dim = layout.head_dim
    facts.vocab = text.get("vocab_size")
    facts.max_length = layout.max_positions
    facts.model_type = layout.model_type
    if not facts.params:
        facts.params = float(_meta_param_count(config))


def _meta_param_count(config: dict) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**config) if "model_type" in config else None
    if cfg is None:
        return 0
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    seen, total = set(), 0
    for p in model.parameters():  # tied weights counted once
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def _tokenizer(folder: str, local_only: bool = True):
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder, local_files_only=local_only)
    except Exception:  # noqa: BLE001  (no tokenizer here: counts fall back to approximations)
        return None


def model_facts(name: str, dtype: str = "auto", device: str = "cpu") -> ModelFacts:
    """Facts about a grid's model, from this machine's files or evalkit's presets (never the network)."""
    from evalkit.models.loading import embedded_dense_dir, embedded_name, is_path_like

    facts = ModelFacts(name=name, dtype_bytes=_load_dtype_bytes(dtype, device))
    folder: Path | None = None
    embedded = embedded_name(name)
    if embedded:
        folder = embedded_dense_dir(embedded)
        facts.weights_local = True  # converted from the installed package on first load
        facts.source = "embedded model"
        if not (folder / "config.json").is_file():  # not converted yet: a dry run converts nothing
            key, preset = find_preset(embedded)
            facts.params = float(preset["params"])
            facts.source = f"embedded model (evalkit preset {key}; converted on its first load)"
            _from_config(facts, preset["config"])
            return facts  # no tokenizer until then: the workloads count characters and mark their rows ~
    elif is_path_like(name):
        folder = Path(name).expanduser()
        facts.weights_local = folder.is_dir()
        facts.source = "local folder"
    if folder is not None:
        if (folder / "config.json").is_file():
            _from_config(facts, json.loads((folder / "config.json").read_text()))
            facts.tokenizer = _tokenizer(str(folder))
        return facts
    # a hub id: the local Hugging Face cache only
    config_path = None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, "config.json")
        config_path = found if isinstance(found, str) else None
        weights = [try_to_load_from_cache(name, f) for f in ("model.safetensors", "model.safetensors.index.json")]
        facts.weights_local = any(isinstance(w, str) for w in weights)
    except Exception:  # noqa: BLE001  (not a valid hub id: nothing cached)
        pass
    if config_path is not None:
        config = json.loads(Path(config_path).read_text())
        facts.source = "config in the local Hugging Face cache"
        _from_config(facts, config)
        facts.tokenizer = _tokenizer(name)
        shipped = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
        if not facts.weights_local:
            facts.download_bytes = int(facts.params * DTYPE_BYTES.get(shipped, 2))
        return facts
    preset = find_preset(name)
    if preset is not None:
        key, p = preset
        facts.params = float(p["params"])
        facts.source = f"evalkit preset {key} (weights not cached here)"
        _from_config(facts, p["config"])
        facts.download_bytes = int(p["params"] * DTYPE_BYTES[p["weights_dtype"]])
        return facts
    facts.notes.append(
        f"model {name!r}: no local files and no evalkit preset: its size is unknown, so its runs are not timed"
    )
    return facts


# DeepSeek V3.2-style sparse attention: a config with ``index_topk`` (the tokens its indexer selects per
# query). vLLM 0.33 decides by the same key: ``DeepseekV2Attention`` sets ``is_v32 = hasattr(config,
# "index_topk")`` and passes it on as ``use_sparse`` (vllm/model_executor/models/deepseek_v2.py), and the
# attention backends refuse a model whose sparseness is not theirs (``validate_configuration`` in
# vllm/v1/attention/backend.py: "sparse not supported" / "non-sparse not supported").
SPARSE_ATTENTION_KEY = "index_topk"


def text_fields(config: dict) -> dict:
    """The fields of the language model in a config.json (its ``text_config`` in a multimodal one)."""
    text = config.get("text_config")
    return text if isinstance(text, dict) and "num_hidden_layers" not in config else config


def sparse_attention(config: dict) -> bool:
    """Whether the model's attention reads only the tokens an indexer selects (``index_topk`` in its config)."""
    return text_fields(config).get(SPARSE_ATTENTION_KEY) is not None


def read_config(name: str) -> tuple[dict | None, str]:
    """``(config.json fields, where they come from)`` for a grid's or ``run``'s model, in
    :func:`model_facts`' order (the embedded model's dense copy or its preset, a local folder, the local
    Hugging Face cache, evalkit's presets), never loading weights or touching the network; ``(None, why)``
    when this machine has no config for it."""
    from evalkit.models.loading import embedded_dense_dir, embedded_name, is_path_like

    embedded = embedded_name(name)
    if embedded:
        path = embedded_dense_dir(embedded) / "config.json"
        if path.is_file():
            return json.loads(path.read_text()), "embedded model"
        key, preset = find_preset(embedded)
        return preset["config"], f"embedded model (evalkit preset {key})"
    if is_path_like(name):
        path = Path(name).expanduser() / "config.json"
        if not path.is_file():
            return None, f"no config.json in {Path(name).expanduser()}"
        try:
            return json.loads(path.read_text()), "local folder"
        except (OSError, ValueError) as exc:
            return None, f"{path} cannot be read ({exc})"
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, "config.json")
    except Exception:  # noqa: BLE001  (not a valid hub id: nothing cached)
        found = None
    if isinstance(found, str):
        return json.loads(Path(found).read_text()), "config in the local Hugging Face cache"
    preset = find_preset(name)
    if preset is not None:
        return preset[1]["config"], f"evalkit preset {preset[0]}"
    return None, "its config is neither in the local Hugging Face cache nor an evalkit preset"
