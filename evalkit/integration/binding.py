"""The per-layer K/V quantizer that both interception points share.

:class:`KVQuantizer` binds a scheme to one model's KV layout: it resolves skipped layers
(indices or every sliding-window layer), loads and validates a static scale table once, checks
the granularity against head_dim, refuses non-finite K/V with a clear error, and quantizes one
layer's K or V. The attention hook (fake quantization, :mod:`evalkit.integration.install`) and the storage
cache (:mod:`evalkit.integration.storage`) both call it, so the two paths cannot drift apart.
"""

from __future__ import annotations

import torch

from evalkit.errors import NonFiniteKVError, ScaleError, SchemeError
from evalkit.model_info import KVLayout
from evalkit.kv.quantize import check_granularity, fake_quantize
from evalkit.kv.scheme import GranularityKind, ScaleSource, Scheme
from evalkit.kv.scale_table import ScaleTable, load_scale_table

UNIT_SCALE = torch.ones(1, 1, 1, 1)


class KVQuantizer:
    def __init__(self, scheme: Scheme, layout: KVLayout, config_hash: str | None = None,
                 scale_table: ScaleTable | None = None):
        self.scheme = scheme
        self.layout = layout
        self.fmt = scheme.kv_format
        if scheme.is_identity:
            self.table = None
            return
        if layout.is_mla and scheme.granularity.kind in (GranularityKind.HEAD, GranularityKind.BLOCK):
            raise SchemeError(
                f"{scheme.granularity} has no meaning for the MLA latent of {layout.model_type} (one shared latent per token, no KV heads): "
                "use tensor, token or group<N> (e.g. group128 for 128-value tiles)"
            )
        if layout.is_mla:
            check_granularity(scheme.granularity, layout.mla_latent_dim)
            if scheme.granularity.kind is GranularityKind.GROUP and not scheme.rope_bf16:
                rope_group = min(scheme.granularity.size, layout.mla_rope_dim)
                if layout.mla_rope_dim % rope_group:
                    raise SchemeError(f"group{scheme.granularity.size} does not tile the {layout.mla_rope_dim}-value RoPE key: use a width dividing it or +rope=bf16")
        else:
            if scheme.rope_bf16:
                raise SchemeError("+rope=bf16 applies to multi-head latent attention models only: drop it")
            check_granularity(scheme.granularity, layout.head_dim)
            check_granularity(scheme.granularity, layout.v_head_dim)
        if isinstance(scheme.skip_layers, tuple) and scheme.skip_layers and max(scheme.skip_layers) >= layout.num_layers:
            raise SchemeError(f"skip={max(scheme.skip_layers)} but the model has layers 0..{layout.num_layers - 1}: fix the layer list")
        self.table = None
        if scheme.scales is ScaleSource.STATIC:
            self.table = scale_table or load_scale_table(
                scheme.static_path, layout, granularity=scheme.granularity.kind.value, config_hash=config_hash
            )
            made_for = self.table.meta.get("format")
            if made_for and made_for != scheme.format:
                raise ScaleError(
                    f"static scales in {scheme.static_path} were calibrated for {made_for} (scale = amax / its max), "
                    f"not {scheme.format}: calibrate for {scheme.format} or use {made_for}"
                )

    def is_active(self, layer_idx: int) -> bool:
        """Whether this layer's K/V are quantized (not the baseline, not a skipped layer)."""
        if self.fmt.is_identity:
            return False
        return not self.scheme.skips_layer(layer_idx, self.layout.is_sliding(layer_idx))

    def fixed_scale(self, which: str, layer_idx: int, device) -> torch.Tensor | None:
        """The scale for static and unit sources; None for dynamic scales."""
        if self.scheme.scales is ScaleSource.UNIT:
            return UNIT_SCALE.to(device)
        if self.scheme.scales is ScaleSource.STATIC:
            return self.table.layer_scale(which, layer_idx).to(device)
        return None

    def check_finite(self, which: str, layer_idx: int, x: torch.Tensor) -> None:
        if not bool(torch.isfinite(x).all()):
            raise NonFiniteKVError(
                f"layer {layer_idx} {which.upper()} contains NaN or inf before quantization: the model's activations overflowed "
                "(load it in float32 or bfloat16 rather than float16)"
            )

    def __call__(self, which: str, layer_idx: int, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        if not self.is_active(layer_idx):
            return x
        scale = self.fixed_scale(which, layer_idx, x.device)
        try:
            return fake_quantize(x, self.fmt, self.scheme.granularity, scale, valid, check_finite=True)
        except NonFiniteKVError:
            self.check_finite(which, layer_idx, x)  # raises with the layer named
            raise
