"""SGLang's own cache types as a codec family: ``sglang:mxfp8`` (SGLang 0.5.23's ``--kv-cache-dtype mxfp8``).

Why a family and not a named scheme: SGLang's MXFP8 differs from OCP MX's (``mxfp8_e4m3``: exponent
``floor(log2(amax)) - 8``) in its scale rule (``ceil(log2(amax / 448))``, the amax floor 1e-30, the byte clamp
[0, 254]; :mod:`.mxfp8`), and its attention reads Q quantized the same way, which a codec family declares
(:meth:`SglangFamily.query_rounding`). A slot codec (:mod:`evalkit.kv.codecs.slot`): each (token, head) side
stores its ``head_dim`` E4M3 codes then its ``head_dim / 32`` UE8M0 bytes, the bytes SGLang keeps per token and
head (codes in the K/V buffers, scales in its separate scale buffers).

Where it applies (:meth:`SglangFamily.check_layout`): standard (MHA/GQA) attention with head sizes that are
multiples of 32 (the kernel asserts ``D % 32 == 0``); SGLang runs it on the FA4 backend (Blackwell) only.
MLA models are refused in one line.
"""

from __future__ import annotations

import torch

from evalkit.errors import SchemeError
from evalkit.kv.codec import register_family
from evalkit.kv.codecs.sglang import mxfp8
from evalkit.kv.codecs.slot import Codec, SlotFamily, packed
from evalkit.kv.formats import CodecRecipe, ScaleDType
from evalkit.kv.scheme import Granularity, GranularityKind, Scheme


def _encode(x: torch.Tensor, role: str = "k"):
    codes, sb = mxfp8.encode(x)
    stored = torch.cat([codes.view(torch.uint8), sb], dim=-1)
    nonfinite = ~torch.isfinite(x.float()).all()
    return packed(codes.float(), stored, mxfp8.decode(codes, sb), nonfinite)


def _decode(stored: torch.Tensor, role: str, dim: int) -> torch.Tensor:
    codes = stored[..., :dim].contiguous().view(torch.float8_e4m3fn)
    return mxfp8.decode(codes, stored[..., dim:])


def _width(role: str, dim: int) -> int:
    return dim + dim // mxfp8.BLOCK


def _check_head_size(d: int) -> None:
    if d % mxfp8.BLOCK:
        raise SchemeError(
            f"sglang:mxfp8 needs head_dim % {mxfp8.BLOCK} == 0 (SGLang's quant_store_kv_mxfp8 asserts it), "
            f"this model's is {d}: use mxfp8_e4m3 or another scheme"
        )


MXFP8 = Codec(
    name="mxfp8",
    recipe=CodecRecipe("sglang_mxfp8"),
    format="fp8_e4m3",
    granularity=Granularity(GranularityKind.GROUP, mxfp8.BLOCK),
    scale_dtype=ScaleDType.E8M0,
    encode=_encode,
    decode=_decode,
    width=_width,
    check_head_size=_check_head_size,
    roles_alike=True,
)


class SglangFamily(SlotFamily):
    prefix = "sglang"
    engine = "SGLang"
    grammar = "sglang:<kv_cache_dtype>[+skip=...] (mxfp8: FA4's MXFP8 cache, Q quantized alike)"
    own_attention = "SGLang's FA4 attention, which reads Q quantized to MXFP8"
    numerics_version = 0

    def __init__(self):
        super().__init__((MXFP8,))

    def parse(self, name: str, options: dict) -> Scheme:
        codec = self.by_name(name)
        if codec is None:
            raise SchemeError(
                f"sglang:{name} is not modelled as an SGLang codec: use sglang:mxfp8 (SGLang's fp8_e4m3/fp8_e5m2 are "
                "fp8_e4m3/tensor/unit, fp8_e5m2/tensor/unit; fp4_mx_block16 is sglang_fp4)"
            )
        return self.scheme(codec, options)

    def check_layout(self, scheme: Scheme, is_mla: bool, head_dims: tuple[int, ...]) -> None:
        if is_mla:
            raise SchemeError(
                "sglang:mxfp8 models SGLang's MHA pool on the FA4 backend; multi-head latent attention is not "
                "modelled: use a generic scheme for this model"
            )
        for d in head_dims:
            _check_head_size(d)

    def query_rounding(self, scheme: Scheme):
        """Q as SGLang's FA4 attention reads it under mxfp8: quantized to MXFP8 by the same rule, then its
        block scales applied (:func:`.mxfp8.round_query`)."""
        return mxfp8.round_query


FAMILY = register_family(SglangFamily())
