"""TensorRT-LLM, declared as an engine evalkit models but does not run (:mod:`evalkit.engines.registry`).

Its KV cache quantization (``kv_cache_quant_algo``: FP8 with ModelOpt-calibrated per-layer scales, NVFP4
on Blackwell) as the engine profile ``tensorrt-llm`` (:mod:`evalkit.engines.profiles`). Its version
table is not declared: the facts below were stated elsewhere and not read in a release (``verified=False``).

The KV presets of NVIDIA ModelOpt 0.47.0 (``modelopt_recipes/configs/ptq/presets/kv/<name>.yaml``, each
importing ``configs/ptq/units/kv_<name>.yaml``), read in the nvidia-modelopt 0.47.0 wheel, are the profile's
``kv/<name>`` rows: ``kv/fp8`` (an E4M3 ``[kv]_bmm_quantizer`` with a calibrated per-tensor amax, exported as
``k_scale`` = amax / 448: the checkpoint's scales, ``calibrate --import-modelopt``) and ``kv/fp8_cast``
(``use_constant_amax: true``: the amax pinned to E4M3's 448, so the scale is 448 / 448 = 1 and no k/v scale is
exported; ``fp8_e4m3/tensor/unit`` is that recipe exactly, not a scale left at 1.0 by a lost calibration);
the affine, rotated and NVFP4 presets are named with the reason evalkit does not model them exactly.
"""

from __future__ import annotations

from evalkit.engines.attention_paths import Fact
from evalkit.engines.profiles import EngineProfile, KVDtype
from evalkit.engines.registry import Engine, register_engine

TENSORRT_LLM = EngineProfile(
    name="tensorrt-llm",
    description="TensorRT-LLM with an FP8 KV cache (ModelOpt-calibrated scales) or NVFP4 KV on Blackwell",
    kv_cache_dtypes=(
        KVDtype("auto", None),
        KVDtype("fp8", "fp8_e4m3"),
        KVDtype("nvfp4", "fp4_e2m1", named="nvfp4", checkpoint_scales=False),
        KVDtype("kv/fp8", "fp8_e4m3"),  # ModelOpt 0.47 presets (the module docstring)
        KVDtype("kv/fp8_cast", "fp8_e4m3", checkpoint_scales=False),
    ),
    not_modelled=(
        (
            "kv/fp8_affine",
            "ModelOpt's affine FP8 KV (units/kv_fp8_affine.yaml: a static bias over axes -2, -4 subtracted before "
            "the E4M3 cast, exported as k_proj.k_bias / v_proj.v_bias): evalkit's FP8 schemes have no bias",
        ),
        (
            "kv/nvfp4",
            "ModelOpt's NVFP4 KV (numerics/nvfp4.yaml: E2M1, dynamic E4M3 scales per 16) with a calibrated per-tensor "
            "amax exported as k_scale = amax / 448; evalkit's nvfp4 takes its per-tensor scale from each sequence's "
            "first write, and TensorRT-LLM's use of the exported scale is not read",
        ),
        (
            "kv/nvfp4_cast",
            "ModelOpt's NVFP4 KV with use_constant_amax (amax 448, no k/v scale exported); vLLM runs such a checkpoint "
            "as vllm:nvfp4 (k_scale 1.0), but TensorRT-LLM's NVFP4 KV kernel is not read",
        ),
        (
            "kv/nvfp4_affine",
            "ModelOpt's affine NVFP4 KV (units/kv_nvfp4_affine.yaml: a static bias before the cast; "
            "kv_cache_quant_algo NVFP4_AFFINE): not modelled",
        ),
        (
            "kv/nvfp4_rotate",
            "ModelOpt's rotated NVFP4 KV (units/kv_nvfp4_rotate.yaml: K rotated and NVFP4, V NVFP4 not rotated, Q "
            "rotated and not quantized so Q.K is kept; a normalized Hadamard transform, quantization/functional): "
            "evalkit models no rotation for TensorRT-LLM and no calibrated NVFP4 scale",
        ),
    ),
    checkpoint_scale_floor=1.0,
    facts=(
        Fact(
            "FP8 KV with one scale per layer for K and one for V, from ModelOpt calibration (kv_cache_scaling_factor)",
            "NVIDIA/TensorRT-LLM (kv_cache_quant_algo FP8)",
            verified=False,
        ),
        Fact(
            "ModelOpt exports FP8 KV scales of at least 1.0 (torch.max(factor, 1.0): 'For FP8, we recommend "
            "default kv cache scaling factor to be 1'), so amax/448 below 1 becomes 1.0",
            "NVIDIA/TensorRT-Model-Optimizer modelopt/torch/export/quant_utils.py (get_kv_cache_scaling_factor)",
        ),
        Fact(
            "x / scale rounded to nearest even with saturation (CUDA's satfinite FP8 conversion)",
            "not read in TensorRT-LLM's kernels",
            verified=False,
        ),
        Fact(
            "NVFP4 KV (kv_cache_quant_algo NVFP4) on Blackwell: evalkit's nvfp4, whose per-tensor scale comes "
            "from each sequence's first write; where TensorRT-LLM's comes from is not read",
            "NVIDIA/TensorRT-LLM",
            verified=False,
        ),
        Fact(
            "INT8 KV (ModelOpt KV_CACHE_INT8) is not modeled",
            "modelopt/torch/export/quant_utils.py (get_kv_cache_dtype)",
        ),
        Fact(
            "ModelOpt 0.47's KV presets: fp8, fp8_affine, fp8_cast, nvfp4, nvfp4_affine, nvfp4_cast, nvfp4_rotate "
            "(there is no presets/kv/none.yaml; a recipe without KV quantizers, e.g. kv_none in a recipe name, leaves "
            "the cache at the model's dtype: auto)",
            "nvidia-modelopt 0.47.0 modelopt_recipes/configs/ptq/presets/kv/*.yaml, units/kv_*.yaml; modelopt_recipes/ptq.md",
        ),
        Fact(
            "use_constant_amax: 'set the amax to FP8 E4M3 max (448.0) and skip calibration', so kv/fp8_cast's scale "
            "is 1 by recipe; it registers no _amax buffer, so the export writes no k_scale/v_scale",
            "nvidia-modelopt 0.47.0 modelopt/torch/quantization/config.py:665-672; "
            "nn/modules/tensor_quantizer.py:736-739 (_get_amax)",
        ),
        Fact(
            "the Hugging Face export writes k_proj.k_scale / v_proj.v_scale = amax / 448 'for both FP8 and NVFP4' "
            "(unclamped; the floor of 1.0 is the TensorRT-LLM export's get_kv_cache_scaling_factor)",
            "nvidia-modelopt 0.47.0 modelopt/torch/export/unified_export_hf.py:1015-1017; "
            "export/quant_utils.py (postprocess_state_dict, _KV_CACHE_REPLACEMENTS)",
        ),
    ),
)

ENGINE = register_engine(
    Engine(
        name="tensorrt_llm",
        package="tensorrt_llm",
        install="evalkit models TensorRT-LLM's KV cache; it does not run TensorRT-LLM",
        description="TensorRT-LLM (modelled, not run): FP8 KV with ModelOpt scales, NVFP4 KV on Blackwell",
        devices=("cuda",),
        profiles=(TENSORRT_LLM,),
        order=20,
        aliases=("tensorrt-llm",),
    )
)
