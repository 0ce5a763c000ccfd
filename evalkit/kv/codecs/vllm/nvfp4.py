"""vLLM's ``--kv-cache-dtype nvfp4`` and ``nvfp4_4over6`` (standard attention), modelled on the store
kernel, with the layer's ``k_scale`` / ``v_scale`` at 1.0 (what vLLM uses without checkpoint scales).

Read in vLLM 0.32: ``vllm/v1/attention/backends/flashinfer.py`` (``FlashInferBackend``: the only backend
listing them; ``customize_spec`` gives each KV head a K slot and a V slot of ``head_size / 2`` packed
E2M1 bytes plus ``head_size / 16`` E4M3 scale bytes, ``nvfp4_kv_cache_full_dim``;
``do_kv_cache_update`` calls ``torch.ops._C_cache_ops.reshape_and_cache_flash(..., cache_dtype,
layer._k_scale, layer._v_scale)`` on SM100, FlashInfer's ``nvfp4_quantize_append_paged_kv_cache_with_
slot_mapping`` on SM80/90/120, which "has no scale search", so ``nvfp4_4over6`` runs on SM100 only).
The store is CUDA C++, not in the wheel: ``csrc/cache_kernels.cu`` dispatches to
``reshape_and_cache_nvfp4_kernel`` (``nvfp4_kv_cache_kernels.cu``), which calls
``cvt_warp_fp16_to_fp4`` (``nvfp4_utils.cuh``) per group of 16 with ``global = 1 / k_scale``; read in
public copies of those files. Per group, float32:

1. ``SF = global * (amax * rcp(6))``; stored ``e4m3(SF)`` (``__nv_fp8_e4m3``: RNE, satfinite), then
   ``SF = float(e4m3)``;
2. ``out = SF != 0 ? rcp(SF * rcp(global)) : 0``; elements ``e2m1(x * out)`` by
   ``cvt.rn.satfinite.e2m1x2.f32`` (nearest even, saturating at 6), two per byte, even element low;
3. read back as ``code * SF / global`` (FlashInfer folds ``k_scale`` into its scales).

``nvfp4_4over6`` stores the same layout, choosing per 16 values between the ``max/6`` scale above and a
``max/4`` one "by minimizing squared reconstruction error" (``vllm/config/cache.py``; vLLM PR #45187,
"stores the candidate with lower reconstruction error"); its search is in the CUDA store only (FlashInfer's
own 4over6 quantizer defaults to absolute error instead), so evalkit's reading is an assumption: both candidates encoded as above, the
error ``sum((x - code * SF / global)**2)`` in float32, ``max/4`` taken only when strictly smaller (the
sum in a fixed pairwise order, :func:`evalkit.kv.device_exact.tree_sum`, so the choice is the same on
every device; the CUDA store's own order is not read).

Approximate, and why: ``rcp`` is ``rcp.approx.ftz.f32`` on the GPU (exact for powers of two, within
an ulp otherwise); here it is the correctly rounded float32 reciprocal, so an element within an ulp
of an E2M1 midpoint may land on the neighbouring code there. On SM100 the scale bytes of 4 tokens
are interleaved within a page (``swizzle_scale_offset``); evalkit keeps each (token, head) slot's
bytes in order, which moves bytes within a page but not their number. The FP8 query and FP8 output
of the trtllm-gen path are attention precision, not modelled. Head sizes: FlashInfer's 64, 128, 256,
512 (``get_supported_head_sizes``), multiples of 16 as the store checks; vLLM refuses head_size 64
off SM100 ("fa2 prefill misreads an NVFP4 KV cache at head_size 64").
"""

from __future__ import annotations

import functools

import torch

from evalkit.errors import SchemeError
from evalkit.kv.codecs.slot import Codec, packed
from evalkit.kv.device_exact import tree_sum
from evalkit.kv.formats import CodecRecipe, ScaleDType
from evalkit.kv.microscaling import code_to_e2m1, e2m1_to_code, pack_fp4, round_to_e2m1, unpack_fp4
from evalkit.kv.scheme import Granularity, GranularityKind

GROUP = 16
E4M3_MAX = 448.0
HEAD_SIZES = (64, 128, 256, 512)  # FlashInferBackend.get_supported_head_sizes
GLOBAL = 1.0  # 1 / k_scale with vLLM's default k_scale of 1.0


def check_head_size(head_size: int) -> None:
    if head_size not in HEAD_SIZES:
        raise SchemeError(
            f"vLLM stores nvfp4 KV on its FlashInfer backend, which takes head_size {', '.join(map(str, HEAD_SIZES))}, "
            f"not {head_size}: use vllm:fp8 for this model"
        )


def width(role: str, head_size: int) -> int:
    return head_size // 2 + head_size // GROUP


def _global(device) -> torch.Tensor:
    """The global scale as a float32 tensor on the data's device (a divisor, never a Python number)."""
    return _global_on(str(torch.device(device)))


@functools.lru_cache(maxsize=8)
def _global_on(device: str) -> torch.Tensor:
    return torch.tensor(GLOBAL, dtype=torch.float32, device=device)


def _rcp(t: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(t) / t


def _encode_groups(g: torch.Tensor, divisor: float, global_scale: torch.Tensor):
    """Groups (..., 16) float32 -> (E2M1 values, SF as float32 (..., 1)) for scale ``max / divisor``."""
    amax = g.abs().amax(dim=-1, keepdim=True)
    sf_value = global_scale * (amax * _rcp(torch.tensor(divisor, dtype=torch.float32, device=g.device)))
    sf = sf_value.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn).float()  # satfinite; SF >= 0
    out = torch.where(sf != 0, _rcp(sf * _rcp(global_scale)), torch.zeros_like(sf))
    return round_to_e2m1(g * out), sf


def _values(q: torch.Tensor, sf: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    return q * (sf / global_scale)


def quantize_groups(x: torch.Tensor, four_over_six: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """K or V (..., D) -> (E2M1 values (..., D), E4M3 group scales (..., D / 16)) as float32."""
    g = x.float().reshape(*x.shape[:-1], -1, GROUP)
    global_scale = _global(x.device)
    q, sf = _encode_groups(g, 6.0, global_scale)
    if four_over_six:
        q4, sf4 = _encode_groups(g, 4.0, global_scale)
        err6 = tree_sum((g - _values(q, sf, global_scale)).square(), keepdim=True)
        err4 = tree_sum((g - _values(q4, sf4, global_scale)).square(), keepdim=True)
        take4 = err4 < err6
        q, sf = torch.where(take4, q4, q), torch.where(take4, sf4, sf)
    return q.reshape(x.shape), sf.squeeze(-1)


def _encoder(four_over_six: bool):
    def encode(x: torch.Tensor, role: str = "k"):
        check_head_size(x.shape[-1])
        q, sf = quantize_groups(x, four_over_six)
        stored = torch.cat(
            [pack_fp4(e2m1_to_code(q, check=False)), sf.to(torch.float8_e4m3fn).view(torch.uint8)], dim=-1
        )
        values = _values(q.reshape(*q.shape[:-1], -1, GROUP), sf[..., None], _global(x.device)).reshape(q.shape)
        return packed(q, stored, values, ~torch.isfinite(x.float()).all())

    return encode


def decode(stored: torch.Tensor, role: str, head_size: int) -> torch.Tensor:
    q = code_to_e2m1(unpack_fp4(stored[..., : head_size // 2]))
    sf = stored[..., head_size // 2 :].contiguous().view(torch.float8_e4m3fn).float()
    return _values(q.reshape(*q.shape[:-1], -1, GROUP), sf[..., None], _global(stored.device)).reshape(q.shape)


CODECS = tuple(
    Codec(
        name=name,
        recipe=recipe,
        format="fp4_e2m1",
        granularity=Granularity(GranularityKind.GROUP, GROUP),
        scale_dtype=ScaleDType.E4M3,
        encode=_encoder(name == "nvfp4_4over6"),
        decode=decode,
        width=width,
        check_head_size=check_head_size,
        roles_alike=True,  # unit k_scale and v_scale: K and V by the same arithmetic
    )
    for name, recipe in (("nvfp4", CodecRecipe("vllm_nvfp4")), ("nvfp4_4over6", CodecRecipe("vllm_nvfp4_4over6")))
)
