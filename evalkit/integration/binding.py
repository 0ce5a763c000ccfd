"""A KV scheme bound to one model's KV layout: what the storage cache needs to know per layer.

:class:`BoundScheme` validates a scheme against a model once (group widths against head_dim,
skipped layer indices, MLA granularities, a static table's shape, config hash and format: its
sidecar's, or for a table without one the model and format the scheme declares with
``+scales_model=``/``+scales_format=``), resolves
which layers are quantized (``+skip=`` indices or every sliding-window layer) and hands out the
fixed scale of static and unit sources on the device of the K/V they will scale. A missing static
scale is an error here, never a quiet 1.0.
"""

from __future__ import annotations

import dataclasses

import torch

from evalkit.data.resources import resolve_calibration_file
from evalkit.errors import ScaleError, SchemeError
from evalkit.kv.codec import check_layout, codec_for
from evalkit.kv.memory import check_mla_scheme
from evalkit.kv.quantize import check_granularity
from evalkit.kv.scale_table import Declared, ScaleTable, load_scale_table
from evalkit.kv.scheme import ScaleSource, Scheme
from evalkit.models.info import KVLayout


class BoundScheme:
    def __init__(
        self, scheme: Scheme, layout: KVLayout, config_hash: str | None = None, scale_table: ScaleTable | None = None
    ):
        self.scheme = scheme
        self.layout = layout
        self.fmt = scheme.kv_format
        self.table: ScaleTable | None = None
        if scheme.is_unscaled:  # auto, bf16, fp16: no codes, no scales (the storage casts bf16/fp16)
            return
        codec = codec_for(self.fmt.recipe)
        if codec is not None and codec.rope_aware and not layout.is_mla:  # vLLM's Octave: its slot follows RoPE
            self.fmt = dataclasses.replace(self.fmt, rope_dim=layout.rotary_dim)
            codec.width("k", layout.head_dim, layout.rotary_dim)  # refuses, in one line, what its format refuses
        if layout.is_mla:
            check_mla_scheme(scheme, layout)
        else:
            check_layout(scheme, False, (layout.head_dim, layout.v_head_dim))
            if scheme.rope_bf16:
                raise SchemeError("+rope=bf16 applies to multi-head latent attention models only: drop it")
            check_granularity(scheme.granularity, layout.head_dim)
            check_granularity(scheme.granularity, layout.v_head_dim)
        if (
            isinstance(scheme.skip_layers, tuple)
            and scheme.skip_layers
            and max(scheme.skip_layers) >= layout.num_layers
        ):
            raise SchemeError(
                f"skip={max(scheme.skip_layers)} but the model has layers 0..{layout.num_layers - 1}: fix the layer list"
            )
        if scheme.scales is ScaleSource.STATIC:
            self.table = scale_table or load_scale_table(
                _resolve_static_path(scheme.static_path),
                layout,
                granularity=scheme.granularity.kind.value,
                config_hash=config_hash,
                fmt=scheme.format,
                declared=declared(scheme, with_config=config_hash is not None),
            )
            made_for = self.table.meta.get("format")  # a table handed in by the caller (calibration) is checked here
            if made_for and made_for != scheme.format:
                raise ScaleError(
                    f"static scales in {scheme.static_path} were calibrated for {made_for} (scale = amax / its max), "
                    f"not {scheme.format}: calibrate for {scheme.format} or use {made_for}"
                )
        self._fixed: dict[tuple[str, int, torch.device], torch.Tensor] = {}

    def is_active(self, layer_idx: int) -> bool:
        """Whether this layer's K/V are quantized (not an unscaled 16-bit cache, not a skipped layer)."""
        if self.fmt.is_unscaled:
            return False
        return not self.scheme.skips_layer(layer_idx, self.layout.is_sliding(layer_idx), self.layout.num_layers)

    def fixed_scale(self, which: str, layer_idx: int, device: torch.device) -> torch.Tensor | None:
        """The scale of static and unit sources, (1, 1, 1, 1) or (1, H, 1, 1) on ``device``; None when dynamic."""
        source = self.scheme.scales
        if source is ScaleSource.DYNAMIC:
            return None
        key = (which, layer_idx, torch.device(device))
        if key not in self._fixed:
            if source is ScaleSource.UNIT:
                scale = torch.ones(1, 1, 1, 1)
            else:
                scale = self.table.layer_scale(which, layer_idx)
            self._fixed[key] = scale.to(device=device, dtype=torch.float32)
        return self._fixed[key]


def declared(scheme: Scheme, with_config: bool = True) -> Declared | None:
    """The scheme's word on its static table (``+scales_model=``/``+scales_format=``), with the named
    model's config hash read from its config (``with_config``) so that the table's model is checked."""
    if scheme.scales_model is None:
        return None
    chash = None
    if with_config:
        from evalkit.models.loading import model_config_hash

        chash = model_config_hash(scheme.scales_model)
    return Declared(scheme.scales_model, scheme.scales_format, chash)


def _resolve_static_path(path: str) -> str:
    """A relative scale file is looked up in the current folder, then among evalkit's shipped tables."""
    return str(resolve_calibration_file(path))
