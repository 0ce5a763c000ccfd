"""SGLang, declared as an engine evalkit models but does not run (:mod:`evalkit.engines.registry`).

SGLang 0.5.23's ``--kv-cache-dtype`` choices (``python/sglang/srt/arg_groups/fields/model.py``) are
``auto, fp8_e5m2, fp8_e4m3, mxfp8, bf16, bfloat16, nvfp4, fp4_mx_block16``. Each is declared here with the
evalkit scheme that models it, or why none does:

- ``fp8_e4m3`` / ``fp8_e5m2``: per-tensor FP8 with the checkpoint's ``k_scale``/``v_scale``, else 1.0
  (``fp8_e4m3/tensor/unit``); nearest-even torch cast;
- ``fp4_mx_block16``: ``FP4MXBlock16KVQuantizeUtil`` (``kvfp4_tensor.py``): 16-element blocks, scale
  ``2**ceil(log2(amax/6))`` stored as exponent + 127, a value mapped to the highest E2M1 level whose bound
  it reaches (ties away from zero): evalkit's ``sglang_fp4``. Earlier evalkit called it by the name
  ``fp4_e2m1``, which 0.5.23 does not take: it is refused in one line naming ``fp4_mx_block16``
  (the releases before 0.5.23 were not read, so none is declared);
- ``mxfp8`` (FA4 backend only): one UE8M0 byte ``clamp(ceil(log2(max(amax, 1e-30) / 448)) + 127, 0, 254)`` per
  32 values along head_dim, values ``e4m3(clamp(x / scale, +-448))`` (nearest even), and Q quantized the same way
  before FA4's block-scaled QK: evalkit's ``sglang:mxfp8`` (:mod:`evalkit.kv.codecs.sglang.mxfp8`, where the source
  lines are). evalkit's ``mxfp8_e4m3`` follows OCP MX's ``floor(log2(amax)) - 8`` instead and leaves Q alone;
- ``nvfp4`` (flashinfer's ``nvfp4_kv_quantize``: E4M3 per 16 values and a per-layer FP32 global scale
  from the checkpoint, without which ``NVFP4KVQuantizeUtil`` refuses to run): not modelled. evalkit has no
  static global-scale path for NVFP4: its ``nvfp4`` takes the per-tensor scale from each sequence's first
  write and ``vllm:nvfp4`` fixes ``k_scale`` at 1.0; neither is SGLang's store.

The engine profile ``sglang`` (:mod:`evalkit.engines.profiles`) maps plain emulation schemes onto these.
"""

from __future__ import annotations

from evalkit.engines.attention_paths import Fact
from evalkit.engines.declaration import CacheType, EngineVersion
from evalkit.engines.profiles import EngineProfile, KVDtype
from evalkit.engines.registry import Engine, register_engine
from evalkit.kv.formats import Rounding

MODEL_ARGS = "python/sglang/srt/arg_groups/fields/model.py (--kv-cache-dtype choices), sglang 0.5.23"
_POOL = "python/sglang/srt/mem_cache/memory_pool.py"
_MXFP8 = (
    "python/sglang/kernels/ops/quantization/mxfp8_quant.py:98-163 (_mxfp8_quant_store_qkv_kernel, the store of "
    "quant_store_kv_mxfp8; to_mxfp8 for Q), issue 52: kernels/ops/kvcache/mxfp8_quant_store_kv.py"
)
RENAMED = (("fp4_e2m1", "fp4_mx_block16"),)

V0523 = (
    CacheType("auto", "auto", "the model's dtype, unquantized (fp8_e4m3 for an FP8 kv_cache_quant_algo)", MODEL_ARGS),
    CacheType("fp8_e5m2", "fp8_e5m2/tensor/unit", "FP8 E5M2, one k_scale/v_scale per layer (1.0 without)", _POOL),
    CacheType("fp8_e4m3", "fp8_e4m3/tensor/unit", "FP8 E4M3, one k_scale/v_scale per layer (1.0 without)", _POOL),
    CacheType(
        "mxfp8",
        "sglang:mxfp8",
        "FA4 backend only: E4M3 with one UE8M0 scale ceil(log2(max(amax, 1e-30)/448)) + 127 (clamped to 0..254) "
        "per 32 values along head_dim, clamp to +-448, Q quantized the same way",
        _MXFP8,
    ),
    CacheType("bf16", "bf16", "16-bit, unquantized", MODEL_ARGS),
    CacheType("bfloat16", "bf16", "16-bit, unquantized", MODEL_ARGS),
    CacheType(
        "nvfp4",
        None,
        "flashinfer's nvfp4_kv_quantize: E2M1 with an E4M3 scale per 16 values and a per-layer FP32 global scale "
        "from the checkpoint (NVFP4KVQuantizeUtil refuses to run without one); evalkit has no static global-scale "
        "path for NVFP4 (its nvfp4 takes the scale from each sequence's first write, vllm:nvfp4 fixes k_scale at 1.0)",
        "flashinfer nvfp4_kv_quantize (python/sglang/srt/mem_cache/memory_pool.py)",
    ),
    CacheType(
        "fp4_mx_block16",
        "sglang_fp4",
        "E2M1 in blocks of 16, scale 2**ceil(log2(amax/6)) stored as exponent + 127, ties away from zero",
        "python/sglang/srt/layers/quantization/kvfp4_tensor.py (FP4MXBlock16KVQuantizeUtil)",
    ),
)

SGLANG = EngineProfile(
    name="sglang",
    description="SGLang 0.5.23 with --kv-cache-dtype fp8_e4m3, fp8_e5m2, fp4_mx_block16 or mxfp8",
    release="SGLang 0.5.23",
    kv_cache_dtypes=(
        KVDtype("auto", None),
        KVDtype("bf16", "bf16"),
        KVDtype("bfloat16", "bf16"),
        KVDtype("fp8_e4m3", "fp8_e4m3"),
        KVDtype("fp8_e5m2", "fp8_e5m2"),
        KVDtype("fp4_mx_block16", "fp4_e2m1", Rounding.RNA, named="sglang_fp4", checkpoint_scales=False),
        KVDtype("mxfp8", "fp8_e4m3", named="sglang:mxfp8", checkpoint_scales=False),
    ),
    not_modelled=tuple((d.name, d.note) for d in V0523 if not d.modelled),
    renamed=RENAMED,
    facts=(
        Fact(
            "--kv-cache-dtype takes auto, fp8_e5m2, fp8_e4m3, mxfp8, bf16, bfloat16, nvfp4, fp4_mx_block16 (no "
            "fp4_e2m1, no --fp4-kv-cache-recipe, no --int8-kv-cache); auto becomes fp8_e4m3 when the checkpoint's "
            "kv_cache_quant_algo is FP8",
            MODEL_ARGS,
        ),
        Fact(
            "per-tensor k_scale/v_scale from the checkpoint, else 1.0 (BaseKVCacheMethod adapted from vLLM's)",
            "python/sglang/srt/layers/quantization/kv_cache.py",
        ),
        Fact(
            "the FP8 store divides by the scale and casts with torch (.to(float8)): nearest even; nothing clamps "
            "before the cast, so values beyond the format's range get whatever torch's cast gives there "
            "(evalkit saturates)",
            "python/sglang/srt/mem_cache/memory_pool.py (MHATokenToKVPool.set_kv_buffer)",
        ),
        Fact(
            "no runtime scale estimate (calculate-kv-scales was asked for, not added)",
            "sgl-project/sglang issue #6518",
            verified=False,
        ),
        Fact(
            "fp4_mx_block16: E2M1 in 16-element groups with an E8M0 scale 2**ceil(log2(amax / 6)), elements rounded "
            "half away from zero, sign bit v < 0: evalkit's sglang_fp4; a checkpoint k_scale dividing the values "
            "first is not modeled",
            "python/sglang/srt/layers/quantization/kvfp4_tensor.py (FP4MXBlock16KVQuantizeUtil), "
            "python/sglang/srt/mem_cache/memory_pool.py (MHATokenToKVPoolFP4)",
        ),
        Fact(
            "mxfp8 (FA4 backend only): per token and head, each 32 values along head_dim get the byte "
            "clamp(ceil(log2(max(amax, 1e-30) / 448)) + 127, 0, 254) and codes e4m3(clamp(x / 2**(byte - 127), +-448)) "
            "(nearest even); an all-zero block gets byte 19; Q is quantized by the same rule (to_mxfp8) and its "
            "scales go to FA4 as q_descale: evalkit's sglang:mxfp8, Q read back dequantized",
            _MXFP8,
        ),
        Fact(
            "mxfp8 stores its codes in the K/V buffers (1 byte per value) and its scales in separate K/V scale "
            "buffers in FA4's BlockScaledBasicChunk order, a page of PAGE tokens (heads, 32, PAGE/32, head_dim/32) "
            "bytes: head_dim + head_dim/32 bytes per token, head and side",
            "python/sglang/kernels/ops/quantization/mxfp8_quant.py:155-163",
        ),
    ),
)

ENGINE = register_engine(
    Engine(
        name="sglang",
        package="sglang",
        install="evalkit models SGLang's KV cache; it does not run SGLang",
        description="SGLang (modelled, not run): its --kv-cache-dtype values and the scheme each is",
        devices=("cuda",),
        profiles=(SGLANG,),
        versions=(EngineVersion("0.5.23", ("cuda",), V0523, RENAMED),),
        order=10,
    )
)
