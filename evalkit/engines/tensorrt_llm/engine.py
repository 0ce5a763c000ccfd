"""TensorRT-LLM, declared as an engine evalkit models but does not run (:mod:`evalkit.engines.registry`).

Its KV cache quantization (``kv_cache_quant_algo``: FP8 with ModelOpt-calibrated per-layer scales, NVFP4
on Blackwell) as the engine profile ``tensorrt-llm`` (:mod:`evalkit.engines.profiles`). Its version
table is not declared: the facts below were stated elsewhere and not read in a release (``verified=False``).
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
