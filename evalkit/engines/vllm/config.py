"""What vLLM is started with for an evalkit scheme, per device: the engine profile, ``kv_cache_dtype``, scales.

The engine profile follows the device vLLM runs on (:data:`PROFILES`): ``vllm-cpu`` on the CPU (FP8 E4M3
or E5M2, one scale per layer, ``x * float32(1 / scale)`` rounded toward zero) and ``vllm-cuda`` on CUDA
(the same per-tensor FP8 dtypes rounded to nearest even, plus vLLM's own ``vllm:<kv_cache_dtype>``
schemes, :mod:`evalkit.kv.codecs.vllm`, which model CUDA vLLM's store kernels as they are).
:func:`engine_config` maps a scheme through its device's profile (:mod:`evalkit.engines.profiles`) into
an :class:`EngineConfig` and refuses, in one line, what that engine cannot run:

- a rounding that is neither evalkit's default (nearest even) nor the engine's own;
- an attention precision (``+attn=fa3``): the engine runs the attention path vLLM selects on the
  device, recorded in each row as ``attention_backend`` (and, on FlashAttention, its version and
  whether Q is quantized); ``+attn=fa3`` is the emulation's model of that path, not a setting of vLLM;
- anything the profile's check refuses (head or block scales, dynamic scales, other formats).

Static scales (``fp8_e4m3/tensor/static+scales=...``) reach vLLM as a checkpoint
(:func:`static_checkpoint`): the model's files linked, plus the scales in the compressed-tensors form
vLLM reads (:func:`evalkit.scales.vllm_io.export_vllm`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalkit.errors import EvalkitError

PROFILE = "vllm-cpu"  # the CPU engine's (the default where no device is given)
PROFILES = {"cpu": "vllm-cpu", "cuda": "vllm-cuda"}
_KV_CACHE_DTYPE = {"fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
_WORDS = {"rtz": "toward zero (rtz)", "rne": "to nearest even (rne)"}


def profile_for(device: str) -> str:
    """The engine profile of vLLM on ``device`` (``cpu``, ``cuda``, ``cuda:N``)."""
    kind = str(device).split(":")[0]
    try:
        return PROFILES[kind]
    except KeyError:
        raise EvalkitError(
            f"engine vllm runs on cpu (vllm-cpu) or cuda (vllm), not {device}: use --device cpu or --device cuda"
        ) from None


@dataclass(frozen=True)
class EngineConfig:
    """What vLLM is started with for one evalkit scheme, and the scheme that emulates it."""

    kv_cache_dtype: str  # auto | fp8_e4m3 | fp8_e5m2 | (on CUDA) another of vLLM's kv_cache_dtypes
    scales: str | None = None  # evalkit scale table (tensor granularity) for a static checkpoint
    skip_layers: tuple[str, ...] = ()  # vLLM's kv_cache_dtype_skip_layers (indices, or sliding_window)
    emulation: str = "auto"  # the scheme evalkit runs for the same cache (the device's profile applied)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kv_cache_dtype": self.kv_cache_dtype,
            "engine_scales": self.scales,
            "engine_skip_layers": list(self.skip_layers),
            "engine_scheme": self.emulation,
        }


def _skip(skip) -> tuple[str, ...]:
    return ("sliding_window",) if skip == "sliding" else tuple(str(i) for i in skip)


def engine_config(scheme, profile: str = PROFILE) -> EngineConfig:
    """The configuration that runs ``scheme`` (a Scheme or its string) on the engine of ``profile``
    (``vllm-cpu`` or ``vllm-cuda``; see the module docstring for what is refused)."""
    from evalkit.engines.registry import get_profile
    from evalkit.kv.formats import Rounding
    from evalkit.kv.scheme import AttentionPrecision, parse_scheme

    scheme = parse_scheme(scheme) if isinstance(scheme, str) else scheme
    if scheme.is_unscaled:  # auto, or vLLM's 16-bit cache dtypes
        dtype = {"auto": "auto", "bf16": "bfloat16", "fp16": "float16"}[scheme.format]
        return EngineConfig(dtype, emulation=str(scheme))
    if scheme.attention is not AttentionPrecision.KV:
        raise EvalkitError(
            f"{profile} cannot be told to run {scheme}: the engine runs the attention path vLLM selects on its "
            f"device (each row records it as attention_backend); +attn={scheme.attention.value} is the emulation's "
            f"model of a path: drop +attn={scheme.attention.value} for --engine vllm"
        )
    text = str(scheme)
    if profile != PROFILE and text.startswith("vllm:"):  # vLLM's own dtypes: CUDA vLLM's stores, modelled as they are
        return EngineConfig(text.split("+")[0].removeprefix("vllm:"), None, _skip(scheme.skip_layers), text)
    prof = get_profile(profile)
    own = {d.format: d.rounding for d in prof.kv_cache_dtypes if d.format and not d.named}.get(scheme.format)
    if own is not None and scheme.rounding not in (Rounding.RNE, own):
        raise EvalkitError(
            f"{profile} cannot run {scheme}: its cache rounds {_WORDS.get(own.value, own.value)}, not "
            f"{scheme.rounding.value}; drop +rounding={scheme.rounding.value}"
        )
    applied = prof.apply(scheme)
    dtype = _KV_CACHE_DTYPE.get(applied.format)
    if dtype is None:  # pragma: no cover - the profiles store these formats only
        raise EvalkitError(f"{profile} cannot run {scheme}: no kv_cache_dtype stores {applied.format}")
    return EngineConfig(dtype, applied.static_path, _skip(applied.skip_layers), str(applied))


def static_checkpoint(model_dir: str | Path, table, out: str | Path) -> Path:
    """Write ``out`` as a vLLM checkpoint of ``model_dir`` with ``table``'s static KV scales: the
    model's files linked (a sharded index copied, so the scales can join it), config.json and the
    scale tensors from :func:`evalkit.scales.vllm_io.export_vllm`."""
    from evalkit.scales.vllm_io import export_vllm

    src, out = Path(model_dir), Path(out)
    if table.granularity != "tensor":
        raise EvalkitError(
            f"vLLM's cache takes one scale per layer here (tensor), this table is {table.granularity}: "
            "calibrate with --granularity tensor"
        )
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name == "config.json" or f.name.startswith(".") or not f.is_file():
            continue
        if f.name.endswith(".index.json"):
            shutil.copyfile(f, out / f.name)
        else:
            (out / f.name).symlink_to(f.resolve())
    config = json.loads((src / "config.json").read_text())
    export_vllm(table, out, config, force=True)
    return out
