"""Bytes per cached token for each vLLM ``kv_cache_dtype``, from vLLM's own KV-cache spec.

vLLM sizes its paged cache from one :class:`~vllm.v1.kv_cache_interface.AttentionSpec` per layer,
customised by the attention backend that serves the dtype (``backend.customize_spec``: the
per-token-head scale planes, TurboQuant's packed K+V slot, NVFP4's block scales). This module builds
that spec the way vLLM does and reads ``page_size_bytes`` with ``block_size=1``:

- standard attention: ``FullAttentionSpec(block_size=1, num_kv_heads, head_size, head_size_v,
  dtype, kv_quant_mode=get_kv_quant_mode(dtype))`` through the backend's ``customize_spec``, as
  ``vllm/platforms/interface.py`` computes a token's page bytes;
- MLA: vLLM's own ``MLAAttention.get_kv_cache_spec`` (which knows the 656-byte ``fp8_ds_mla`` and
  352-byte ``nvfp4_ds_mla`` rows), called on the layer's attributes, then the backend's spec.

The backend per dtype and architecture is :data:`evalkit.engines.vllm.dtypes` ``backend``. Where a
backend's module cannot be imported here (FlashInfer needs the ``flashinfer`` package; UltraQuant's
module builds Triton kernels at import) the page is built from the spec
fields that backend's ``customize_spec`` sets, with vLLM's own helpers, and the result says so
(:attr:`Page.how`). Nothing here is an evalkit formula: tests hold evalkit's
:func:`~evalkit.kv.memory.bytes_per_token` to these figures for every modelled dtype.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import SimpleNamespace

from evalkit.errors import EngineUnavailableError, SchemeError
from evalkit.models.info import KVLayout

AUTO_DTYPE = "bfloat16"  # what "auto" stores for a model served in BF16 (evalkit's baseline counts 2 bytes)


@dataclass(frozen=True)
class Page:
    """One dtype's cache footprint on one model, as vLLM allocates it."""

    kv_cache_dtype: str
    backend: str  # "module:Class" whose spec sized it
    per_layer: int  # bytes per token per attention layer (page_size_bytes at block_size 1)
    layers: int
    how: str  # "customize_spec" (the backend's own method) or what was used instead, and why
    skipped: int = 0  # layers vLLM keeps at the model's dtype for this dtype (TurboQuant/UltraQuant boundary)
    skipped_per_layer: int = 0  # their bytes per token (the "auto" spec)

    @property
    def per_token(self) -> int:
        return self.per_layer * (self.layers - self.skipped) + self.skipped_per_layer * self.skipped


def _torch_dtype(kv_cache_dtype: str):
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE

    return STR_DTYPE_TO_TORCH_DTYPE[AUTO_DTYPE if kv_cache_dtype == "auto" else kv_cache_dtype]


def _backend(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _gqa_spec(kv_cache_dtype: str, layout: KVLayout):
    from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode

    return FullAttentionSpec(
        block_size=1,
        num_kv_heads=layout.num_kv_heads,
        head_size=layout.head_dim,
        head_size_v=layout.v_head_dim,
        dtype=_torch_dtype(kv_cache_dtype),
        kv_quant_mode=get_kv_quant_mode(kv_cache_dtype),
    )


def _mla_spec(kv_cache_dtype: str, layout: KVLayout):
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention

    layer = SimpleNamespace(
        kv_cache_dtype=kv_cache_dtype,
        head_size=layout.mla_latent_dim + layout.mla_rope_dim,
        sliding_window=None,
        indexer=None,
        non_causal_multi_token_decode=False,
    )
    config = SimpleNamespace(
        cache_config=SimpleNamespace(block_size=1), model_config=SimpleNamespace(dtype=_torch_dtype("auto"))
    )
    return MLAAttention.get_kv_cache_spec(layer, config)


def _without_import(kv_cache_dtype: str, spec, backend: str):
    """The spec fields of a backend whose module does not import here, set with vLLM's own helpers."""
    from dataclasses import replace

    if backend.endswith(":FlashInferBackend") and spec.kv_quant_mode.is_nvfp4:
        from vllm.utils.torch_utils import get_dtype_size, nvfp4_kv_cache_full_dim

        width = nvfp4_kv_cache_full_dim(spec.head_size)
        spec = replace(
            spec, num_head_slots=2 * spec.num_kv_heads, state_content_bytes=width * get_dtype_size(spec.dtype)
        )
        return spec, "FlashInferBackend.customize_spec's fields (flashinfer not installed): nvfp4_kv_cache_full_dim"
    if backend.endswith(":UltraQuantAttentionBackend") and spec.kv_quant_mode.is_ultraquant:
        from vllm.v1.attention.ops.ultraquant.format import slot_size

        spec = replace(spec, state_content_bytes=slot_size(spec.head_size))
        return spec, "UltraQuantAttentionBackend.customize_spec's field (its module needs a GPU Triton): slot_size"
    raise EngineUnavailableError(f"vLLM backend {backend} does not import here, and its page is not rebuilt")


def page(kv_cache_dtype: str, layout: KVLayout, backend: str) -> Page:
    """vLLM's bytes per token for ``kv_cache_dtype`` on ``layout`` through ``backend`` ("module:Class")."""
    if layout.is_mla:
        spec = _mla_spec(kv_cache_dtype, layout)
    else:
        spec = _gqa_spec(kv_cache_dtype, layout)
    how = "customize_spec"
    try:
        cls = _backend(backend)
    except (ImportError, AttributeError, AssertionError):
        spec, how = _without_import(kv_cache_dtype, spec, backend)
    else:
        if kv_cache_dtype not in cls.supported_kv_cache_dtypes:
            raise SchemeError(f"vLLM's {backend} does not list kv_cache_dtype {kv_cache_dtype}")
        spec = cls.customize_spec(spec)
    layers = len(layout.attention_layers) if layout.attention_layers is not None else layout.num_layers
    skipped = _boundary_layers(kv_cache_dtype, layout)
    auto = _gqa_spec("auto", layout).page_size_bytes if skipped and not layout.is_mla else 0
    return Page(kv_cache_dtype, backend, spec.page_size_bytes, layers, how, len(skipped), auto)


def _boundary_layers(kv_cache_dtype: str, layout: KVLayout) -> list[str]:
    """The layers vLLM adds to ``kv_cache_dtype_skip_layers`` for TurboQuant/UltraQuant (``arg_utils``:
    ``TurboQuantConfig.get_boundary_skip_layers`` on a dense model), kept at the model's dtype."""
    if not (kv_cache_dtype.startswith("turboquant_") or kv_cache_dtype == "ultraquant_4bit"):
        return []
    from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig

    model_config = SimpleNamespace(is_hybrid=False, hf_text_config=SimpleNamespace(num_hidden_layers=layout.num_layers))
    return TurboQuantConfig.get_boundary_skip_layers(model_config)
