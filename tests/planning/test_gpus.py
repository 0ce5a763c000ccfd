"""The GPU table and which vLLM 0.33 kv_cache_dtypes each GPU runs (the backends' own declarations)."""

from __future__ import annotations

import pytest

from evalkit.errors import EvalkitError
from evalkit.planning.gpus import GPUS, get_gpu
from evalkit.planning.kv_backends import CACHE_DTYPES, kv_support, runnable

GIB, MIB = 2**30, 2**20


def test_h200_memory_three_ways():
    h200 = get_gpu("H200")
    assert h200.stated_gb == 141 and h200.smi_bytes == 143_771 * MIB
    assert h200.memory == h200.cuda_bytes == round(139.81 * GIB)
    # "141GB" (decimal), "141GiB" and what vLLM sees are three different sizes
    assert 141 * 10**9 < h200.memory < 141 * GIB
    assert h200.memory / (141 * GIB) == pytest.approx(0.9916, abs=1e-4)


def test_table_covers_the_gpus_operators_serve_on():
    assert {"a100", "l40s", "h100", "h200", "b200", "gb200", "b300", "mi300x", "mi325x", "mi355x"} <= set(GPUS)
    for gpu in GPUS.values():
        assert gpu.memory <= gpu.stated_gb * 10**9 * 1.1 and gpu.memory >= gpu.stated_gb * 10**9 * 0.9
        assert (gpu.capability is None) == (gpu.vendor == "amd") == (gpu.gfx is not None)
        assert gpu.source
    assert get_gpu("b300").sm100_family and not get_gpu("h200").sm100_family
    with pytest.raises(EvalkitError, match="unknown GPU 'h300': use one of a100, l40s, h100"):
        get_gpu("h300")


@pytest.mark.parametrize(
    "gpu,dtype,kind,head,runs,first",
    [
        # NVFP4: no MLA backend stores it anywhere; standard attention through FlashInfer
        ("h200", "nvfp4", "mla", 128, False, None),
        ("b200", "nvfp4", "mla", 128, False, None),
        ("h200", "nvfp4", "standard", 128, True, "FLASHINFER"),  # its FA2 path on SM 8/9/12
        ("h200", "nvfp4", "standard", 64, False, None),  # refused at head_size 64 off SM 10.x
        ("b200", "nvfp4", "standard", 64, True, "FLASHINFER"),
        ("h200", "nvfp4_4over6", "standard", 128, False, None),  # TensorRT-LLM kernels, SM 10.x only
        ("b300", "nvfp4_4over6", "standard", 128, True, "FLASHINFER"),
        ("mi300x", "nvfp4", "standard", 128, False, None),
        # FP8
        ("h200", "fp8_e4m3", "standard", 128, True, "FLASH_ATTN"),  # FA3
        ("h200", "fp8_e5m2", "standard", 128, True, "FLASHINFER"),  # FA never stores E5M2
        ("a100", "fp8_e4m3", "standard", 128, True, "FLASHINFER"),  # Triton needs SM 8.9, FA needs FA3/FA4
        ("l40s", "fp8_e4m3", "standard", 128, True, "FLASHINFER"),
        ("a100", "fp8", "mla", 128, False, None),  # Triton MLA only below SM 9, and it needs SM 8.9 for FP8
        ("l40s", "fp8", "mla", 128, True, "TRITON_MLA"),
        ("h200", "fp8", "mla", 128, True, "FLASHMLA"),
        ("h200", "fp8_e5m2", "mla", 128, False, None),
        ("b200", "fp8", "mla", 128, True, "FLASHINFER_MLA"),
        ("mi300x", "fp8_e4m3", "standard", 128, True, "ROCM_ATTN"),
        ("mi355x", "fp8_e5m2", "standard", 128, True, "ROCM_ATTN"),
        ("mi300x", "fp8", "mla", 128, True, "TRITON_MLA"),
        # the MLA row layouts: sparse MLA (DeepSeek V3.2) only
        ("h200", "fp8_ds_mla", "mla", 128, False, None),
        ("h200", "fp8_ds_mla", "sparse_mla", 128, True, "FLASHMLA_SPARSE"),
        ("h200", "nvfp4_ds_mla", "sparse_mla", 128, False, None),
        ("b200", "nvfp4_ds_mla", "sparse_mla", 128, True, "FLASHMLA_SPARSE"),
        # the rest
        ("a100", "int8_per_token_head", "standard", 128, True, "TRITON_ATTN"),
        ("a100", "fp8_per_token_head", "standard", 128, False, None),
        ("h100", "turboquant_k8v4", "standard", 128, True, "TURBOQUANT"),
        ("mi300x", "octave_k3v4", "standard", 128, True, "ROCM_OCTAVE"),
        ("mi355x", "octave_k3v4", "standard", 128, False, None),
        ("h200", "octave_k3v4", "standard", 128, False, None),
        ("h200", "fp8_inc", "standard", 128, False, None),
    ],
)
def test_kv_cache_dtypes_per_gpu(gpu, dtype, kind, head, runs, first):
    s = kv_support(get_gpu(gpu), dtype, kind=kind, head_size=head)
    assert s.runs == runs and (s.backends[0] if s.backends else None) == first
    assert bool(s.reason) == (not runs)


def test_refusals_say_why():
    h200 = get_gpu("h200")
    assert (
        kv_support(h200, "nvfp4", kind="mla").reason == "no MLA backend of vLLM 0.33 on NVIDIA H200 (SXM) stores nvfp4"
    )
    assert "SM 10.x" in kv_support(h200, "nvfp4_4over6").reason
    assert "head_size 64" in kv_support(h200, "nvfp4", head_size=64).reason
    assert (
        kv_support(get_gpu("a100"), "fp8_per_token_head").reason == "TRITON_ATTN needs SM 8.9+ for FP8 (native fp8e4nv)"
    )


def test_a_backend_that_needs_a_setting_says_so():
    assert kv_support(get_gpu("h200"), "ultraquant_4bit").mark() == "yes: ULTRAQUANT (--attention-backend ULTRAQUANT)"
    assert kv_support(get_gpu("mi300x"), "ultraquant_4bit").mark() == "yes: ULTRAQUANT"
    assert kv_support(get_gpu("mi300x"), "fp8_e5m2", kind="mla").mark() == "yes: ROCM_AITER_MLA (VLLM_ROCM_USE_AITER=1)"


def test_runnable_lists_are_subsets_of_vllm_cache_dtypes():
    for gpu in GPUS.values():
        assert set(runnable(gpu)) <= set(CACHE_DTYPES) and "auto" in runnable(gpu, "mla")
    assert "nvfp4" not in runnable(get_gpu("h200"), "mla") and "nvfp4" in runnable(get_gpu("h200"))


def test_nvfp4_off_sm100_is_marked_as_flashinfers_fa2_path():
    assert kv_support(get_gpu("h200"), "nvfp4").mark() == "yes: FLASHINFER (FA2 path)"
    assert kv_support(get_gpu("b200"), "nvfp4").mark() == "yes: FLASHINFER"
