"""A checkpoint's K/V scales as an engine uses them: read for the engine's checkpoint convention, then changed
the way the engine changes them.

An engine profile (:class:`evalkit.engines.profiles.EngineProfile`) that takes ``k_scale``/``v_scale`` from a
checkpoint reads a scale table calibrated for the format the checkpoint convention names (OCP E4M3 for an
engine that stores E4M3-fnuz: the engine converts them). :func:`load_checkpoint_scales` reads that table and
refuses, in one line, one calibrated for another format or holding per-head scales the engine cannot take.

Checkpoint scales that the engine changes (vLLM on ROCm doubles them on fnuz platforms; ModelOpt exports FP8
KV scales of at least 1.0) are written by :func:`with_engine_scales` as a derived table next to nothing
shipped: under ``out_dir`` (default :data:`DEFAULT_SCALES_DIR` in the current folder) as
``<table>.<profile>.safetensors``, with the source and the transform in its sidecar. Its path is what the
scheme names, so the run id names it and holds its content (:mod:`evalkit.sweep.run_inputs`); an identical
table already there is left as it is.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from evalkit.errors import SchemeError
from evalkit.kv.scheme import Scheme

DEFAULT_SCALES_DIR = "engine-scales"


def load_checkpoint_scales(profile, path: str, source_format: str, declared=None):
    """The scale table at ``path`` as ``profile``'s engine reads it (checkpoint convention: calibrated for
    ``source_format``); a table without a sidecar needs ``declared`` (:class:`evalkit.kv.scale_table.Declared`).
    SchemeError (one line) for a table made for another format, or per-head scales the engine keeps per layer."""
    from evalkit.data.resources import resolve_calibration_file
    from evalkit.kv.scale_table import load_scale_table

    table = load_scale_table(resolve_calibration_file(path), declared=declared)
    made_for = table.meta.get("format")
    if made_for and made_for != source_format:
        raise SchemeError(
            f"the scales in {path} were calibrated for {made_for}, not {source_format} "
            f"(the checkpoint convention {profile.name} expects): use an {source_format} table"
        )
    if table.granularity == "head" and not profile.head_scales:
        raise SchemeError(
            f"{profile.name} keeps one scale per layer for K and one for V; {path} holds per-head "
            "scales: use a per-tensor table (calibrate with --granularity tensor)"
        )
    return table


def with_engine_scales(profile, scheme: Scheme, table, source_format: str, out_dir: str | Path | None) -> Scheme:
    """``scheme`` naming the scales ``profile``'s engine actually uses: the table as it is, or a derived table
    (loaded scales times ``checkpoint_scale_factor``, at least ``checkpoint_scale_floor``, for the engine's
    storage format) written under ``out_dir``."""
    from evalkit.kv.scale_table import ScaleTable, load_scale_table, save_scale_table

    factor, floor = profile.checkpoint_scale_factor, profile.checkpoint_scale_floor
    if factor == 1.0 and floor <= 0.0 and scheme.format == source_format:
        return scheme
    path = scheme.static_path
    k = (table.k_scale * factor).clamp(min=floor)
    v = (table.v_scale * factor).clamp(min=floor)
    transform = [f"x{factor:g}"] if factor != 1.0 else []
    transform += [f"at least {floor:g}"] if floor > 0 else []
    meta = {
        **table.meta,
        "format": scheme.format,
        "derived_from": str(path),
        "engine_profile": profile.name,
        "engine_transform": ", then ".join(transform) or "none",
    }
    out = Path(out_dir if out_dir is not None else DEFAULT_SCALES_DIR) / f"{Path(path).stem}.{profile.name}.safetensors"
    derived = ScaleTable(k, v, meta)
    if not out.is_file() or not _same_table(load_scale_table(out, declared=declared_of(scheme)), derived):
        save_scale_table(out, derived)
    return dataclasses.replace(scheme, static_path=str(out))


def declared_of(scheme: Scheme):
    """The scheme's ``+scales_model=``/``+scales_format=`` as a declaration (no model is loaded here,
    so the model is compared when the run binds the scheme); None without them."""
    if scheme.scales_model is None:
        return None
    from evalkit.kv.scale_table import Declared

    return Declared(scheme.scales_model, scheme.scales_format)


def _same_table(a, b) -> bool:
    import torch

    return a.meta == b.meta and torch.equal(a.k_scale, b.k_scale) and torch.equal(a.v_scale, b.v_scale)
