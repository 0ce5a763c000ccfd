"""Which vLLM ``kv_cache_dtype`` a GPU can run, from vLLM 0.33's attention backends as their source declares.

vLLM picks an attention backend per platform from a priority list (``vllm/platforms/cuda.py`` and
``rocm.py``, ``_get_backend_priorities``), skipping any whose ``supported_kv_cache_dtypes``,
``supports_kv_cache_dtype``, ``supports_compute_capability`` or ``supports_combination`` refuses the
run. A ``kv_cache_dtype`` runs on a GPU when one backend for the model's attention (standard or MLA;
DeepSeek V3.2's sparse MLA has backends of its own) takes it. :data:`BACKENDS` holds each backend's
declared dtypes and the checks that decide, with the file they were read in (``vllm/v1/attention/``):

- FP8 (``fp8``, ``fp8_e4m3``, ``fp8_e5m2``): Triton attention and Triton MLA refuse it below SM 8.9 ("native
  FP8 (fp8e4nv) requires SM89+", ``backends/triton_attn.py``, ``backends/mla/triton_mla.py``);
  FlashAttention only on its FA3 (SM 9.x) and FA4 (SM 10.x) paths, never E5M2
  (``backends/fa_utils.py`` ``flash_attn_supports_kv_cache_dtype``); FlashInfer on SM 8.0-12.1 with any FP8
  (on SM 8.x only its FA2 path, with BF16 queries). On ROCm every FP8 dtype runs (``rocm_attn.py``), stored
  as E4M3-fnuz on gfx94x (MI300X, MI325X; ``platforms/rocm.py`` ``fp8_dtype``).
- NVFP4: FlashInfer only. ``nvfp4`` and ``nvfp4_4over6`` through TensorRT-LLM kernels on SM 10.x;
  ``nvfp4`` alone through the FA2 path on SM 8.x, 9.x and 12.x, refused at head_size 64 and with
  attention sinks (``backends/flashinfer.py`` ``supports_kv_cache_dtype``, ``supports_combination``). No
  MLA backend stores ``nvfp4``; ``nvfp4_ds_mla`` is sparse MLA on SM 10.x only (``mla/flashmla_sparse.py``).
- per-token-head INT4/INT8/FP8: Triton attention (FP8 from SM 8.9); TurboQuant: its own backend, any GPU;
  UltraQuant: its own backend, in ROCm's list only (on CUDA only with ``--attention-backend ULTRAQUANT``);
  Octave: ROCm CDNA 3 (gfx942) and RDNA 3 (``rocm_octave_attn.py``); ``fp8_inc``: Intel Gaudi only.

Backends that need a setting (AITER on ROCm, an explicit ``--attention-backend``) say so in ``needs``.
"""

from __future__ import annotations

from dataclasses import dataclass

from evalkit.planning.gpus import GPU

CACHE_DTYPES = (  # vllm/config/cache.py CacheDType (0.33)
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "octave_k3v4", "octave_k3v3",
    "octave_k3v3_compact", "ultraquant_4bit", "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head",
    "nvfp4", "nvfp4_4over6",
)  # fmt: skip
_PLAIN = ("auto", "float16", "bfloat16")
_FP8 = ("fp8", "fp8_e4m3")
_TURBO = ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")


@dataclass(frozen=True)
class Backend:
    name: str
    platform: str  # "cuda" | "rocm" | "both"
    kind: str  # "standard" | "mla" | "sparse_mla"
    dtypes: tuple[str, ...]
    source: str
    majors: tuple[int, ...] | None = None  # CUDA capability majors (None: any the platform has)
    needs: str = ""  # a setting the backend needs to be chosen ("" : vLLM picks it by itself)


BACKENDS: tuple[Backend, ...] = (
    # in each platform's priority order (cuda.py / rocm.py _get_backend_priorities)
    Backend("FLASH_ATTN", "cuda", "standard", _PLAIN + _FP8, "backends/flash_attn.py"),
    Backend("FLASHINFER", "cuda", "standard", _PLAIN + _FP8 + ("fp8_e5m2", "nvfp4", "nvfp4_4over6"),
            "backends/flashinfer.py", (8, 9, 10, 11, 12)),
    Backend("ROCM_ATTN", "rocm", "standard", _PLAIN + _FP8 + ("fp8_e5m2",), "backends/rocm_attn.py"),
    Backend("TRITON_ATTN", "both", "standard",
            _PLAIN + _FP8 + ("fp8_e5m2", "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head"),
            "backends/triton_attn.py"),
    Backend("TURBOQUANT", "both", "standard", _TURBO, "backends/turboquant_attn.py"),
    Backend("ULTRAQUANT", "rocm", "standard", ("ultraquant_4bit",), "backends/ultraquant_attn.py"),
    Backend("ULTRAQUANT", "cuda", "standard", ("ultraquant_4bit",), "backends/ultraquant_attn.py",
            needs="--attention-backend ULTRAQUANT"),
    Backend("ROCM_OCTAVE", "rocm", "standard", ("octave_k3v4", "octave_k3v3", "octave_k3v3_compact"),
            "backends/rocm_octave_attn.py"),
    Backend("FLASHINFER_MLA", "cuda", "mla", _PLAIN + _FP8, "backends/mla/flashinfer_mla.py", (10,)),
    Backend("CUTLASS_MLA", "cuda", "mla", _PLAIN + _FP8, "backends/mla/cutlass_mla.py", (10,)),
    Backend("FLASH_ATTN_MLA", "cuda", "mla", _PLAIN, "backends/mla/flashattn_mla.py", (9,)),
    Backend("FLASHMLA", "cuda", "mla", _PLAIN + _FP8, "backends/mla/flashmla.py", (9, 10)),
    Backend("TRITON_MLA", "both", "mla", _PLAIN + _FP8, "backends/mla/triton_mla.py"),
    Backend("ROCM_AITER_MLA", "rocm", "mla", _PLAIN + _FP8 + ("fp8_e5m2",), "backends/mla/rocm_aiter_mla.py",
            needs="VLLM_ROCM_USE_AITER=1"),
    Backend("FLASHINFER_MLA_SPARSE", "cuda", "sparse_mla", _PLAIN + _FP8, "backends/mla/flashinfer_mla_sparse.py",
            (10,)),
    Backend("FLASHMLA_SPARSE", "cuda", "sparse_mla", ("auto", "bfloat16", "fp8", "fp8_ds_mla", "nvfp4_ds_mla"),
            "backends/mla/flashmla_sparse.py", (9, 10)),
    Backend("FLASHINFER_MLA_SPARSE_SM90", "cuda", "sparse_mla", ("auto", "bfloat16") + _FP8,
            "backends/mla/flashinfer_mla_sparse_sm90.py", (9,)),
    Backend("FLASHINFER_MLA_SPARSE_SM120", "cuda", "sparse_mla", ("auto",) + _FP8 + ("fp8_ds_mla",),
            "backends/mla/flashinfer_mla_sparse.py", (12,)),
    Backend("ROCM_AITER_MLA_SPARSE", "rocm", "sparse_mla", _PLAIN + _FP8, "backends/mla/rocm_aiter_mla_sparse.py"),
)  # fmt: skip


def refusal(backend: Backend, gpu: GPU, dtype: str, head_size: int = 128) -> str | None:
    """Why ``backend`` will not run ``dtype`` on ``gpu`` (None: it will)."""
    cuda = gpu.vendor == "nvidia"
    if backend.platform not in ("both", "cuda" if cuda else "rocm"):
        return f"{backend.name} is not a backend of vLLM on {'CUDA' if cuda else 'ROCm'}"
    if dtype not in backend.dtypes:
        return f"{backend.name} does not list {dtype}"
    major = gpu.capability[0] if cuda else None
    if cuda and backend.majors is not None and major not in backend.majors:
        return f"{backend.name} runs on SM {'/'.join(f'{m}.x' for m in backend.majors)}, not {gpu.compute}"
    fp8 = dtype.startswith("fp8")
    if cuda and fp8 and backend.name in ("TRITON_ATTN", "TRITON_MLA") and gpu.capability < (8, 9):
        return f"{backend.name} needs SM 8.9+ for FP8 (native fp8e4nv)"
    if backend.name == "FLASH_ATTN" and fp8 and major not in (9, 10):
        return "FLASH_ATTN stores FP8 only on its FA3 (SM 9.x) and FA4 (SM 10.x) paths"
    if backend.name == "FLASHINFER" and dtype.startswith("nvfp4") and major != 10:
        if dtype != "nvfp4":
            return f"{dtype} needs FlashInfer's TensorRT-LLM kernels (SM 10.x)"
        if head_size == 64:
            return "FLASHINFER's FA2 path misreads an NVFP4 cache at head_size 64 (SM 10.x only there)"
    if backend.name == "FLASHMLA_SPARSE" and dtype == "nvfp4_ds_mla" and major != 10:
        return "FLASHMLA_SPARSE stores nvfp4_ds_mla on SM 10.x only"
    if backend.name == "ROCM_OCTAVE" and gpu.gfx != "gfx942":
        return "ROCM_OCTAVE runs on CDNA 3 (gfx942) and RDNA 3 only"
    return None


@dataclass(frozen=True)
class Support:
    dtype: str
    backends: tuple[str, ...]  # the backends that run it, vLLM's own choices first
    needs: str  # a setting needed when only such a backend runs it
    reason: str  # why nothing runs it ("" when something does)

    @property
    def runs(self) -> bool:
        return bool(self.backends)

    path: str = ""  # the kernel path when it is not the backend's usual one

    def mark(self) -> str:
        if not self.runs:
            return "no"
        extra = ", ".join(x for x in (self.path, self.needs) if x)
        return f"yes: {self.backends[0]}" + (f" ({extra})" if extra else "")


def kv_support(gpu: GPU, dtype: str, *, kind: str = "standard", head_size: int = 128) -> Support:
    """Whether vLLM 0.33 runs ``--kv-cache-dtype dtype`` on ``gpu`` for attention of ``kind``."""
    candidates = [b for b in BACKENDS if b.kind == kind]
    runs, reasons = [], []
    for backend in candidates:
        why = refusal(backend, gpu, dtype, head_size)
        (reasons if why else runs).append(why or backend)
    runs.sort(key=lambda b: bool(b.needs))
    if runs:
        first = runs[0]
        fa2 = first.name == "FLASHINFER" and dtype == "nvfp4" and gpu.capability and gpu.capability[0] != 10
        path = "FA2 path" if fa2 else ""  # flashinfer.py _nvfp4_kv_on_fa2: BF16 queries, not the SM100 kernels
        return Support(dtype, tuple(b.name for b in runs), first.needs, "", path)
    listed = [r for r in reasons if " does not list " not in r and " is not a backend " not in r]
    where = {"standard": "attention", "mla": "MLA", "sparse_mla": "sparse-MLA"}[kind]
    reason = listed[0] if listed else f"no {where} backend of vLLM 0.33 on {gpu.name} stores {dtype}"
    return Support(dtype, (), "", reason)


def runnable(gpu: GPU, kind: str = "standard", head_size: int = 128) -> list[str]:
    """The kv_cache_dtypes vLLM 0.33 runs on ``gpu`` for attention of ``kind``."""
    return [d for d in CACHE_DTYPES if kv_support(gpu, d, kind=kind, head_size=head_size).runs]
