"""vLLM's engine profiles, declared in vLLM's folder: its CPU backend (``vllm-cpu``), CUDA (``vllm-cuda``)
and ROCm on MI300 (``vllm-rocm``), each read in vLLM's source (:mod:`evalkit.engines.profiles` says what a
profile is). :mod:`evalkit.engines.vllm.engine` declares them with the engine; ``--engine-profile NAME``
and the report's "runs on" column find them through the engine registry.
"""

from __future__ import annotations

from evalkit.engines.attention_paths import VLLM_CUDA_PATHS, Fact
from evalkit.engines.profiles import EngineProfile, KVDtype
from evalkit.engines.vllm.declared import OCTAVE_NAMES
from evalkit.kv.formats import Recipe, Rounding
from evalkit.kv.scheme import AttentionPrecision

_VLLM_KV_CACHE = "vllm/model_executor/layers/quantization/kv_cache.py (BaseKVCacheMethod.process_weights_after_loading)"
_VLLM_NO_ESTIMATE = Fact(
    "no runtime scale estimate: calculate_kv_scales was deprecated and removed, so scales come from the checkpoint "
    "or are 1.0 (evalkit's dynamic scales have no vLLM counterpart)",
    "vllm-project/vllm PR #37201 (deprecation) and PR #49389 (removal)",
)
_VLLM_SKIP = Fact(
    "kv_cache_dtype_skip_layers keeps layers unquantized, by index or 'sliding_window' (evalkit's +skip=0,5 / +skip=sliding)",
    "vllm/config/cache.py (CacheConfig.kv_cache_dtype_skip_layers)",
)
_VLLM_PER_TENSOR = Fact(
    "one float scale per layer for K and one for V: 'Only support per-tensor scaling factor for fp8 KV cache'; "
    "k_scale/v_scale from the checkpoint (compressed-tensors kv_cache_scheme, ModelOpt), else 1.0 with a warning",
    _VLLM_KV_CACHE,
)
_VLLM_E5M2 = Fact(
    "fp8_e5m2 refuses quantized checkpoints ('fp8_e5m2 kv-cache is not supported with fp8 checkpoints'), so E5M2 "
    "always runs with scale 1.0",
    "vllm/model_executor/layers/attention/attention.py (_init_kv_cache_quant)",
)

VLLM_CPU = EngineProfile(
    name="vllm-cpu",
    description="vLLM's CPU backend (CPU_ATTN) with an FP8 KV cache (vllm-cpu 0.32.0)",
    kv_cache_dtypes=(
        KVDtype("auto", None),
        KVDtype("fp8", "fp8_e4m3", Rounding.RTZ, recipe=Recipe.VLLM_CPU),
        KVDtype("fp8_e4m3", "fp8_e4m3", Rounding.RTZ, recipe=Recipe.VLLM_CPU),
        KVDtype("fp8_e5m2", "fp8_e5m2", Rounding.RTZ, checkpoint_scales=False, recipe=Recipe.VLLM_CPU),
    ),
    skip_layers=True,
    head_dim_multiple=32,
    requirements=(
        "x86 with AVX-512 or AMX",
        "head_dim divisible by 32",
        "block size a multiple of 32 (AMX path)",
    ),
    facts=(
        Fact(
            "kv_cache_dtype auto, fp8, fp8_e4m3, fp8_e5m2 (FP8 KV on CPU since PR #39445)",
            "vllm/v1/attention/backends/cpu_attn.py (CPUAttentionBackend.supported_kv_cache_dtypes); "
            "vllm-project/vllm PR #39445",
        ),
        _VLLM_PER_TENSOR,
        _VLLM_NO_ESTIMATE,
        _VLLM_E5M2,
        Fact(
            "x / scale is rounded toward zero, then saturated at ±max: the store clamps to ±448 (±57344) and keeps "
            "the leading mantissa bits; every one of 73,728 codes written by torch.ops._C.cpu_attn_reshape_and_cache "
            "equalled a round-toward-zero cast (36-48 % differ from nearest even)",
            "csrc/cpu/cpu_attn_fp8.hpp (float_to_fp8e4m3_scalar, float_to_fp8e5m2_scalar); measured on "
            "vllm-cpu 0.32.0 (evalkit issue 22)",
        ),
        Fact(
            "the store multiplies by the reciprocal scale (v *= inv_scale, inv_scale = float32(1 / scale)), where "
            "evalkit's plain schemes divide: with a static scale x * (1/s) can differ from x / s in the last float32 "
            "bit, which moves a toward-zero code; modeled by +recipe=vllm_cpu, which the profile maps every scheme to "
            "(the kernel table: 100 % of edge and random codes with it, 99.44-99.99 % of edge codes without)",
            "csrc/cpu/cpu_attn_fp8.hpp (float_to_fp8e4m3_scalar(v, inv_scale)); measured on vllm-cpu 0.32.0 "
            "(python -m evalkit conformance --engine vllm --kernel-only)",
        ),
        Fact(
            "a ±0 input is stored as code 0 (if (v == 0.0f) return 0): -0.0 becomes +0 (modeled by "
            "+recipe=vllm_cpu; plain schemes keep -0: equal values, one differing byte)",
            "csrc/cpu/cpu_attn_fp8.hpp (float_to_fp8e4m3_scalar)",
        ),
        Fact(
            "E4M3 below its smallest normal: the scalar store multiplies by 2**-120 before truncating the bits, so "
            "the product is a float32 subnormal that the FPU rounds first (modeled by +recipe=vllm_cpu; every "
            "edge code equal on this machine's vector path)",
            "csrc/cpu/cpu_attn_fp8.hpp (float_to_fp8e4m3_scalar)",
        ),
        Fact(
            "FP8 KV needs x86 AVX-512 or AMX ('FP8 KV cache on CPU requires x86 with AVX-512 or AMX') and "
            "head_size divisible by 32 ('FP8 KV cache requires head_size divisible by 32 on CPU')",
            "vllm/v1/attention/backends/cpu_attn.py (_get_attn_isa)",
        ),
        Fact(
            "the AMX FP8 store needs a block size divisible by 32 (paging only: per-tensor scales do not see blocks)",
            "csrc/cpu/cpu_attn_fp8.hpp (reshape_and_cache_fp8_amx_impl)",
        ),
        Fact(
            "prefill attends from the cache: forward writes K/V with cpu_attn_reshape_and_cache, then "
            "cpu_attention_with_kv_cache reads every token from it, as evalkit's storage cache does",
            "vllm/v1/attention/backends/cpu_attn.py (CPUAttentionBackendImpl.forward)",
        ),
        _VLLM_SKIP,
    ),
)

VLLM_CUDA = EngineProfile(
    name="vllm-cuda",
    description="vLLM on NVIDIA GPUs (FlashAttention, FlashInfer, FlashAttention-3 backends) with an FP8 KV cache",
    kv_cache_dtypes=(
        KVDtype("auto", None),
        KVDtype("fp8", "fp8_e4m3"),
        KVDtype("fp8_e4m3", "fp8_e4m3"),
        KVDtype("fp8_e5m2", "fp8_e5m2", checkpoint_scales=False),
    ),
    head_scales=AttentionPrecision.FA3.value,
    attention=(AttentionPrecision.KV, AttentionPrecision.FA3),
    skip_layers=True,
    attention_paths=VLLM_CUDA_PATHS,
    default_gpu="hopper",
    facts=(
        Fact(
            "kv_cache_dtype auto, fp8 (E4M3 on CUDA), fp8_e4m3, fp8_e5m2; the newer int8/fp8_per_token_head, "
            "nvfp4 and TurboQuant dtypes are not modeled",
            "vllm/config/cache.py (CacheConfig.cache_dtype)",
        ),
        Fact(
            "x / scale is rounded to nearest even with saturation: __nv_cvt_float_to_fp8(x / scale, "
            "__NV_SATFINITE, ...) in the cache store",
            "csrc/quantization/fp8/nvidia/quant_utils.cuh (scaled_vec_conversion), csrc/cache_kernels.cu "
            "(reshape_and_cache_flash); as evalkit issue 22 states",
            verified=False,
        ),
        _VLLM_PER_TENSOR,
        _VLLM_NO_ESTIMATE,
        _VLLM_E5M2,
        Fact(
            "per-attention-head (attn_head) scales only with the FlashAttention backend (FA3), from "
            "llm-compressor calibration; its FP8 path also quantizes Q and P, evalkit's +attn=fa3 (the "
            "attention paths below say which GPU runs which kernel)",
            "docs/features/quantization/quantized_kvcache.md; vllm/v1/attention/backends/flash_attn.py "
            "(FlashAttentionBackend.supports_per_head_quant_scales)",
        ),
        Fact(
            "NVFP4 KV takes its per-tensor global scale from the checkpoint's k_scale/v_scale; evalkit's nvfp4 "
            "takes it from each sequence's first write, so it is not offered here",
            "vllm-project/vllm PRs #37332 and #40177 (csrc/.../nvfp4_kv_cache_kernels.cu)",
        ),
        _VLLM_SKIP,
    ),
)

VLLM_ROCM = EngineProfile(
    name="vllm-rocm",
    description="vLLM on AMD MI300 (gfx942): FP8 KV stored as E4M3-fnuz (max 240); from 0.33 the Octave caches",
    kv_cache_dtypes=(
        KVDtype("auto", None),
        KVDtype("fp8", "fp8_e4m3fnuz"),
        KVDtype("fp8_e4m3", "fp8_e4m3fnuz"),
        *(KVDtype(n, "int4", named=f"vllm:{n}", checkpoint_scales=False) for n in OCTAVE_NAMES),
    ),
    skip_layers=True,
    format_map=(("fp8_e4m3", "fp8_e4m3fnuz"),),
    checkpoint_scale_factor=2.0,
    facts=(
        Fact(
            "gfx94x (MI300) is an fnuz platform: fp8_dtype() is torch.float8_e4m3fnuz (MI350, gfx950, is OCP "
            "E4M3: use vllm-cuda's numerics)",
            "vllm/platforms/rocm.py (is_fp8_fnuz, fp8_dtype)",
        ),
        Fact(
            "checkpoint k_scale/v_scale are multiplied by 2 on fnuz platforms (OCP-calibrated amax/448 becomes "
            "amax/224, inside fnuz's 240); the 1.0 used without scales is not doubled",
            _VLLM_KV_CACHE,
        ),
        Fact(
            "x / scale is rounded to nearest even with saturation",
            "csrc/quantization/fp8/amd/quant_utils.cuh; as evalkit issue 22 states",
            verified=False,
        ),
        Fact("fp8_e5m2 on ROCm is not modeled", "not read", verified=False),
        Fact(
            "vLLM 0.33+: octave_k3v4, octave_k3v3, octave_k3v3_compact on the ROCM_OCTAVE backend (RDNA 3 and CDNA 3 "
            "only; fp16/bf16 models; its kernels take head_size 256 with 64 rotary dims): random signs and "
            "Walsh-Hadamard rotations, int8 Lloyd-Max codebooks, fp16 scales with x . x_hat = |x|^2, computed on "
            "the fly (no checkpoint scales); evalkit's vllm:octave_* is the format's reference arithmetic",
            "vllm/v1/attention/backends/rocm_octave_attn.py (RocmOctaveAttentionBackend, :94-99, :292-301); "
            "vllm/v1/attention/ops/rocm_octave.py (OctaveFormat, reference_quantize)",
        ),
        _VLLM_PER_TENSOR,
        _VLLM_NO_ESTIMATE,
        _VLLM_SKIP,
    ),
)

PROFILES = (VLLM_CPU, VLLM_CUDA, VLLM_ROCM)
