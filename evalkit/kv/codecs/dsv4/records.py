"""DeepSeek V4 and V4.1 cache records as vLLM stores them (``--kv-cache-dtype fp8_ds_mla``, or ``auto`` /
``fp8``, on a ``deepseek_v4`` / ``deepseek_v41`` model), and their pages per vLLM version.

A V4 attention layer caches one 512-value entry per token, shared by K and V: 448 NoPE values and a
64-value RoPE tail (transformers' ``DeepseekV4Config``: ``head_dim`` 512, ``qk_rope_head_dim`` 64). evalkit's
MLA layout holds it as a 448-value latent (role ``k``) and a 64-value RoPE key (role ``v``). Read in the
vllm 0.32.0 / 0.33.0 / 0.34.0 wheels (line numbers 0.33.0's unless said):

``fp8_ds_mla`` (V4), 584 B per token and layer (``models/deepseek_v4/attention.py:880-882``
``state_content_bytes=584``; ``v1/attention/backends/mla/flashmla_sparse.py:90-98``), written by
``models/deepseek_v4/common/ops/cache_utils.py:43-168`` ``quantize_and_insert_k_kernel``:
    per block of 64 NoPE values ``amax = max(|x|, 1e-4)``, ``exponent = ceil(log2(amax / 448))``, codes
    ``e4m3(clamp(x / 2**exponent, +-448))``, the scale stored as the byte ``exponent + 127`` (UE8M0,
    clamped to [0, 255]); 7 scales and a zero pad byte; the RoPE tail stored as bf16, not quantized.
    Row: ``[0, 448)`` codes, ``[448, 576)`` RoPE bf16, ``[576, 583)`` scales, ``583`` pad.
``fp8_ds_mla_v41`` (V4.1), 528 B (``models/deepseek_v41/common/ops/cache_utils.py:50-53``
``V41_BYTES_PER_TOKEN = 528``, ``V41_QUANT_BLOCK = 32``), written by ``_quantize_and_insert_k_mxfp8_kernel``
(``:185-240``): every one of the 512 values (RoPE included) in blocks of 32, ``amax = max(|x|, 1e-4)``,
``exponent = ceil(log2(amax * fl(1/448)))``, codes ``e4m3(clamp(x * 2**-exponent, +-448))``, the byte
``exponent + 127``. Row: ``[0, 512)`` codes, ``[512, 528)`` the 16 scales in order. A V4.1 model writes it
only on SM 10.x (``models/deepseek_v41/attention.py:131-138`` ``_use_v41_mxfp8_kv_record``); elsewhere it
keeps the V4 record.

Pages (:func:`page`), ``cache_block_size`` tokens each:
- V4, every version: all tokens' 576-byte data rows, then all their 8-byte scale rows
  (``quantize_and_insert_k_kernel``: ``token_scale_ptr = block + cache_block_size * 576 + pos * 8``),
  padded to the decode kernel's 576-byte TMA stride;
- V4.1, vLLM 0.32: all 512-byte data rows, then all 16-byte scale rows (0.32.0's kernel:
  ``token_data_ptr = block + pos * head_dim``, ``token_scale_ptr = block + cache_block_size * head_dim +
  pos * scale_dim``, ``cache_utils.py:213-217``), padded to 512;
- V4.1, vLLM 0.33 and 0.34: interleaved, each token's scales after its own data
  (``token_data_ptr = block + pos * (head_dim + scale_dim)``, ``token_scale_ptr = token_data_ptr +
  head_dim``, 0.33.0 ``cache_utils.py:216-217``, 0.34.0 ``:95-96``), padded to 512.

What attention reads is ``code * 2**(byte - 127)`` (exact in float32). Approximate, and why: the Triton
writers run ``tl.log2`` / ``tl.exp2`` (the GPU's approximate instructions; here the exponent comes from
the float's bits, exactly), and V4's kernel loads the entry in bf16 (evalkit receives it in the model's
dtype: equal for a bf16 model).
"""

from __future__ import annotations

import math

import torch

from evalkit.errors import SchemeError

LATENT, ROPE = 448, 64  # DeepSeek V4 geometry: head_dim 512 = 448 NoPE + 64 RoPE
E4M3_MAX = 448.0
AMAX_FLOOR = 1e-4
V4_BLOCK, V41_BLOCK = 64, 32
V4_ROW, V41_ROW = 584, 528
V4_DATA, V41_DATA = 576, 512  # a row's data part; the scales follow
PAGE_ALIGN = {"fp8_ds_mla": 576, "fp8_ds_mla_v41": 512}
VERSIONS = ("0.32", "0.33", "0.34")


def _e4m3(y: torch.Tensor) -> torch.Tensor:
    return y.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def block_exponents(x: torch.Tensor, block: int, by_reciprocal: bool) -> torch.Tensor:
    """(..., n) -> (..., n / block) int32: ``ceil(log2(max(amax, 1e-4) / 448))`` per block, from the float's bits
    (``by_reciprocal``: ``amax * fl(1/448)`` as V4.1's writer computes it; else ``amax / 448``)."""
    t = x.float().reshape(*x.shape[:-1], x.shape[-1] // block, block)
    amax = torch.clamp_min(t.abs().amax(dim=-1), AMAX_FLOOR)
    if by_reciprocal:  # a Python constant as Triton folds it: fl(1/448), then the product
        s = amax * torch.tensor(1.0 / E4M3_MAX, dtype=torch.float32, device=amax.device)
    else:  # a division by a tensor on the same device (exact IEEE division on CPU and CUDA alike)
        s = amax / torch.tensor(E4M3_MAX, dtype=torch.float32, device=amax.device)
    m, e = torch.frexp(s)  # s = m * 2**e, 0.5 <= m < 1: ceil(log2 s) = e, or e - 1 when s is a power of two
    return (e - (m == 0.5).to(e.dtype)).to(torch.int32)


def encode_blocks(x: torch.Tensor, block: int, by_reciprocal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., n) -> (E4M3 codes (..., n), UE8M0 scale bytes (..., n / block) uint8)."""
    exponent = block_exponents(x, block, by_reciprocal)
    t = x.float().reshape(*x.shape[:-1], -1, block)
    codes = _e4m3(torch.ldexp(t, -exponent[..., None].float())).reshape(x.shape)
    return codes, torch.clamp(exponent + 127, 0, 255).to(torch.uint8)


def decode_blocks(codes: torch.Tensor, scale_bytes: torch.Tensor, block: int) -> torch.Tensor:
    """E4M3 codes (..., n) and UE8M0 bytes (..., n / block) -> float32 ``code * 2**(byte - 127)``."""
    t = codes.float().reshape(*codes.shape[:-1], -1, block)
    return torch.ldexp(t, scale_bytes.to(torch.int32)[..., None].float() - 127).reshape(codes.shape)


def row(name: str, latent_bytes: torch.Tensor, rope_bytes: torch.Tensor) -> torch.Tensor:
    """vLLM's per-token record (..., 584 or 528) from the bytes evalkit's latent and RoPE stores hold."""
    n = latent_bytes.shape[-1]
    if name == "fp8_ds_mla":  # latent side: codes | 7 scales | pad; RoPE side: 128 bytes of bf16
        d = (n - 1) * V4_BLOCK // (V4_BLOCK + 1)
        return torch.cat([latent_bytes[..., :d], rope_bytes, latent_bytes[..., d:]], dim=-1)
    d = n * V41_BLOCK // (V41_BLOCK + 1)  # V4.1: each side codes | scales
    r = rope_bytes.shape[-1] * V41_BLOCK // (V41_BLOCK + 1)
    parts = [latent_bytes[..., :d], rope_bytes[..., :r], latent_bytes[..., d:], rope_bytes[..., r:]]
    return torch.cat(parts, dim=-1)


def layout(name: str, version: str) -> str:
    """``"split"`` (a page's data rows, then its scale rows) or ``"interleaved"`` (each token's scales
    after its own data) for ``name``'s record in vLLM ``version``."""
    if version not in VERSIONS:
        raise SchemeError(f"vLLM {version}: the DeepSeek V4 page layouts are read for {', '.join(VERSIONS)}")
    return "interleaved" if name == "fp8_ds_mla_v41" and version != "0.32" else "split"


def page_bytes(name: str, block_size: int) -> int:
    """One page of ``block_size`` tokens, padded to the decode kernel's stride (the same in every version)."""
    size = block_size * (V4_ROW if name == "fp8_ds_mla" else V41_ROW)
    align = PAGE_ALIGN[name]
    return math.ceil(size / align) * align


def page(name: str, version: str, rows: torch.Tensor) -> torch.Tensor:
    """The page (page_bytes,) uint8 vLLM ``version`` writes for ``rows`` (block_size, row bytes), one per slot."""
    block_size, width = rows.shape
    data = V4_DATA if name == "fp8_ds_mla" else V41_DATA
    if layout(name, version) == "interleaved":
        body = rows.reshape(-1)
    else:
        body = torch.cat([rows[:, :data].reshape(-1), rows[:, data:].reshape(-1)])
    out = torch.zeros(page_bytes(name, block_size), dtype=torch.uint8)
    out[: body.numel()] = body
    return out


def rows_of(name: str, version: str, page_: torch.Tensor, block_size: int) -> torch.Tensor:
    """The rows (block_size, row bytes) read back from a page, by the version's addressing."""
    width = V4_ROW if name == "fp8_ds_mla" else V41_ROW
    data = V4_DATA if name == "fp8_ds_mla" else V41_DATA
    if layout(name, version) == "interleaved":
        return page_[: block_size * width].reshape(block_size, width)
    head = page_[: block_size * data].reshape(block_size, data)
    tail = page_[block_size * data : block_size * width].reshape(block_size, width - data)
    return torch.cat([head, tail], dim=1)


def check_layout(name: str, is_mla: bool, dims: tuple[int, ...], rope_bf16: bool = False) -> None:
    """Refuse, in one line, a V4 record on a model vLLM would not store it for."""
    if not is_mla:
        raise SchemeError(
            f"dsv4:{name} is DeepSeek V4's latent-attention cache record; it does not apply to standard attention "
            "K/V: use vllm:fp8 or a per-token-head dtype (vllm:fp8_per_token_head) for this model"
        )
    if tuple(dims) != (LATENT, ROPE):
        raise SchemeError(
            f"dsv4:{name} stores DeepSeek V4's {LATENT} NoPE + {ROPE} RoPE values (its writer asserts a 512-wide "
            f"entry), not {dims[0]} + {dims[1]}: use vllm:fp8_ds_mla (DeepSeek V3.2's row) or vllm:fp8 for this model"
        )
    if rope_bf16:
        raise SchemeError(f"dsv4:{name} fixes how the RoPE values are stored: drop +rope=bf16")
