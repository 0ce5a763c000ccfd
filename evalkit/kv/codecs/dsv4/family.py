"""The DeepSeek V4 / V4.1 cache records as a codec family: ``dsv4:fp8_ds_mla`` (V4, 584 B per token and
layer) and ``dsv4:fp8_ds_mla_v41`` (V4.1, 528 B).

Both are what vLLM's ``--kv-cache-dtype fp8_ds_mla`` (or ``auto`` / ``fp8``, which the packed DeepSeek V4
backends resolve to it) stores on a DeepSeek V4 model; they are a family of their own rather than
``vllm:<dtype>`` because the record follows the model, not the dtype name (``vllm:fp8_ds_mla`` is DeepSeek
V3.2's 656-byte row). The arithmetic, the rows and the pages per vLLM version are
:mod:`evalkit.kv.codecs.dsv4.records`. They apply to a DeepSeek V4 layout only (448 NoPE + 64 RoPE values
per token, :func:`evalkit.models.info.kv_layout`), refused elsewhere in one line.
"""

from __future__ import annotations

import torch

from evalkit.kv.codec import register_family
from evalkit.kv.codecs.dsv4 import records
from evalkit.kv.codecs.dsv4.records import V4_BLOCK, V41_BLOCK, decode_blocks, encode_blocks
from evalkit.kv.codecs.slot import Codec, SlotFamily, packed
from evalkit.kv.formats import CodecRecipe, ScaleDType
from evalkit.kv.scheme import Granularity, GranularityKind, Scheme


def _nonfinite(x: torch.Tensor) -> torch.Tensor:
    return ~torch.isfinite(x.float()).all()


# -- V4: 448 E4M3 (UE8M0 per 64) + pad | 64 bf16 RoPE values -----------------------------------------
def _v4_encode(x: torch.Tensor, role: str = "k"):
    if role == "v":  # the RoPE tail: bf16, not quantized
        rope = x.to(torch.bfloat16)
        return packed(rope.float(), rope.contiguous().view(torch.uint8), rope.float(), _nonfinite(x))
    codes, scales = encode_blocks(x, V4_BLOCK, by_reciprocal=False)
    pad = scales.new_zeros(*scales.shape[:-1], 1)
    stored = torch.cat([codes.view(torch.uint8), scales, pad], dim=-1)
    return packed(codes.float(), stored, decode_blocks(codes, scales, V4_BLOCK), _nonfinite(x))


def _v4_decode(stored: torch.Tensor, role: str, dim: int) -> torch.Tensor:
    if role == "v":
        return stored.contiguous().view(torch.bfloat16).float()
    codes = stored[..., :dim].contiguous().view(torch.float8_e4m3fn)
    return decode_blocks(codes, stored[..., dim : dim + dim // V4_BLOCK], V4_BLOCK)


def _v4_width(role: str, dim: int) -> int:
    return 2 * dim if role == "v" else dim + dim // V4_BLOCK + 1  # codes, scales, the pad byte


# -- V4.1: every value E4M3 with a UE8M0 scale per 32 (MXFP8-like) ------------------------------------
def _v41_encode(x: torch.Tensor, role: str = "k"):
    codes, scales = encode_blocks(x, V41_BLOCK, by_reciprocal=True)
    stored = torch.cat([codes.view(torch.uint8), scales], dim=-1)
    return packed(codes.float(), stored, decode_blocks(codes, scales, V41_BLOCK), _nonfinite(x))


def _v41_decode(stored: torch.Tensor, role: str, dim: int) -> torch.Tensor:
    codes = stored[..., :dim].contiguous().view(torch.float8_e4m3fn)
    return decode_blocks(codes, stored[..., dim:], V41_BLOCK)


def _v41_width(role: str, dim: int) -> int:
    return dim + dim // V41_BLOCK


def _no_head_size(d: int) -> None:  # the records are checked by records.check_layout (NoPE and RoPE widths)
    return None


CODECS = (
    Codec(
        name="fp8_ds_mla",
        recipe=CodecRecipe("dsv4_fp8_ds_mla"),
        format="fp8_e4m3",
        granularity=Granularity(GranularityKind.GROUP, V4_BLOCK),
        scale_dtype=ScaleDType.E8M0,
        encode=_v4_encode,
        decode=_v4_decode,
        width=_v4_width,
        check_head_size=_no_head_size,
        mla=True,
    ),
    Codec(
        name="fp8_ds_mla_v41",
        recipe=CodecRecipe("dsv4_fp8_ds_mla_v41"),
        format="fp8_e4m3",
        granularity=Granularity(GranularityKind.GROUP, V41_BLOCK),
        scale_dtype=ScaleDType.E8M0,
        encode=_v41_encode,
        decode=_v41_decode,
        width=_v41_width,
        check_head_size=_no_head_size,
        mla=True,
    ),
)


class DeepSeekV4Family(SlotFamily):
    prefix = "dsv4"
    engine = "vLLM (DeepSeek V4 records)"
    grammar = "dsv4:<record> (fp8_ds_mla: V4, 584 B; fp8_ds_mla_v41: V4.1, 528 B)"
    numerics_version = 0

    def __init__(self):
        super().__init__(CODECS)

    def parse(self, name: str, options: dict) -> Scheme:
        from evalkit.errors import SchemeError

        codec = self.by_name(name)
        if codec is None:
            raise SchemeError(f"dsv4:{name} is not a DeepSeek V4 record: use dsv4:fp8_ds_mla or dsv4:fp8_ds_mla_v41")
        return self.scheme(codec, options)

    def cache_type(self, scheme: Scheme) -> str:
        """vLLM's ``kv_cache_dtype`` for either record: ``fp8_ds_mla`` (on a V4 model it stores these records)."""
        return "fp8_ds_mla"

    def check_layout(self, scheme: Scheme, is_mla: bool, head_dims: tuple[int, ...]) -> None:
        records.check_layout(self.codecs[scheme.recipe].name, is_mla, head_dims, scheme.rope_bf16)


FAMILY = register_family(DeepSeekV4Family())
