"""Static (calibrated) scale tables: the file format and its strict validation.

A table is a safetensors file with float32 tensors ``k_scale`` and ``v_scale`` shaped
(num_layers,) for per-tensor scales or (num_layers, num_kv_heads) for per-head scales, plus a
JSON sidecar (``<file>.json``) with provenance: model id, config hash, layer and head counts,
granularity, method, corpus and its hash, evalkit version. Scales multiply codes to give values
(the vLLM convention). A scale of 0, a negative or non-finite scale, a missing K or V entry, a
shape that disagrees with the model, or another model's config hash is an error: a missing
scale never becomes 1.0 quietly. safetensors loads without pickle.

A table must know what it is for: the model (its config hash) and the format its scales were
calibrated for (scale = amax / that format's max, so an E4M3 table under E5M2 is 128x off). Its
sidecar says so; a table without one (a bare ``.safetensors``, or a sidecar that names neither) is
refused on every load unless the user names both explicitly (:class:`Declared`: the scheme options
``+scales_model=MODEL+scales_format=FORMAT``, from ``--scales-model``/``--scales-format``). Shape,
format and model are then checked on every load, the declared values standing in for the sidecar's
(and refused where they contradict it).
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


@dataclass(frozen=True)
class Declared:
    """What the user says a table was made for, in place of its sidecar: the model as ``--model``
    names it, the format its scales were calibrated for, and that model's config hash where the
    caller could read it (None: the model is not compared, e.g. where no model is loaded)."""

    model: str
    format: str
    config_hash: str | None = None


def sidecar_path(path: str | Path) -> Path:
    return Path(str(path) + ".json")


def save_scale_table(path: str | Path, table: ScaleTable) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"k_scale": table.k_scale.float().contiguous(), "v_scale": table.v_scale.float().contiguous()}, str(path))
    sidecar_path(path).write_text(json.dumps(table.meta, indent=2, sort_keys=True) + "\n")


def load_scale_table(
    path: str | Path,
    layout=None,
    granularity: str | None = None,
    config_hash: str | None = None,
    *,
    fmt: str | None = None,
    declared: Declared | None = None,
) -> ScaleTable:
    """Read and validate a table; ``layout`` is anything with ``num_layers`` and ``num_kv_heads``;
    ``fmt``: the scheme's format, which the table must have been calibrated for; ``config_hash``: the
    model's, which the table must have been made for; ``declared``: the user's word on a table
    without a sidecar (module docstring). ScaleError (one line) otherwise."""
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
    meta = read_sidecar(path)
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
    meta = provenance(path, meta, declared)
    table = ScaleTable(table.k_scale, table.v_scale, meta)
    if fmt is not None and meta["format"] != fmt:
        raise ScaleError(
            f"static scales in {path} were calibrated for {meta['format']} (scale = amax / its max), "
            f"not {fmt}: calibrate for {fmt} or use {meta['format']}"
        )
    if config_hash is not None and meta.get("config_hash") != config_hash:
        raise ScaleError(
            f"static scale file {path} was calibrated on model {meta.get('model', '?')} (config {meta.get('config_hash')}), "
            f"not this one (config {config_hash}): calibrate this model"
        )
    return table


def read_sidecar(path: str | Path) -> dict:
    """The table's sidecar as a dict; {} when there is none; ScaleError when it is not a JSON object."""
    sidecar = sidecar_path(path)
    if not sidecar.is_file():
        return {}
    try:
        meta = json.loads(sidecar.read_text())
    except (OSError, ValueError) as exc:
        raise ScaleError(f"the sidecar {sidecar} of static scale file {path} is not readable JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise ScaleError(f"the sidecar {sidecar} of static scale file {path} is not a JSON object: re-make the table")
    return meta


def provenance(path: str | Path, meta: dict, declared: Declared | None) -> dict:
    """``meta`` (the sidecar's) naming the table's model and format: the sidecar's own, else the user's
    declaration; ScaleError (one line, with the fix) when neither names them or the two disagree."""
    named = bool(meta.get("format")) and bool(meta.get("config_hash"))
    if declared is None:
        if named:
            return meta
        side = sidecar_path(path).name
        what = (
            f"no sidecar {side}"
            if not sidecar_path(path).is_file()
            else f"its sidecar {side} names no format or config hash"
        )
        raise ScaleError(
            f"static scale file {path} does not say which model and format it was made for ({what}): "
            "re-make it with `python -m evalkit calibrate`, or name them with "
            "+scales_model=MODEL+scales_format=FORMAT (--scales-model MODEL --scales-format FORMAT)"
        )
    if meta.get("format") and meta["format"] != declared.format:
        raise ScaleError(
            f"static scale file {path}: its sidecar says format {meta['format']}, not the declared {declared.format}: "
            "drop --scales-format (+scales_format=) or fix it"
        )
    if declared.config_hash and meta.get("config_hash") and meta["config_hash"] != declared.config_hash:
        raise ScaleError(
            f"static scale file {path}: its sidecar says model {meta.get('model', '?')} (config {meta['config_hash']}), "
            f"not the declared {declared.model} (config {declared.config_hash}): drop --scales-model (+scales_model=) or fix it"
        )
    return {
        **meta,
        "format": meta.get("format") or declared.format,
        "config_hash": meta.get("config_hash") or declared.config_hash,
        "model": meta.get("model") or declared.model,
        "declared": {"model": declared.model, "format": declared.format},
    }
