"""Which attention path an engine runs on which GPU generation, and the evalkit attention precision that models it.

The KV cache's numbers are not the only FP8 error a GPU engine adds. Which attention kernel reads the
cache decides whether the queries and the softmax probabilities are rounded to FP8 too, and vLLM
picks the kernel per GPU generation:

* **Hopper** (H100, H200): ``FLASH_ATTN`` with FlashAttention 3 for an FP8 E4M3 cache. Q is quantized
  to E4M3 with a static scale (the checkpoint's ``q_scale``, 1.0 without one), and the kernel rounds the
  probabilities to E4M3 before the P·V product. evalkit models this with ``+attn=fa3``
  (:mod:`evalkit.integration.fa3`).
* **Blackwell** (B200): ``FLASHINFER`` (trtllm-gen kernels), also with Q in FP8 E4M3. These kernels
  ship compiled, so P's precision was not read: ``+attn=fa3`` models it approximately.
* **Ampere, Ada, and RTX-class Blackwell** (SM 12.x): FlashAttention 2 takes no FP8 cache, so
  ``FLASHINFER`` runs its FA2 kernels. Q and P stay in the model's dtype and only K/V are in FP8, which
  is the plain scheme (``+attn=kv``).

``fp8_e5m2`` on Blackwell has no path here: FlashInfer asks for a quantized query on SM 10.x, and
``Attention.forward`` asserts an ``fp8``/``fp8_e4m3`` cache when it quantizes one, so it was not followed
further.

Each :class:`AttentionPath` carries :class:`Fact`\\ s naming the vLLM 0.33.0 source they were read in.
The 0.32.0 wheel has the same selection and Q handling.
A profile lists its paths (:attr:`evalkit.engines.profiles.EngineProfile.attention_paths`). The report's
GPU prediction (:mod:`evalkit.report.prediction`) models each engine row on the path of one generation
and names the path it models.
"""

from __future__ import annotations

from dataclasses import dataclass

from evalkit.errors import SchemeError
from evalkit.kv.scheme import AttentionPrecision


@dataclass(frozen=True)
class Fact:
    """One thing an engine does, with where it was read (``source``: file or PR in its public repo)."""

    text: str
    source: str
    verified: bool = True  # False: stated (issue 22, a doc, a changelog), not read in the code or measured


@dataclass(frozen=True)
class GPUGeneration:
    """A family of NVIDIA GPUs that vLLM treats alike (by compute capability)."""

    name: str  # hopper
    sm: str  # SM 9.0
    gpus: str  # H100, H200, GH200
    short: str  # H100/H200: what a table heading names


GENERATIONS: dict[str, GPUGeneration] = {
    g.name: g
    for g in (
        GPUGeneration("ampere", "SM 8.0/8.6", "A100, A10, A40, RTX 30", "A100"),
        GPUGeneration("ada", "SM 8.9", "L4, L40S, RTX 40", "L40S"),
        GPUGeneration("hopper", "SM 9.0", "H100, H200, GH200", "H100/H200"),
        GPUGeneration("blackwell", "SM 10.x", "B200, B300, GB200, GB300", "B200"),
        GPUGeneration("blackwell-rtx", "SM 12.x", "RTX 50, RTX PRO 6000", "RTX 50"),
    )
}
# the GPU names an operator types, for the generation they belong to
GPU_ALIASES = {
    **{n: "ampere" for n in ("a100", "a10", "a30", "a40", "sm80", "sm86")},
    **{n: "ada" for n in ("l4", "l40", "l40s", "sm89")},
    **{n: "hopper" for n in ("h100", "h200", "h20", "gh200", "sm90")},
    **{n: "blackwell" for n in ("b200", "b300", "gb200", "gb300", "sm100", "sm103")},
    **{n: "blackwell-rtx" for n in ("rtx5090", "rtx-pro-6000", "sm120")},
}


def generation(name: str) -> GPUGeneration:
    """The GPU generation called ``name`` (``hopper``) or of a GPU (``h200``); SchemeError naming them otherwise."""
    key = name.lower()
    key = GPU_ALIASES.get(key, key)
    if key not in GENERATIONS:
        raise SchemeError(
            f"unknown GPU {name!r}: use a generation ({', '.join(GENERATIONS)}) or a GPU ({', '.join(GPU_ALIASES)})"
        )
    return GENERATIONS[key]


@dataclass(frozen=True)
class AttentionPath:
    """The attention kernel an engine runs for some ``kv_cache_dtype`` values on some GPU generations."""

    generations: tuple[str, ...]
    kv_cache_dtypes: tuple[str, ...]
    backend: str  # what the engine selects: FLASH_ATTN (FlashAttention 3)
    label: str  # the prediction cell's tag: FA3, K/V
    in_fp8: str  # what the kernel takes in FP8 ("with ... in FP8")
    attention: AttentionPrecision  # the evalkit attention precision that models it
    unmodeled: str = ""  # what evalkit's model of the path leaves out
    approximate: bool = False  # True: a step that changes the numbers is not modeled (or not read)
    facts: tuple[Fact, ...] = ()

    @property
    def tag(self) -> str:
        """The label, with ``approx.`` where evalkit's model of the path is approximate."""
        return self.label + (", approx." if self.approximate else "")

    def where(self) -> str:
        """The GPUs it runs on, as a heading names them: ``H100/H200``."""
        return ", ".join(GENERATIONS[g].short for g in self.generations)


def path_for(paths: tuple[AttentionPath, ...], kv_cache_dtype: str, gpu: str) -> AttentionPath | None:
    """The path of ``paths`` for ``kv_cache_dtype`` on ``gpu`` (a generation or a GPU name), or None."""
    name = generation(gpu).name
    return next((p for p in paths if name in p.generations and kv_cache_dtype in p.kv_cache_dtypes), None)


# -- vLLM on CUDA (vllm 0.33.0; 0.32.0 the same) ---------------------------------------------------------
_SELECTION = Fact(
    "a dense (non-MLA) causal model gets the first backend whose validate_configuration passes: on SM 10.x "
    "FLASHINFER, FLASH_ATTN, TRITON_ATTN, ...; on every other generation FLASH_ATTN, FLASHINFER, TRITON_ATTN, ...",
    "vllm/platforms/cuda.py (_get_backend_priorities, CudaPlatform.get_valid_backends, get_attn_backend_cls); "
    "vllm/v1/attention/selector.py (get_attn_backend)",
)
_FA_FP8 = Fact(
    "FLASH_ATTN takes an FP8 cache only with FlashAttention 3 on SM 9.0 (FA4 with head_size 512 there) or "
    "FlashAttention 4 on SM 10.x, never fp8_e5m2; the version is 3 on SM 9.0, 4 on SM 10.x and 2 elsewhere "
    "(head_size <= 256, no ALiBi)",
    "vllm/v1/attention/backends/fa_utils.py (flash_attn_supports_kv_cache_dtype, get_flash_attn_version); "
    "vllm/v1/attention/backends/flash_attn.py (FlashAttentionBackend.supports_combination)",
)
_Q_STATIC = Fact(
    "Q is quantized to E4M3 before attention with a static per-tensor scale, layer._q_scale: the checkpoint's "
    "q_scale, else 1.0 (x * (1 / scale), clamped to ±448, cast to nearest); evalkit's scale tables carry no "
    "q_scale, so evalkit models 1.0",
    "vllm/model_executor/layers/attention/attention.py (Attention.__init__ query_quant = QuantFP8(static=True), "
    "Attention.forward); vllm/model_executor/layers/quantization/kv_cache.py "
    "(BaseKVCacheMethod.process_weights_after_loading); vllm/model_executor/layers/quantization/input_quant_fp8.py "
    "(QuantFP8.forward_native)",
)
_FA3_P = Fact(
    "FlashAttention 3's FP8 kernel computes P = exp2(S * scale - (rowmax * scale - 8)), i.e. exp(S - max) * 2**8 "
    "in [0, 256], converts it to E4M3 for the P·V product and sums the row in float32 from the unrounded P",
    "vllm-project/flash-attention hopper/softmax.h (scale_apply_exp2, Softmax::finalize), "
    "hopper/flash_fwd_kernel_sm90.h (Softmax<..., Max_offset = Is_FP8 ? 8 : 0>), "
    "hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp (convert_type_out(tOrP_acc, tOrP))",
)

VLLM_CUDA_PATHS: tuple[AttentionPath, ...] = (
    AttentionPath(
        generations=("hopper",),
        kv_cache_dtypes=("fp8", "fp8_e4m3"),
        backend="FLASH_ATTN (FlashAttention 3)",
        label="FA3",
        in_fp8="Q, K, V and the softmax probabilities P (E4M3)",
        attention=AttentionPrecision.FA3,
        unmodeled="FA3 rounds P against the running row max of each 128-key tile (evalkit: the final row max), "
        "and its FP8 tensor-core accumulation",
        facts=(
            _SELECTION,
            _FA_FP8,
            Fact(
                "FlashAttentionImpl quantizes Q (supports_quant_query_input is true except for FA4's SM 9.0 "
                "dequantizing path) and passes q_descale, k_descale and v_descale to the kernel",
                "vllm/v1/attention/backends/flash_attn.py (FlashAttentionImpl.__init__, FlashAttentionImpl.forward)",
            ),
            _Q_STATIC,
            _FA3_P,
        ),
    ),
    AttentionPath(
        generations=("blackwell",),
        kv_cache_dtypes=("fp8", "fp8_e4m3"),
        backend="FLASHINFER (trtllm-gen)",
        label="FA3",
        in_fp8="Q, K and V (E4M3; P not read)",
        attention=AttentionPrecision.FA3,
        unmodeled="P's precision in trtllm-gen's kernels (FlashInfer ships them compiled) is not read: evalkit "
        "assumes FA3's E4M3 P",
        approximate=True,
        facts=(
            _SELECTION,
            Fact(
                "FlashInfer quantizes Q to the cache's FP8 dtype on SM 10.x, for prefill and decode "
                "(trtllm-gen); FlashInferImpl.supports_quant_query_input is true there only",
                "vllm/v1/attention/backends/flashinfer.py (FlashInferMetadataBuilder.get_q_data_type, "
                "FlashInferImpl.__init__)",
            ),
            _Q_STATIC,
            Fact("P's precision inside trtllm-gen's FP8 kernels", "compiled cubins (not read)", verified=False),
        ),
    ),
    AttentionPath(
        generations=("ampere", "ada", "blackwell-rtx"),
        kv_cache_dtypes=("fp8", "fp8_e4m3", "fp8_e5m2"),
        backend="FLASHINFER (FA2 kernels)",
        label="K/V",
        in_fp8="K and V only (Q and P stay in the model's dtype)",
        attention=AttentionPrecision.KV,
        facts=(
            _SELECTION,
            _FA_FP8,
            Fact(
                "FlashInfer keeps Q in the model's dtype where only its FA2 kernels run ('Architectures with only "
                "fa2 (e.g. SM89, SM120) cannot consume FP8 queries'), and quantizes no query there",
                "vllm/v1/attention/backends/flashinfer.py (FlashInferMetadataBuilder.get_q_data_type, "
                "FlashInferImpl.__init__)",
            ),
        ),
    ),
    AttentionPath(
        generations=("hopper",),
        kv_cache_dtypes=("fp8_e5m2",),
        backend="FLASHINFER",
        label="K/V",
        in_fp8="K, V (E5M2) and, at prefill, Q",
        attention=AttentionPrecision.KV,
        unmodeled="FlashInfer's SM 9.0 prefill quantizes Q to FP8 (its decode keeps the model's dtype); that Q "
        "rounding is not modeled (evalkit's +attn=fa3 is E4M3 over an E4M3 cache)",
        approximate=True,
        facts=(
            _SELECTION,
            _FA_FP8,
            Fact(
                "on SM 9.0 FlashInfer plans its prefill with Q in the cache's FP8 dtype and its decode with Q in the "
                "model's dtype; maybe_quant_query rounds the prefill's Q with scaled_fp8_quant at layer._q_scale",
                "vllm/v1/attention/backends/flashinfer.py (FlashInferMetadataBuilder.get_q_data_type, "
                "FlashInferImpl.maybe_quant_query); vllm/_custom_ops.py (scaled_fp8_quant)",
            ),
        ),
    ),
)
