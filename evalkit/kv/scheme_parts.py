"""The parts a KV scheme is made of: its granularity (which elements share one scale), its scale source,
its attention precision, and ``skip=sliding``.

Small values of their own, so the codec families (:mod:`evalkit.kv.codecs`), the quantizer and the
scheme grammar (:mod:`evalkit.kv.scheme`) name them without the grammar; each refuses a bad value in
one line (:class:`~evalkit.errors.SchemeError`).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from evalkit.errors import SchemeError


class GranularityKind(str, enum.Enum):
    TENSOR = "tensor"
    HEAD = "head"
    BLOCK = "block"
    TOKEN = "token"
    GROUP = "group"


GRANULARITY_HELP = {
    GranularityKind.TENSOR: "one scale per layer for K and one for V (the engines' default)",
    GranularityKind.HEAD: "one scale per KV head per layer (vLLM 'attn_head')",
    GranularityKind.BLOCK: "one scale per KV head per block of N tokens, like a paged-KV block (block = block16)",
    GranularityKind.TOKEN: "one scale per token per KV head (reference; KIVI's value quantization)",
    GranularityKind.GROUP: "one scale per N channels of head_dim per token per head (MX/NVFP4 blocks; INT4 reference)",
}


class ScaleSource(str, enum.Enum):
    DYNAMIC = "dynamic"
    STATIC = "static"
    UNIT = "unit"


SCALE_HELP = {
    ScaleSource.DYNAMIC: "computed from the values being stored (amax / format max)",
    ScaleSource.STATIC: "a calibrated per-layer or per-layer-per-head table loaded from a file (+scales=PATH)",
    ScaleSource.UNIT: "1.0: what engines silently use when a checkpoint carries no scale",
}


class AttentionPrecision(str, enum.Enum):
    KV = "kv"
    FA3 = "fa3"  # Q and P in FP8, the products accumulated exactly (float32)
    FA3_ACC1 = "fa3:acc1"  # and the FP8 tensor cores' accumulation over the whole key length (one level)
    FA3_ACC2 = "fa3:acc2"  # and one key tile in the tensor cores, promoted to float32 per tile (two level)

    @property
    def is_fa3(self) -> bool:
        """FlashAttention-3's FP8 path, with or without its accumulation modelled (:mod:`evalkit.integration.fa3`)."""
        return self is not AttentionPrecision.KV


@dataclass(frozen=True)
class Granularity:
    kind: GranularityKind
    size: int = 0  # block length in tokens, or group width in channels

    def __post_init__(self):
        sized = self.kind in (GranularityKind.BLOCK, GranularityKind.GROUP)
        if sized and self.size <= 0:
            raise SchemeError(
                f"{self.kind.value} size must be a positive integer, got {self.size}: write e.g. {self.kind.value}16"
            )
        if not sized and self.size:
            raise SchemeError(f"granularity {self.kind.value!r} takes no size")

    def __str__(self) -> str:
        return f"{self.kind.value}{self.size}" if self.size else self.kind.value

    @classmethod
    def parse(cls, text: str) -> Granularity:
        m = re.fullmatch(r"([a-z]+)(-?\d+)?", text.strip())
        kinds = ", ".join(
            k.value + ("<N>" if k in (GranularityKind.BLOCK, GranularityKind.GROUP) else "") for k in GranularityKind
        )
        if not m:
            raise SchemeError(f"unknown granularity {text!r}: use one of {kinds}")
        name, size = m.group(1), m.group(2)
        try:
            kind = GranularityKind(name)
        except ValueError:
            raise SchemeError(f"unknown granularity {text!r}: use one of {kinds}") from None
        if kind is GranularityKind.BLOCK and size is None:
            return cls(kind, 16)
        if kind is GranularityKind.GROUP and size is None:
            raise SchemeError("group needs a width in channels: write e.g. group32")
        return cls(kind, int(size) if size is not None else 0)


SLIDING = "sliding"
