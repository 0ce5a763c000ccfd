"""vLLM's DeepSeek MLA cache rows ``--kv-cache-dtype fp8_ds_mla`` and ``nvfp4_ds_mla``, modelled on
the store that vLLM 0.32 runs for them.

Read in vLLM 0.32: the row layouts in ``vllm/v1/attention/backends/mla/flashmla_sparse.py`` (the
``FlashMLASparseBackend`` docstring: the only backend listing either dtype; DeepSeek V3.2 geometry,
512 NoPE + 64 RoPE values, ``nvfp4_ds_mla`` on SM100 only) and the writer DeepSeek V3.2 runs,
``vllm/models/deepseek_v32/common/kernels.py`` ``_fused_norm_rope_kernel`` (Triton; the branches
``MLA_CACHE_DS_MLA`` and ``MLA_CACHE_NVFP4``, "kept in lockstep" with the CUDA writers of
``csrc/cache_kernels.cu``, ``concat_and_cache_ds_mla_kernel`` / ``concat_and_cache_nvfp4_ds_mla``,
which vLLM calls through ``ops.concat_and_cache_mla`` for HiSparse and PCP: CUDA C++, not in the
wheel). All arithmetic float32, one token's latent at a time:

``fp8_ds_mla``, 656 bytes per token (latent side 528, RoPE side 128):
    per tile of 128 latent values, ``s = max(amax * float32(1/448), 1e-4)`` snapped up to a power of
    two ``2**ceil(log2 s)``; codes ``e4m3(x / s)`` (exact division, then the store's RNE satfinite
    cast; ``amax / s`` exceeds 448 only by the product's rounding, which the cast holds at 448); row bytes ``[0, 512)`` codes, ``[512, 528)``
    the four float32 scales (little-endian), ``[528, 656)`` the 64 RoPE values as bf16. The public
    ``concat_and_cache_ds_mla_kernel`` read elsewhere stores the raw ``max(amax / 448, FLT_MIN)``
    instead; vLLM 0.32's csrc is not in the wheel, so the Triton writer it ships is the one modelled.
``nvfp4_ds_mla``, 352 bytes per token (latent side 288, RoPE side 64):
    per group of 16, ``sf = e4m3(max(amax * float32(1/6), 2**-9))`` (RNE satfinite, at most 448;
    no per-layer global scale on this path), elements ``x * (1 / sf)`` cast by
    ``cvt.rn.satfinite.e2m1x2.f32`` (nearest even, saturating at 6), two per byte, the even element
    in the low nibble; the RoPE values ``e4m3(x)`` unscaled. Row bytes ``[0, 256)`` codes, ``[256,
    320)`` RoPE, ``[320, 352)`` the 32 scales permuted: scale ``s`` at byte ``8 * (s & 3) + (s >> 2)``.

evalkit's MLA store keeps the latent (role ``k``) and the RoPE key (role ``v``) apart, so each side
holds its part of the row: fp8_ds_mla's row is latent bytes + RoPE bytes, nvfp4_ds_mla's is latent
codes, RoPE bytes, latent scales (:func:`row`). What attention reads is ``code * scale`` (exact in
float32 and bf16: few significant bits times a power of two or an E4M3 scale).

The dense MLA backends that take ``fp8`` / ``fp8_e4m3`` (FLASHMLA, CUTLASS_MLA, FLASHINFER_MLA,
TRITON_MLA, TOKENSPEED_MLA; ROCM_AITER_MLA and AITER_TRITON_MLA also ``fp8_e5m2``) store neither row:
they inherit ``MLAAttentionImpl.do_kv_cache_update`` (``vllm/v1/attention/backend.py``), i.e.
``ops.concat_and_cache_mla(kv_c, k_pe, ..., scale=layer._k_scale)`` -> ``concat_and_cache_mla_kernel``:
one 576-wide E4M3 entry, every value ``x / k_scale`` (one scale for latent and RoPE key, 1.0 without
checkpoint scales), RNE satfinite. ``vllm:fp8`` (``fp8_e4m3/tensor/unit``) stores exactly those 576
bytes on an MLA model (tested). FLASHMLA_SPARSE turns ``fp8`` into ``fp8_ds_mla``; CPU_MLA, AMX_MLA
and FLASH_ATTN_MLA take 16-bit caches only.

Approximate, and why: the Triton writer quantizes the RMS-normed latent in float32 registers, while
evalkit receives it in the model's dtype (equal for a float32 model; a bf16 model's latent is
rounded once more). ``tl.math.log2`` / ``exp2`` on a GPU and Triton's default float32 division
(``1.0 / sf``) are the hardware's approximate instructions; here they are exact, so a scale within
rounding of a power of two, or an element within an ulp of an E2M1 midpoint, may land on the
neighbouring value there. FP8/FP4 casts follow ``cvt.rn.satfinite`` (tested against an exhaustive
nearest-even search).
"""

from __future__ import annotations

import torch

from evalkit.errors import SchemeError
from evalkit.kv import packing
from evalkit.kv.codecs.slot import Codec, packed
from evalkit.kv.formats import CodecRecipe, ScaleDType
from evalkit.kv.microscaling import code_to_e2m1, e2m1_to_code, pack_fp4, round_to_e2m1, unpack_fp4
from evalkit.kv.scheme import Granularity, GranularityKind

LATENT, ROPE = 512, 64  # DeepSeek V3.2 geometry: kv_lora_rank, qk_rope_head_dim (the writer asserts 512)
E4M3_MAX = 448.0
FP8_TILE, FP8_SCALE_FLOOR = 128, 1e-4
FP4_GROUP, FP4_SCALE_FLOOR = 16, 2.0**-9
FP8_ROW, NVFP4_ROW = 656, 352


def e4m3(y: torch.Tensor) -> torch.Tensor:
    """float32 -> float8_e4m3fn as ``cvt.rn.satfinite``: nearest even, beyond +-448 saturates, NaN stays NaN."""
    return y.to(torch.float32).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def pow2_ceil(s: torch.Tensor) -> torch.Tensor:
    """``2**ceil(log2 s)`` for positive float32 s, exactly (from the exponent bits, not a float log2)."""
    m, e = torch.frexp(s)  # s = m * 2**e, 0.5 <= m < 1
    return torch.ldexp(torch.ones_like(s), e - (m == 0.5).to(e.dtype))


def _const(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=like.device)  # a Python constant as Triton folds it


# -- fp8_ds_mla ----------------------------------------------------------------------------------
def fp8_tiles(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Latent (..., 512) -> (E4M3 codes (..., 512), power-of-two float32 tile scales (..., 4))."""
    t = x.float().reshape(*x.shape[:-1], LATENT // FP8_TILE, FP8_TILE)
    amax = t.abs().amax(dim=-1, keepdim=True)
    s = pow2_ceil(torch.clamp_min(amax * _const(1.0 / E4M3_MAX, t), FP8_SCALE_FLOOR))
    return e4m3(t / s).reshape(x.shape), s.squeeze(-1)


def _fp8_encode(x: torch.Tensor, role: str = "k"):
    xf = x.float()
    if role == "v":  # the RoPE tail: bf16, not quantized
        rope = x.to(torch.bfloat16)
        return packed(rope.float(), rope.contiguous().view(torch.uint8), rope.float(), ~torch.isfinite(xf).all())
    codes, s = fp8_tiles(x)
    stored = torch.cat([codes.view(torch.uint8), packing.float32_bytes(s)], dim=-1)
    return packed(codes.float(), stored, _fp8_values(codes, s), ~torch.isfinite(xf).all())


def _fp8_values(codes: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    t = codes.float().reshape(*codes.shape[:-1], -1, FP8_TILE) * s[..., None]
    return t.reshape(codes.shape)


def _fp8_decode(stored: torch.Tensor, role: str, dim: int) -> torch.Tensor:
    if role == "v":
        return stored.contiguous().view(torch.bfloat16).float()
    codes = stored[..., :LATENT].contiguous().view(torch.float8_e4m3fn)
    return _fp8_values(codes, packing.bytes_float32(stored[..., LATENT:]))


def _fp8_width(role: str, dim: int) -> int:
    return 2 * dim if role == "v" else dim + 4 * (dim // FP8_TILE)


# -- nvfp4_ds_mla --------------------------------------------------------------------------------
SCALE_BYTE = [8 * (s & 3) + (s >> 2) for s in range(LATENT // FP4_GROUP)]  # where group s's scale is stored


def fp4_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Latent (..., 512) -> (E2M1 values (..., 512) float32, E4M3 group scales (..., 32) float32)."""
    g = x.float().reshape(*x.shape[:-1], LATENT // FP4_GROUP, FP4_GROUP)
    amax = g.abs().amax(dim=-1, keepdim=True)
    sf = e4m3(torch.clamp_min(amax * _const(1.0 / 6.0, g), FP4_SCALE_FLOOR)).float()
    q = round_to_e2m1(g * (torch.ones_like(sf) / sf))
    return q.reshape(x.shape), sf.squeeze(-1)


def _permute(scales: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(scales)
    out[..., SCALE_BYTE] = scales
    return out


def _nvfp4_encode(x: torch.Tensor, role: str = "k"):
    xf = x.float()
    if role == "v":  # the RoPE tail: E4M3, unscaled
        rope = e4m3(xf)
        return packed(rope.float(), rope.view(torch.uint8), rope.float(), ~torch.isfinite(xf).all())
    q, sf = fp4_groups(x)
    sf_bytes = sf.to(torch.float8_e4m3fn).view(torch.uint8)  # exact: sf is already an E4M3 value
    stored = torch.cat([pack_fp4(e2m1_to_code(q, check=False)), _permute(sf_bytes)], dim=-1)
    return packed(q, stored, _nvfp4_values(q, sf), ~torch.isfinite(xf).all())


def _nvfp4_values(q: torch.Tensor, sf: torch.Tensor) -> torch.Tensor:
    g = q.reshape(*q.shape[:-1], -1, FP4_GROUP) * sf[..., None]
    return g.reshape(q.shape)


def _nvfp4_decode(stored: torch.Tensor, role: str, dim: int) -> torch.Tensor:
    if role == "v":
        return stored.contiguous().view(torch.float8_e4m3fn).float()
    q = code_to_e2m1(unpack_fp4(stored[..., : LATENT // 2]))
    sf = stored[..., LATENT // 2 :][..., SCALE_BYTE].contiguous().view(torch.float8_e4m3fn).float()
    return _nvfp4_values(q, sf)


def _nvfp4_width(role: str, dim: int) -> int:
    return dim if role == "v" else dim // 2 + dim // FP4_GROUP


def row(name: str, latent_bytes: torch.Tensor, rope_bytes: torch.Tensor) -> torch.Tensor:
    """vLLM's row (..., 656 or 352) from the bytes evalkit's latent and RoPE stores hold."""
    if name == "fp8_ds_mla":
        return torch.cat([latent_bytes, rope_bytes], dim=-1)
    return torch.cat([latent_bytes[..., : LATENT // 2], rope_bytes, latent_bytes[..., LATENT // 2 :]], dim=-1)


# -- where they apply ----------------------------------------------------------------------------
def check_layout(name: str, is_mla: bool, dims: tuple[int, ...], rope_bf16: bool = False) -> None:
    """Refuse, in one line, an MLA row dtype on a model vLLM would not store it for."""
    if not is_mla:
        raise SchemeError(
            f"vllm:{name} is a DeepSeek MLA cache row (FlashMLA sparse backend); it does not apply to standard "
            "attention K/V: use vllm:fp8 or a per-token-head dtype (vllm:fp8_per_token_head) for this model"
        )
    if tuple(dims) != (LATENT, ROPE):
        raise SchemeError(
            f"vllm:{name} stores DeepSeek V3.2's {LATENT}-value latent and {ROPE}-value RoPE key (its writer asserts "
            f"kv_lora_rank == {LATENT}), not {dims[0]} + {dims[1]}: use vllm:fp8 (a per-tensor latent) for this model"
        )
    if rope_bf16:
        raise SchemeError(f"vllm:{name} fixes how the RoPE key is stored: drop +rope=bf16")


def _no_head_size(d: int) -> None:  # MLA rows are checked by check_layout (latent and RoPE widths)
    return None


CODECS = (
    Codec(
        name="fp8_ds_mla",
        recipe=CodecRecipe("vllm_fp8_ds_mla"),
        format="fp8_e4m3",
        granularity=Granularity(GranularityKind.GROUP, FP8_TILE),
        encode=_fp8_encode,
        decode=_fp8_decode,
        width=_fp8_width,
        check_head_size=_no_head_size,
        mla=True,
    ),
    Codec(
        name="nvfp4_ds_mla",
        recipe=CodecRecipe("vllm_nvfp4_ds_mla"),
        format="fp4_e2m1",
        granularity=Granularity(GranularityKind.GROUP, FP4_GROUP),
        scale_dtype=ScaleDType.E4M3,
        encode=_nvfp4_encode,
        decode=_nvfp4_decode,
        width=_nvfp4_width,
        check_head_size=_no_head_size,
        mla=True,
    ),
)
