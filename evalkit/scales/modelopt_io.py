"""Static KV scales from a checkpoint NVIDIA ModelOpt exported (``calibrate --import-modelopt DIR``).

What ModelOpt 0.47.0's Hugging Face export writes (read in the nvidia-modelopt 0.47.0 wheel):

- ``hf_quant_config.json``: ``{"producer": {"name": "modelopt", ...}, "quantization": {"quant_algo": ...,
  "kv_cache_quant_algo": "FP8" | "NVFP4" | "NVFP4_AFFINE" | null}}`` (``modelopt/torch/export/
  unified_export_hf.py`` ``_write_hf_export_config``; the values ``model_config.py:47-50``), and the same in
  ``config.json`` as ``quantization_config`` with ``quant_method: modelopt`` and, for FP8, ``kv_cache_scheme:
  {"dynamic": false, "num_bits": 8, "type": "float"}`` (``convert_hf_config.py:268-280``); older exports
  carry ``kv_cache_quant_algo`` there directly.
- Tensors ``<attention>.k_proj.k_scale`` and ``<attention>.v_proj.v_scale`` from each attention module's
  ``k_bmm_quantizer._amax`` / ``v_bmm_quantizer._amax`` (``quant_utils.py`` ``_KV_CACHE_REPLACEMENTS``),
  divided by 448 "for both FP8 and NVFP4" (``unified_export_hf.py``: ``kv_cache_max_bound = 448``;
  ``quant_utils.py`` ``postprocess_state_dict``: ``value.float() / maxbound``), not clamped (the floor of 1.0
  is TensorRT-LLM's export path, ``get_kv_cache_scaling_factor``); affine presets add ``k_proj.k_bias`` /
  ``v_proj.v_bias``.
- The ``*_cast`` presets (``use_constant_amax: true``) pin the amax to 448 without registering an ``_amax``
  buffer (``tensor_quantizer.py`` ``_get_amax``), so they export no k/v scale at all: the engine's scale 1.0
  is the recipe (448 / 448), not a lost calibration. Importing such a checkpoint is refused in one line that
  names the scheme which is that recipe (``fp8_e4m3/tensor/unit``); a scale table of ones made up here
  would look like a calibration.

An FP8 checkpoint with scales becomes the same per-tensor scale table ``--import-vllm`` makes
(:func:`evalkit.scales.vllm_io.checked_table`); NVFP4 scales (the per-tensor second-level scale of a
4-bit cache) and affine (biased) caches are not tables evalkit's static schemes read: refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

from evalkit.errors import EvalkitError
from evalkit.kv.scale_table import ScaleTable
from evalkit.scales.vllm_io import checked_table, checkpoint_config, read_checkpoint_scales

QUANT_CONFIG = "hf_quant_config.json"


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EvalkitError(f"{path} is not JSON ({exc}): re-export the checkpoint") from None
    if not isinstance(data, dict):
        raise EvalkitError(f"{path} holds a JSON {type(data).__name__}, not an object: re-export the checkpoint")
    return data


def kv_cache_algo(folder: Path, raw: dict) -> str | None:
    """ModelOpt's ``kv_cache_quant_algo`` of an exported folder (hf_quant_config.json, else config.json)."""
    if (folder / QUANT_CONFIG).is_file():
        quant = _read_json(folder / QUANT_CONFIG).get("quantization") or {}
        if "kv_cache_quant_algo" in quant:
            return quant["kv_cache_quant_algo"]
    qcfg = raw.get("quantization_config") or {}
    if qcfg.get("kv_cache_quant_algo") is not None:
        return qcfg["kv_cache_quant_algo"]
    if qcfg.get("quant_method") == "modelopt" and qcfg.get("kv_cache_scheme") is not None:
        scheme = qcfg["kv_cache_scheme"]
        if isinstance(scheme, dict):
            return "FP8" if scheme.get("type") == "float" and scheme.get("num_bits") == 8 else str(scheme)
        return str(scheme)
    return None


def _has_bias(folder: Path) -> bool:
    from safetensors import safe_open

    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            if any(name.endswith((".k_bias", ".v_bias")) for name in fh.keys()):
                return True
    return False


def import_modelopt(folder: str | Path) -> ScaleTable:
    """The FP8 KV scale table of a ModelOpt-exported checkpoint folder (see the module docstring)."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise EvalkitError(
            f"{folder} is not a checkpoint folder (no config.json): give the folder ModelOpt exported "
            "(config.json, hf_quant_config.json and *.safetensors)"
        )
    raw = _read_json(folder / "config.json")
    algo = kv_cache_algo(folder, raw)
    if algo is None:
        raise EvalkitError(
            f"{folder}: neither {QUANT_CONFIG} nor config.json names a kv_cache_quant_algo, so ModelOpt left the KV "
            "cache unquantized: evaluate auto, or export with a KV preset (kv/fp8)"
        )
    if algo != "FP8":
        raise EvalkitError(
            f"{folder}: kv_cache_quant_algo {algo}: its k_scale/v_scale are a 4-bit cache's per-tensor second-level "
            "scales (amax / 448), not a scale table evalkit's static schemes read: evaluate nvfp4, or export with kv/fp8"
        )
    if _has_bias(folder):
        raise EvalkitError(
            f"{folder}: the checkpoint carries k_bias/v_bias (ModelOpt's kv/fp8_affine preset), an affine FP8 cache "
            "evalkit does not model: export with kv/fp8 (or kv/fp8_cast)"
        )
    config, layout = checkpoint_config(folder)
    found = read_checkpoint_scales(folder)
    if not found:
        raise EvalkitError(
            f"{folder}: an FP8 KV checkpoint without k_scale/v_scale tensors: ModelOpt's kv/fp8_cast preset "
            "(use_constant_amax) exports none, and its engines use scale 1.0 by that recipe: evaluate "
            "fp8_e4m3/tensor/unit (the tensorrt-llm profile's kv/fp8_cast), or export with kv/fp8 for calibrated scales"
        )
    table = checked_table(folder, raw, config, layout, found, "the engine")
    table.meta["kv_cache_quant_algo"] = algo
    table.meta["producer"] = (
        _read_json(folder / QUANT_CONFIG).get("producer") if (folder / QUANT_CONFIG).is_file() else None
    )
    return table
