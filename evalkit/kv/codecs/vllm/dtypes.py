"""vLLM's ``kv_cache_dtype`` values as evalkit schemes: ``vllm:<kv_cache_dtype>``, as data.

Every value of vLLM 0.32's ``CacheDType`` (``vllm/config/cache.py``), and the three ``octave_*`` values 0.33
added (0.34 takes the same 22), has one row here: the scheme
that models its store kernel (read in the kernel source named in the row), or, when there is none
yet, the one-line reason, so that ``vllm:<dtype>`` parses to a scheme or is refused in one line
wherever a scheme string is read (run, sweep grids, report labels, capacity). The engine-side
view, with vLLM's own page size per token and the live ``CacheDType`` list, is
:mod:`evalkit.engines.vllm.dtypes` (it needs vLLM installed; this table does not).

Resolution:

- ``auto`` / ``bfloat16`` / ``float16``: the unquantized baseline ``bf16``.
- ``fp8`` / ``fp8_e4m3`` / ``fp8_e5m2``: the per-tensor schemes that the ``vllm-cuda`` engine
  profile maps them to without checkpoint scales (``fp8_e4m3/tensor/unit``, ``fp8_e5m2/tensor/unit``;
  a test holds the two equal). On the CPU backend run ``--engine-profile vllm-cpu`` (toward-zero
  rounding); with checkpoint scales use the profile's ``scheme_for``.
- ``int8_per_token_head`` / ``fp8_per_token_head``: :mod:`evalkit.kv.codecs.vllm.per_token_head`,
  printed back as ``vllm:<dtype>`` (its own canonical string; ``+skip=`` may follow).
- ``int4_per_token_head``, ``turboquant_*``, ``ultraquant_4bit``: slot codecs
  (:mod:`evalkit.kv.codecs.slot`: rotation, codebook, packed slot), printed back as ``vllm:<dtype>``.
- ``nvfp4`` / ``nvfp4_4over6``: codecs of :mod:`evalkit.kv.codecs.vllm.nvfp4` (unit k_scale/v_scale).
- ``fp8_ds_mla`` / ``nvfp4_ds_mla``: DeepSeek MLA rows, codecs of :mod:`evalkit.kv.codecs.vllm.ds_mla` (MLA
  models with a 512-value latent and 64-value RoPE key only; refused on standard attention).
- ``octave_k3v4`` / ``octave_k3v3`` / ``octave_k3v3_compact`` (vLLM 0.33+, ROCm): codecs of
  :mod:`evalkit.kv.codecs.vllm.octave`, whose K slot follows the model's rotary dims (which version takes
  which dtype: :mod:`evalkit.engines.vllm.declared`).
- the rest: refused with what the kernel does and where it is, until modelled.

The family that parses, prints and checks them is :mod:`evalkit.kv.codecs.vllm.family`. Which
architecture a dtype applies to (:class:`Arch`) is checked when a scheme meets a model: per-token-head
dtypes exist on vLLM's Triton attention backend only (no MLA backend lists them) and need
head_size >= 32.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from evalkit.errors import SchemeError

OPS = "vllm/v1/attention/ops/"


class Status(str, enum.Enum):
    MODELLED = "modelled"  # a scheme reproduces its store kernel
    BASELINE = "baseline"  # unquantized
    NOT_MODELLED = "not modelled yet"
    REFUSED = "refused"  # not a KV cache evalkit can model on any platform it serves (Gaudi's INC)


class Arch(str, enum.Enum):
    ANY = "any"
    GQA = "gqa"  # standard attention K/V per KV head (MHA, GQA, MQA)
    MLA = "mla"  # multi-head latent attention rows (DeepSeek-V3 family)


@dataclass(frozen=True)
class VllmDtype:
    name: str
    status: Status
    scheme: str | None  # the scheme string it resolves to (None: not modelled / refused)
    what: str  # what the kernel stores (modelled) or the reason it is not modelled
    source: str  # the kernel's file in vLLM's repository
    function: str  # the store function or kernel in that file
    arch: Arch = Arch.ANY


_PTH = "triton_reshape_and_cache_flash.py"
_PER_TENSOR_FN = "reshape_and_cache_kernel_flash (Triton; FlashAttention's is csrc/cache_kernels.cu, CUDA C++)"
_PER_TENSOR = "fp8 per-tensor store, as the vllm-cuda profile maps it: one k_scale/v_scale per layer (1.0 without checkpoint scales), round to nearest even"  # noqa: E501
_DS_MLA_SOURCE = (
    "vllm/models/deepseek_v32/common/kernels.py (Triton; csrc/cache_kernels.cu, CUDA C++, for HiSparse/PCP)"
)
_DS_MLA_FN = "_fused_norm_rope_kernel"

VLLM_DTYPES: dict[str, VllmDtype] = {
    d.name: d
    for d in (
        VllmDtype(
            "auto", Status.BASELINE, "auto", "the model's dtype, unquantized", "vllm/config/cache.py", "CacheDType"
        ),
        VllmDtype("float16", Status.BASELINE, "fp16", "16-bit, unquantized", "vllm/config/cache.py", "CacheDType"),
        VllmDtype("bfloat16", Status.BASELINE, "bf16", "16-bit, unquantized", "vllm/config/cache.py", "CacheDType"),
        VllmDtype("fp8", Status.MODELLED, "fp8_e4m3/tensor/unit", _PER_TENSOR, OPS + _PTH, _PER_TENSOR_FN),
        VllmDtype("fp8_e4m3", Status.MODELLED, "fp8_e4m3/tensor/unit", _PER_TENSOR, OPS + _PTH, _PER_TENSOR_FN),
        VllmDtype("fp8_e5m2", Status.MODELLED, "fp8_e5m2/tensor/unit", _PER_TENSOR, OPS + _PTH, _PER_TENSOR_FN),
        VllmDtype(
            "fp8_inc",
            Status.REFUSED,
            None,
            "Intel Gaudi (HPU) only: Intel Neural Compressor's FP8 path lives in vllm-gaudi, not in this vLLM",
            "vllm/config/cache.py",
            "CacheDType",
        ),
        VllmDtype(
            "int8_per_token_head",
            Status.MODELLED,
            None,
            "INT8, one float32 scale max(amax/127, 1e-6) per token and head, x*(1/scale), +-0.5 then truncation "
            "to [-128, 127]",
            OPS + _PTH,
            "_reshape_cache_per_token_head",
            Arch.GQA,
        ),
        VllmDtype(
            "fp8_per_token_head",
            Status.MODELLED,
            None,
            "FP8 E4M3, one float32 scale max(amax/448, 1e-6) per token and head, x*(1/scale), clamp +-448, "
            "the store's cast (RNE satfinite on GPU)",
            OPS + _PTH,
            "_reshape_cache_per_token_head",
            Arch.GQA,
        ),
        VllmDtype(
            "int4_per_token_head",
            Status.MODELLED,
            None,
            "randomized Hadamard rotation H(Dx) (single_rht, signs of _get_rht_signs round 0), asymmetric INT4 per "
            "token and head: scale max((max-min)/15, 1e-6), zero point in the scale's low 4 mantissa bits, "
            "half away from zero, two codes per byte",
            OPS + "int4_per_token_head.py",
            "reshape_and_cache_int4, _reshape_cache_int4_kernel",
            Arch.GQA,
        ),
        *(
            VllmDtype(
                name,
                Status.MODELLED,
                None,
                what + "; first and last 2 layers unquantized, first-chunk prefill attends raw K/V",
                OPS + "triton_turboquant_store.py",
                function,
                Arch.GQA,
            )
            for name, function, what in (
                (
                    "turboquant_k8v4",
                    "_tq_fused_store_fp8",
                    "FP8 keys (no rotation) and uniform 4-bit values, K and V packed into one slot per head",
                ),
                (
                    "turboquant_4bit_nc",
                    "_tq_fused_store_mse",
                    "Hadamard-rotated keys on a 4-bit Lloyd-Max codebook (centroids.py) with norm correction, "
                    "uniform 4-bit values, one packed slot per head",
                ),
                (
                    "turboquant_k3v4_nc",
                    "_tq_fused_store_mse",
                    "Hadamard-rotated keys on a 3-bit Lloyd-Max codebook with norm correction, uniform 4-bit "
                    "values, one packed slot per head",
                ),
                (
                    "turboquant_3bit_nc",
                    "_tq_fused_store_mse",
                    "Hadamard-rotated keys on a 3-bit Lloyd-Max codebook with norm correction, uniform 3-bit "
                    "values, one packed slot per head",
                ),
            )
        ),
        VllmDtype(
            "ultraquant_4bit",
            Status.MODELLED,
            None,
            "Hadamard-rotated K, FP4 E2M1 codes with UE8M0 scales 2**round(log2(0.156*amax)) per 32 values, "
            "K and V in one slot per head; first and last 2 layers unquantized, first-chunk prefill attends raw K/V",
            OPS + "ultraquant/triton_store.py",
            "_ultraquant_store_kernel (format in ultraquant/format.py)",
            Arch.GQA,
        ),
        *(
            VllmDtype(
                name,
                Status.MODELLED,
                None,
                what,
                "csrc/cache_kernels.cu -> nvfp4_kv_cache_kernels.cu (CUDA C++, not in the wheel; called from "
                "backends/flashinfer.py do_kv_cache_update)",
                "reshape_and_cache_nvfp4_kernel, cvt_warp_fp16_to_fp4 (nvfp4_utils.cuh)",
                Arch.GQA,
            )
            for name, what in (
                (
                    "nvfp4",
                    "NVFP4: E2M1 data (RNE satfinite) + one E4M3 scale e4m3(amax/6 / k_scale) per 16 values in each "
                    "head's K and V slot; k_scale/v_scale 1.0 (vLLM's default without checkpoint scales)",
                ),
                (
                    "nvfp4_4over6",
                    "the NVFP4 layout, choosing per 16 values between max/6 and max/4 scales by squared error (the "
                    "search is CUDA-only: evalkit's tie rule and error arithmetic are assumed); k_scale/v_scale 1.0",
                ),
            )
        ),
        *(
            VllmDtype(
                name,
                Status.MODELLED,
                None,
                what + "; fp16 scales s with x . x_hat = |x|^2 (code c reads LUT[c] * s / 64), the slot padded to "
                f"{align} bytes; vLLM 0.33+ on ROCm (RDNA 3, CDNA 3), its kernels at head_size 256 with 64 rotary "
                "dims only; a prefill chunk over 128 tokens attends its own K/V raw",
                OPS + "rocm_octave.py",
                "OctaveFormat, reference_quantize (backend: backends/rocm_octave_attn.py)",
                Arch.GQA,
            )
            for name, align, what in (
                (
                    "octave_k3v4",
                    8,
                    "random signs + Walsh-Hadamard per 64 dims; K's rotary blocks 4-bit and the rest 3-bit Lloyd-Max "
                    "codes (int8 LUT), one scale per 64-dim K block; V rotated whole, 4-bit codes, one scale",
                ),
                (
                    "octave_k3v3",
                    8,
                    "random signs + Walsh-Hadamard per 64 dims; K's rotary blocks 4-bit and the rest 3-bit Lloyd-Max "
                    "codes (int8 LUT), one scale per 64-dim K block; V rotated whole, 3-bit codes, one scale",
                ),
                (
                    "octave_k3v3_compact",
                    4,
                    "random signs + one Walsh-Hadamard over the head (power-of-two head_size); K 3-bit Lloyd-Max codes "
                    "(int8 LUT) with one scale; V rotated whole, 3-bit codes, one scale",
                ),
            )
        ),
        VllmDtype(
            "fp8_ds_mla",
            Status.MODELLED,
            None,
            "656 B per token: 512 E4M3 NoPE values with one power-of-two float32 scale 2**ceil(log2(max(amax/448, "
            "1e-4))) per 128, then 64 bf16 RoPE values (layout: backends/mla/flashmla_sparse.py)",
            _DS_MLA_SOURCE,
            _DS_MLA_FN + " MLA_CACHE_DS_MLA",
            Arch.MLA,
        ),
        VllmDtype(
            "nvfp4_ds_mla",
            Status.MODELLED,
            None,
            "352 B per token: 512 E2M1 NoPE values (x * 1/sf, RNE satfinite), 64 unscaled E4M3 RoPE values, 32 E4M3 "
            "scales e4m3(max(amax/6, 2**-9)) per 16, permuted 8x4 (layout: backends/mla/flashmla_sparse.py)",
            _DS_MLA_SOURCE,
            _DS_MLA_FN + " MLA_CACHE_NVFP4",
            Arch.MLA,
        ),
    )
}


def get_dtype(name: str) -> VllmDtype:
    try:
        return VLLM_DTYPES[name]
    except KeyError:
        raise SchemeError(
            f"vLLM has no kv_cache_dtype {name!r} (vLLM 0.32-0.34): use one of {', '.join(VLLM_DTYPES)} "
            "(see `python -m evalkit schemes --engine vllm`)"
        ) from None
