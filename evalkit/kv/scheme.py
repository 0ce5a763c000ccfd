"""KV schemes: what is stored, at which granularity, with which scales.

A :class:`Scheme` is a small frozen value with one canonical string form that parses back to the
same value::

    FORMAT/GRANULARITY/SCALES[+option=value...]

    bf16                              unquantized baseline (the identity scheme)
    fp8_e4m3/tensor/dynamic           one scale per layer for K and one for V, from the values
    fp8_e4m3/head/static+scales=calibration/x.safetensors
    fp8_e5m2/tensor/unit              scale 1.0, what engines use when no scale is given
    fp8_e4m3/block16/dynamic+skip=0,29
    int4/group32/dynamic
    fp8_e4m3/head/dynamic+attn=fa3    also Q and softmax P in FP8, as FlashAttention-3 does

Granularities (the elements sharing one scale), for K of shape (batch, kv_heads, seq, head_dim):
``tensor`` (all of a layer's K, or V), ``head`` (one per KV head), ``block<N>`` (one per KV head per
N consecutive tokens, like a paged-KV block; ``block`` means ``block16``), ``token`` (one per token
per head) and ``group<N>`` (N channels of head_dim per token per head).

Options (canonical order): ``scales=PATH`` (the static table), ``skip=0,5`` or ``skip=sliding``
(layers kept unquantized), ``attn=fa3`` (attention precision), ``rope=bf16`` (MLA models: keep the
RoPE key unquantized).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from evalkit.errors import SchemeError
from evalkit.kv.formats import KVFormat, get_format


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
    GranularityKind.GROUP: "one scale per N channels of head_dim per token per head (reference; MX/FP4-style)",
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
    FA3 = "fa3"


@dataclass(frozen=True)
class Granularity:
    kind: GranularityKind
    size: int = 0  # block length in tokens, or group width in channels

    def __post_init__(self):
        sized = self.kind in (GranularityKind.BLOCK, GranularityKind.GROUP)
        if sized and self.size <= 0:
            raise SchemeError(f"{self.kind.value} size must be a positive integer, got {self.size}: write e.g. {self.kind.value}16")
        if not sized and self.size:
            raise SchemeError(f"granularity {self.kind.value!r} takes no size")

    def __str__(self) -> str:
        return f"{self.kind.value}{self.size}" if self.size else self.kind.value

    @classmethod
    def parse(cls, text: str) -> Granularity:
        m = re.fullmatch(r"([a-z]+)(-?\d+)?", text.strip())
        kinds = ", ".join(k.value + ("<N>" if k in (GranularityKind.BLOCK, GranularityKind.GROUP) else "") for k in GranularityKind)
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


@dataclass(frozen=True)
class Scheme:
    format: str = "bf16"
    granularity: Granularity = field(default_factory=lambda: Granularity(GranularityKind.TENSOR))
    scales: ScaleSource = ScaleSource.DYNAMIC
    static_path: str | None = None
    skip_layers: tuple[int, ...] | str = ()
    attention: AttentionPrecision = AttentionPrecision.KV
    rope_bf16: bool = False

    def __post_init__(self):
        fmt = get_format(self.format)
        if fmt.is_identity:
            defaults = (Granularity(GranularityKind.TENSOR), ScaleSource.DYNAMIC, None, (), AttentionPrecision.KV, False)
            if (self.granularity, self.scales, self.static_path, self.skip_layers, self.attention, self.rope_bf16) != defaults:
                raise SchemeError("bf16 is the unquantized baseline and takes no granularity, scales or options: write just 'bf16'")
            return
        if self.scales is ScaleSource.STATIC:
            if self.granularity.kind not in (GranularityKind.TENSOR, GranularityKind.HEAD):
                raise SchemeError(
                    f"static scales exist per layer (tensor) or per layer and head (head), not per {self.granularity}: "
                    "use tensor or head granularity, or dynamic scales"
                )
            if not self.static_path:
                raise SchemeError("static scales need a scale file: add +scales=PATH (make one with `python -m evalkit calibrate`)")
        elif self.static_path:
            raise SchemeError(f"+scales=PATH only goes with static scales, not {self.scales.value}")
        if self.scales is not ScaleSource.DYNAMIC and fmt.asymmetric:
            raise SchemeError(f"{fmt.name} needs a zero point, which {self.scales.value} scales do not have: "
                              f"use {fmt.name.replace('_asym', '')} or dynamic scales")
        if isinstance(self.skip_layers, str):
            if self.skip_layers != SLIDING:
                raise SchemeError(f"skip must be a list of layer indices or 'sliding', got {self.skip_layers!r}")
        elif any(i < 0 for i in self.skip_layers) or list(self.skip_layers) != sorted(set(self.skip_layers)):
            raise SchemeError("skip layers must be distinct non-negative indices in increasing order, e.g. skip=0,5")

    # -- derived --------------------------------------------------------------------------------
    @property
    def kv_format(self) -> KVFormat:
        return get_format(self.format)

    @property
    def is_identity(self) -> bool:
        return self.kv_format.is_identity

    def skips_layer(self, layer_idx: int, is_sliding: bool = False) -> bool:
        if self.skip_layers == SLIDING:
            return is_sliding
        return layer_idx in self.skip_layers

    # -- canonical string -----------------------------------------------------------------------
    def __str__(self) -> str:
        if self.is_identity:
            return "bf16"
        text = f"{self.format}/{self.granularity}/{self.scales.value}"
        if self.static_path:
            text += f"+scales={self.static_path}"
        if self.skip_layers:
            skip = self.skip_layers if isinstance(self.skip_layers, str) else ",".join(map(str, self.skip_layers))
            text += f"+skip={skip}"
        if self.attention is not AttentionPrecision.KV:
            text += f"+attn={self.attention.value}"
        if self.rope_bf16:
            text += "+rope=bf16"
        return text

    @classmethod
    def parse(cls, text: str) -> Scheme:
        return parse_scheme(text)


_OPTION_KEYS = ("scales", "skip", "attn", "rope")


def parse_scheme(text: str) -> Scheme:
    """Parse ``FORMAT/GRANULARITY/SCALES[+key=value...]`` (or ``bf16``) into a :class:`Scheme`."""
    if not isinstance(text, str) or not text.strip():
        raise SchemeError("empty KV scheme: write e.g. fp8_e4m3/tensor/dynamic or bf16")
    text = text.strip()
    head, *options = text.split("+")
    parts = head.split("/")
    if parts == ["bf16"]:
        if options:
            raise SchemeError("bf16 is the unquantized baseline and takes no options: write just 'bf16'")
        return Scheme()
    if len(parts) != 3:
        raise SchemeError(
            f"malformed KV scheme {text!r}: write FORMAT/GRANULARITY/SCALES, e.g. fp8_e4m3/head/dynamic (see `python -m evalkit schemes`)"
        )
    fmt, gran, scales = parts
    get_format(fmt)
    granularity = Granularity.parse(gran)
    try:
        source = ScaleSource(scales)
    except ValueError:
        raise SchemeError(f"unknown scale source {scales!r}: use one of {', '.join(s.value for s in ScaleSource)}") from None
    kwargs: dict = {}
    for opt in options:
        key, sep, value = opt.partition("=")
        if not sep or key not in _OPTION_KEYS or not value:
            raise SchemeError(f"unknown scheme option {opt!r} in {text!r}: options are {', '.join(k + '=...' for k in _OPTION_KEYS)}")
        if key == "scales":
            kwargs["static_path"] = value
        elif key == "skip":
            if value == SLIDING:
                kwargs["skip_layers"] = SLIDING
            else:
                try:
                    kwargs["skip_layers"] = tuple(sorted({int(v) for v in value.split(",")}))
                except ValueError:
                    raise SchemeError(f"skip={value!r}: give layer indices like skip=0,5 or skip=sliding") from None
        elif key == "attn":
            try:
                kwargs["attention"] = AttentionPrecision(value)
            except ValueError:
                raise SchemeError(f"attn={value!r}: use attn=kv (only stored K/V quantized) or attn=fa3") from None
        elif key == "rope":
            if value not in ("bf16", "quant"):
                raise SchemeError(f"rope={value!r}: use rope=bf16 to keep the MLA RoPE key unquantized")
            kwargs["rope_bf16"] = value == "bf16"
    return Scheme(format=fmt, granularity=granularity, scales=source, **kwargs)


def parse_schemes(text: str | list[str]) -> list[Scheme]:
    """Parse a comma-free list: schemes are separated by spaces or passed as a list.

    ``skip=0,5`` contains commas, so a comma-separated string is split only at commas that are
    followed by a format name.
    """
    if isinstance(text, str):
        pieces = re.split(r",(?=\s*(?:bf16|fp8_|int\d))", text)
    else:
        pieces = list(text)
    return [parse_scheme(p) for p in pieces if p.strip()]
