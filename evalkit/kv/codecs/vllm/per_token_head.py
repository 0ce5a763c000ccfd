"""vLLM's per-token-head INT8 and FP8 KV cache (``--kv-cache-dtype int8_per_token_head`` /
``fp8_per_token_head``), modelled on its store kernel.

Read in vLLM 0.32, ``vllm/v1/attention/ops/triton_reshape_and_cache_flash.py``,
``_reshape_cache_per_token_head`` (one Triton program per token and KV head; K and V alike), all in
float32:

1. ``scale = max(amax / QMAX, 1e-6)`` in the source: amax over the head's ``head_size`` values (the
   padding lanes load 0), QMAX 127 for INT8 and 448 for FP8 (``get_fp8_min_max()`` on CUDA: E4M3
   ``fn``); one float32 scale per (slot, head), stored beside the codes. Compiled for an NVIDIA GPU,
   Triton's float32 ``/`` is ``div.full.f32`` (a reciprocal and a multiply), and the scale the kernel
   stores is ``fl(amax * fl(1/QMAX))``: measured on an H200 (vLLM 0.32, Triton 3.6), 1,024 of 1,024
   scales for K and for V in both dtypes, where the IEEE quotient ``fl(amax / QMAX)`` matched 971
   (INT8) and 462 (FP8). evalkit computes that product on every device
   (:func:`evalkit.kv.device_exact.times_reciprocal`); Triton's CPU interpreter divides (numpy), so
   its scales are the IEEE quotient and differ from these in the last bit (docs/vllm-dtypes.md).
2. ``y = x * (1 / scale)``: a reciprocal, then a multiply (not ``x / scale``: the two differ in the
   last bit for some values, and so, at a rounding boundary, in the code).
3. INT8: ``y = y + 0.5`` where ``y >= 0`` else ``y - 0.5`` (float32 additions, which round), clamp
   to [-128, 127], then the int8 store truncates toward zero. This is "half away from zero" except
   where the float32 addition itself rounds up (e.g. ``0.49999997 + 0.5 == 1.0``): modelled as the
   kernel computes it, so those codes match too.
4. FP8: clamp to [-448, 448]; the float32 -> float8e4nv store converts (on NVIDIA GPUs
   ``cvt.rn.satfinite``: round to nearest even, saturating), modelled by torch's cast, which rounds
   to nearest even.

Dequantization (what attention reads) is ``code * scale``. There is no frozen scale and nothing
depends on other tokens, so prefill and decode store a token alike. Bytes per token and head:
``head_size`` codes plus one float32 scale, for K and for V (vLLM's ``TritonAttentionBackend.
customize_spec``: ``(hs_k + hs_v) * 1 + 2 * 4``). The scheme names are ``vllm:int8_per_token_head``
and ``vllm:fp8_per_token_head`` (:mod:`evalkit.kv.codecs.vllm.family`).
"""

from __future__ import annotations

import torch

from evalkit.errors import SchemeError
from evalkit.kv.device_exact import times_reciprocal
from evalkit.kv.formats import CodecRecipe, FormatKind, KVFormat
from evalkit.kv.quantize import Quantized
from evalkit.kv.scheme import Granularity, GranularityKind

RECIPE = CodecRecipe("vllm_per_token_head")  # +recipe=vllm_per_token_head: int8 or fp8_e4m3, token/dynamic
DTYPES = {"int8_per_token_head": "int8", "fp8_per_token_head": "fp8_e4m3"}  # kv_cache_dtype -> evalkit format
SCALE_MIN = 1e-6  # the kernel's floor on each scale (a float32 constant there, as here)
INT8_RANGE = (-128.0, 127.0)  # _PER_TOKEN_HEAD_QUANT_PARAMS[torch.int8]
INT8_QMAX = 127.0
MIN_HEAD_SIZE = 32  # TritonAttentionBackend.supports_head_size: head_size >= 32
TOKEN = Granularity(GranularityKind.TOKEN)


def check_head_size(head_size: int) -> None:
    """vLLM runs per-token-head dtypes on its Triton attention backend only, which needs head_size >= 32."""
    if head_size < MIN_HEAD_SIZE:
        raise SchemeError(
            f"vLLM's per-token-head KV dtypes run on its Triton attention backend, which needs head_size >= "
            f"{MIN_HEAD_SIZE}, not {head_size}: use a per-tensor FP8 dtype (vllm:fp8) for this model"
        )


def qmax(fmt: KVFormat) -> float:
    return INT8_QMAX if fmt.kind is FormatKind.INT else fmt.max


def scales(x: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """The compiled kernel's float32 scale per token and head, ``max(fl(amax * fl(1/QMAX)), 1e-6)``,
    shape (..., 1): the same bits on every device."""
    amax = x.float().abs().amax(dim=-1, keepdim=True)
    return torch.clamp_min(times_reciprocal(amax, qmax(fmt)), SCALE_MIN)


def codes_from_scaled(y: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """``y = x * (1 / scale)`` (float32) -> the stored codes as float32 values (steps 3 and 4)."""
    if fmt.kind is FormatKind.INT:
        y = torch.where(y >= 0, y + 0.5, y - 0.5)
        return torch.trunc(y.clamp(*INT8_RANGE))
    return y.clamp(-fmt.max, fmt.max).to(fmt.torch_dtype).to(torch.float32)


def quantize_per_token_head(x: torch.Tensor, fmt: KVFormat) -> Quantized:
    """Quantize K or V (B, H, S, D) as vLLM's per-token-head store does (codes float32, scale (B, H, S, 1))."""
    check_head_size(x.shape[-1])
    xf = x.float()
    scale = scales(xf, fmt)
    y = xf * (torch.ones_like(scale) / scale)
    codes = codes_from_scaled(y, fmt)
    stored = codes.to(fmt.torch_dtype)
    return Quantized(codes, scale, None, TOKEN, ~torch.isfinite(scale).all(), stored=stored)
