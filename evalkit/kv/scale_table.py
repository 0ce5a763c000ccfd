"""Static (calibrated) scale tables: the file format and its strict validation.

A table is a safetensors file with float32 tensors ``k_scale`` and ``v_scale`` shaped
(num_layers,) for per-tensor scales or (num_layers, num_kv_heads) for per-head scales, plus a
JSON sidecar (``<file>.json``) with provenance: model id, config hash, layer and head counts,
granularity, method, corpus and its hash, evalkit version. Scales multiply codes to give values
(the vLLM convention). A scale of 0, a negative or non-finite scale, a missing K or V entry, a
shape that disagrees with the model, or another model's config hash is an error: a missing
scale never becomes 1.0 quietly. safetensors loads without pickle.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from evalkit.errors import ScaleError


@dataclass(frozen=True)
class ScaleTable:
    k_scale: torch.Tensor  # (L,) or (L, H) float32
    v_scale: torch.Tensor
    meta: dict = field(default_factory=dict)

    @property
    def granularity(self) -> str:
        return "tensor" if self.k_scale.dim() == 1 else "head"

    def layer_scale(self, which: str, layer_idx: int) -> torch.Tensor:
        """Scale for one layer shaped to broadcast over (B, H, S, D)."""
        s = (self.k_scale if which == "k" else self.v_scale)[layer_idx]
        return s.reshape(1, -1, 1, 1) if s.dim() == 1 else s.reshape(1, 1, 1, 1)


def sidecar_path(path: str | Path) -> Path:
    return Path(str(path) + ".json")


def save_scale_table(path: str | Path, table: ScaleTable) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"k_scale": table.k_scale.float().contiguous(), "v_scale": table.v_scale.float().contiguous()}, str(path))
    sidecar_path(path).write_text(json.dumps(table.meta, indent=2, sort_keys=True) + "\n")


def load_scale_table(
    path: str | Path, layout=None, granularity: str | None = None, config_hash: str | None = None
) -> ScaleTable:
    """Read and validate a table; ``layout`` is anything with ``num_layers`` and ``num_kv_heads``."""
    path = Path(path)
    if not path.is_file():
        raise ScaleError(
            f"static scale file {path} does not exist: make one with `python -m evalkit calibrate` or import one"
        )
    try:
        tensors = load_file(str(path))
    except Exception as exc:  # safetensors raises several types for a bad header
        raise ScaleError(f"static scale file {path} is not a readable safetensors file ({exc})") from None
    missing = [name for name in ("k_scale", "v_scale") if name not in tensors]
    if missing:
        raise ScaleError(f"static scale file {path} has no {' or '.join(missing)} entry: recalibrate or re-export it")
    meta = {}
    if sidecar_path(path).is_file():
        meta = json.loads(sidecar_path(path).read_text())
    table = ScaleTable(tensors["k_scale"].float(), tensors["v_scale"].float(), meta)
    if table.k_scale.shape != table.v_scale.shape:
        raise ScaleError(
            f"static scale file {path}: k_scale {tuple(table.k_scale.shape)} and v_scale {tuple(table.v_scale.shape)} differ in shape"
        )
    for name, t in (("k_scale", table.k_scale), ("v_scale", table.v_scale)):
        if not bool(torch.isfinite(t).all()) or not bool((t > 0).all()):
            raise ScaleError(f"static scale file {path}: {name} holds zero, negative or non-finite scales: recalibrate")
    if granularity is not None and table.granularity != granularity:
        raise ScaleError(
            f"static scale file {path} holds {table.granularity} scales but the scheme asks for {granularity}: use a {granularity} calibration"
        )
    if layout is not None:
        expected = (layout.num_layers,) if table.granularity == "tensor" else (layout.num_layers, layout.num_kv_heads)
        if tuple(table.k_scale.shape) != expected:
            raise ScaleError(
                f"static scale file {path} has shape {tuple(table.k_scale.shape)} but this model needs {expected} "
                f"({layout.num_layers} layers, {layout.num_kv_heads} KV heads): it was made for another model"
            )
    if config_hash is not None and meta.get("config_hash") not in (None, config_hash):
        raise ScaleError(
            f"static scale file {path} was calibrated on model {meta.get('model', '?')} (config {meta.get('config_hash')}), "
            f"not this one (config {config_hash}): calibrate this model"
        )
    return table
