"""Storage formats for cached K/V, as data.

A format is described once, here, from `torch.finfo` where torch has the dtype; the rest of evalkit
reads only the fields below, never a format's name. Fields:

- ``kind``: a :class:`FormatKind`: ``FLOAT`` (a minifloat: FP8 via a torch float8 dtype, or FP4
  E2M1 kept as 4-bit codes), ``INT`` (integer codes with a scale and, for asymmetric formats, a
  zero point) or ``NONE`` (the unquantized baseline).
- ``bits``: bits per stored element (4 for INT4 and FP4, packed two per byte in the real cache).
- ``max``: the largest finite magnitude (floats) or the largest code magnitude (symmetric int).
- ``mantissa_bits`` / ``min_normal_exp``: what the exact float rounding emulation needs.
- ``scale_dtypes``: the :class:`ScaleDType` s a scale of this format may be stored in (the first
  is the default); ``group_scaled``: the format is only meaningful with one scale per small
  group of elements (FP4: 8 magnitudes cannot span a layer's range); ``recipes``: the
  :class:`Recipe` s its scales may follow (the first is the default).
- ``torch_dtype``: what stored codes are. A float format with a torch float dtype (FP8) is stored
  and rounded by that dtype; a float format without one (``torch.uint8``: a minifloat narrower
  than a byte, such as E2M1) is stored as its own codes, sign bit on top and the magnitudes of
  :attr:`KVFormat.code_magnitudes` (derived from ``bits``, ``mantissa_bits``, ``min_normal_exp``
  and ``max``) below it; 4-bit codes pack two per byte (:attr:`KVFormat.packed`).

Adding a format, the whole checklist: (1) its row in :data:`FORMATS` (a helper below builds FP8
rows from ``torch.finfo``, integer rows from the bit count; a sub-byte minifloat is written out
like :func:`_fp4_e2m1`). evalkit's own store holds 8-bit codes and 4-bit codes two per byte
(:func:`storable`); a row of another width is refused by :func:`evalkit.kv.quantize.encode` in one line,
and belongs to a codec family, which packs its codes in its own slot and registers its element format
with :func:`register_format`; (2) its row in the tests' format tables (``tests/kv/test_rounding_modes.py``
``FLOATS`` or ``INTS``; a float row names the ``ml_dtypes`` reference type it is checked against, bit for bit); (3) for a
named scheme on top of it (``nvfp4``, ``mxfp4``), a :data:`evalkit.kv.named_schemes.NAMED_SCHEMES` row.
Rounding, encoding, byte counts, scheme checks and error messages read the fields; engine
profiles (:mod:`evalkit.engines.profiles`) list the formats each engine serves, by name, as facts
about that engine.

A scale has a storage dtype of its own (:class:`ScaleDType`): ``fp32`` (what evalkit always kept),
``e4m3`` (FP8 E4M3, NVFP4's group scales) or ``e8m0`` (a biased power-of-two exponent byte, the
OCP MX shared scale). The element table says which dtypes a format takes; a scheme picks one, and
:meth:`KVFormat.with_scales` binds it to the element format, so that the quantizer and the byte
counts read one value (``Scheme.kv_format``). Two more scale facts ride along: ``tensor_scale``
(a second-level FP32 scale per tensor, NVFP4) and ``recipe`` (:class:`Recipe`: how scales are
derived where engines differ; see :mod:`evalkit.kv.microscaling`). The element rounding is bound the
same way (:meth:`KVFormat.with_rounding`, ``rounding``: a :class:`Rounding`, done by :mod:`evalkit.kv.rounding`;
nearest even unless a scheme says ``+rounding=rtz`` or ``rna``).

``auto`` is the baseline (vLLM's name for "the model's own dtype"): K/V are stored unquantized in the
model's dtype, the identity. ``bf16`` and ``fp16`` are 16-bit caches without scales: K/V rounded
to bfloat16 or float16 (nearest even) when written, read back in the model's dtype; on a model that
computes in that dtype they are the identity too. The three count 2 bytes per element (the serving
dtype's; a float32 model on this machine is counted as served in 16 bits).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace

import torch

from evalkit.errors import SchemeError


class FormatKind(str, enum.Enum):
    NONE = "none"
    FLOAT = "float"
    INT = "int"


class ScaleDType(str, enum.Enum):
    """How a stored scale is encoded; ``nbytes`` is what each one costs in the cache."""

    FP32 = "fp32"
    E4M3 = "e4m3"
    E8M0 = "e8m0"

    @property
    def nbytes(self) -> int:
        return 4 if self is ScaleDType.FP32 else 1


SCALE_DTYPE_HELP = {
    ScaleDType.FP32: "float32 scale, 4 bytes (the default; scale = amax / format max)",
    ScaleDType.E4M3: "FP8 E4M3 scale, 1 byte: amax / format max rounded to E4M3 (NVFP4's group scales)",
    ScaleDType.E8M0: "power-of-two exponent byte, 1 byte: 2**(floor(log2 amax) - emax), the OCP MX rule",
}


class Rounding(str, enum.Enum):
    """How ``x / scale`` becomes a code: the scheme option ``+rounding=`` (see :mod:`evalkit.kv.rounding`)."""

    RNE = "rne"  # to nearest, ties to even (the default; never written in a scheme string)
    RTZ = "rtz"  # toward zero, then saturate
    RNA = "rna"  # to nearest, ties away from zero, then saturate


ROUNDING_HELP = {
    Rounding.RNE: "to nearest, ties to even (the default): torch's casts, CUDA's satfinite cast, vLLM on GPU",
    Rounding.RTZ: "toward zero, then saturate at the format's max: vLLM's CPU KV store (cpu_attn_reshape_and_cache)",
    Rounding.RNA: "to nearest, ties away from zero, then saturate: SGLang's fp4_e2m1 KV (sglang_fp4)",
}


class Recipe(str, enum.Enum):
    """Where engines derive scales differently from the standard rules (element rounding is its own
    option, ``rounding``). An engine's own cache type carries its codec's :class:`CodecRecipe` instead."""

    STANDARD = "standard"  # amax / max rounded to the scale dtype; E8M0 by OCP MX
    SGLANG = "sglang"  # SGLang's fp4_e2m1 KV: E8M0 exponent ceil(log2(amax / 6)), sign bit v < 0 (-0.0 -> +0)
    # vLLM's CPU FP8 store (cpu_attn_reshape_and_cache): x * float32(1 / scale), an exact-zero quotient stored +0,
    # E4M3 below 2**-6 through a float32 subnormal (evalkit.kv.rounding.round_vllm_cpu); with +rounding=rtz
    VLLM_CPU = "vllm_cpu"


@dataclass(frozen=True)
class CodecRecipe:
    """The recipe of an engine's own cache type (vLLM's ``int4_per_token_head``, llama.cpp's ``q8_0/q4_0``):
    its codec family's store arithmetic (:mod:`evalkit.kv.codec`), made by that family and compared by
    ``value``, which is what ``+recipe=`` writes (``vllm_int4_per_token_head``, ``llamacpp_q8_0_q4_0``)."""

    value: str

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class KVFormat:
    name: str
    kind: FormatKind
    bits: int
    description: str
    torch_dtype: torch.dtype | None = None
    max: float = math.inf
    mantissa_bits: int = 0
    min_normal_exp: int = 0
    asymmetric: bool = False
    negative_zero: bool = True
    scale_dtypes: tuple[ScaleDType, ...] = (ScaleDType.FP32,)
    group_scaled: bool = False
    # the scale encoding bound by Scheme.kv_format (defaults: today's float32 scales)
    scale_dtype: ScaleDType = ScaleDType.FP32
    tensor_scale: bool = False
    recipe: Recipe | CodecRecipe = Recipe.STANDARD
    rounding: Rounding = Rounding.RNE
    recipes: tuple[Recipe, ...] = (Recipe.STANDARD,)  # the recipes this format's scales may follow
    # the model's rotary dims, bound by BoundScheme for a codec whose slot depends on them (vLLM's Octave,
    # evalkit.kv.codecs.slot ``rope_aware``); None: unbound (every dim rotary, vLLM's default)
    rope_dim: int | None = None

    @property
    def is_identity(self) -> bool:
        """The baseline ``auto``: K/V stored as the model computed them."""
        return self.kind is FormatKind.NONE and self.torch_dtype is None

    @property
    def is_unscaled(self) -> bool:
        """A 16-bit cache without scales or codes: ``auto``, or a cast to ``bf16``/``fp16``."""
        return self.kind is FormatKind.NONE

    @property
    def bytes_per_element(self) -> float:
        return self.bits / 8

    @property
    def storage_dtype(self) -> torch.dtype | None:
        """The dtype of stored codes: the float8 dtype, int8, or uint8 (asymmetric, or two 4-bit codes per byte)."""
        return self.torch_dtype

    @property
    def packed(self) -> bool:
        """Two 4-bit codes per stored byte (INT4, FP4)."""
        return self.bits == 4

    @property
    def own_codes(self) -> bool:
        """A float format stored as its own codes (no torch float dtype of its own: E2M1)."""
        return self.kind is FormatKind.FLOAT and self.torch_dtype is not None and not self.torch_dtype.is_floating_point

    @property
    def code_magnitudes(self) -> tuple[float, ...]:
        """The magnitude of each code below the sign bit, in code order (a float format): subnormals
        ``f * 2**(min_normal_exp - m)``, then ``(1 + f / 2**m) * 2**(min_normal_exp + e - 1)``,
        up to ``max``. E2M1: 0, .5, 1, 1.5, 2, 3, 4, 6."""
        m, out = self.mantissa_bits, []
        for code in range(2 ** (self.bits - 1)):
            e, f = code >> m, code & ((1 << m) - 1)
            value = (
                f * 2.0 ** (self.min_normal_exp - m)
                if e == 0
                else (1 + f / 2**m) * 2.0 ** (self.min_normal_exp + e - 1)
            )
            if value > self.max:
                break
            out.append(value)
        return tuple(out)

    @property
    def emax(self) -> int:
        """Exponent of the largest binade, floor(log2(max)): E2M1 2, E4M3 8, E5M2 15 (the OCP MX rule's emax)."""
        return math.frexp(self.max)[1] - 1

    @property
    def scale_nbytes(self) -> int:
        return self.scale_dtype.nbytes

    def with_scales(
        self,
        scale_dtype: ScaleDType = ScaleDType.FP32,
        tensor_scale: bool = False,
        recipe: Recipe | CodecRecipe = Recipe.STANDARD,
    ) -> KVFormat:
        """This element format with its scales stored as ``scale_dtype`` (checked by the scheme)."""
        return replace(self, scale_dtype=scale_dtype, tensor_scale=tensor_scale, recipe=recipe)

    def with_rounding(self, rounding: Rounding = Rounding.RNE) -> KVFormat:
        """This format with its elements rounded by ``rounding`` (:mod:`evalkit.kv.rounding`)."""
        return self if rounding is self.rounding else replace(self, rounding=Rounding(rounding))

    @property
    def qmin(self) -> float:
        """Smallest integer code (int formats)."""
        if self.asymmetric:
            return 0.0
        return -self.max

    @property
    def qmax(self) -> float:
        """Largest integer code (int formats), or the finite max (float formats)."""
        if self.asymmetric:
            return float(2**self.bits - 1)
        return self.max


def _float8(name: str, dtype: torch.dtype, description: str, scale_dtypes=(ScaleDType.FP32,)) -> KVFormat:
    info = torch.finfo(dtype)
    return KVFormat(
        name=name,
        kind=FormatKind.FLOAT,
        bits=info.bits,
        description=description,
        torch_dtype=dtype,
        max=float(info.max),
        mantissa_bits=int(round(-math.log2(info.eps))),
        min_normal_exp=int(round(math.log2(info.smallest_normal))),
        negative_zero=dtype != torch.float8_e4m3fnuz,
        scale_dtypes=tuple(scale_dtypes),
    )


def _fp4_e2m1(description: str) -> KVFormat:
    """E2M1 (OCP MX v1.0): magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}; torch has no unpacked dtype for it,
    so it is described here by hand: 1 mantissa bit, smallest normal 2**0, max 6, codes in uint8."""
    return KVFormat(
        name="fp4_e2m1",
        kind=FormatKind.FLOAT,
        bits=4,
        description=description,
        torch_dtype=torch.uint8,
        max=6.0,
        mantissa_bits=1,
        min_normal_exp=0,
        scale_dtypes=(ScaleDType.FP32, ScaleDType.E4M3, ScaleDType.E8M0),
        group_scaled=True,
        recipes=(Recipe.STANDARD, Recipe.SGLANG),
    )


def _int(name: str, bits: int, asymmetric: bool, description: str) -> KVFormat:
    return KVFormat(
        name=name,
        kind=FormatKind.INT,
        bits=bits,
        description=description,
        torch_dtype=torch.uint8 if (asymmetric or bits < 8) else torch.int8,
        max=float(2 ** (bits - 1) - 1),
        asymmetric=asymmetric,
    )


# A format's numerics version (evalkit.sweep.code_identity.components): 0 until a commit means to change the
# numbers of that format alone; bumping it re-keys only the runs of schemes on that format (and its codec
# fingerprint group is pinned under the new version, tests/numerics).
FORMAT_NUMERICS: dict[str, int] = {}

FORMATS: dict[str, KVFormat] = {
    f.name: f
    for f in (
        KVFormat("auto", FormatKind.NONE, 16, "unquantized baseline: K/V kept in the model's own dtype (vLLM's auto)"),
        KVFormat(
            "bf16", FormatKind.NONE, 16, "K/V rounded to bfloat16, no scales (auto on a BF16 model)", torch.bfloat16
        ),
        KVFormat(
            "fp16", FormatKind.NONE, 16, "K/V rounded to float16, no scales (auto on an FP16 model)", torch.float16
        ),
        replace(
            _float8(
                "fp8_e4m3",
                torch.float8_e4m3fn,
                "FP8 E4M3 (OCP 'fn': max 448, no inf), the engines' usual KV format",
                (ScaleDType.FP32, ScaleDType.E8M0),
            ),
            recipes=(Recipe.STANDARD, Recipe.VLLM_CPU),
        ),
        _float8("fp8_e4m3fnuz", torch.float8_e4m3fnuz, "FP8 E4M3 'fnuz' as on AMD MI300 (max 240, no -0, no inf)"),
        replace(
            _float8(
                "fp8_e5m2",
                torch.float8_e5m2,
                "FP8 E5M2 (max 57344, 2 mantissa bits): more range, less precision",
                (ScaleDType.FP32, ScaleDType.E8M0),
            ),
            recipes=(Recipe.STANDARD, Recipe.VLLM_CPU),
        ),
        _int("int8", 8, False, "INT8 symmetric, codes -127..127 (reference point)"),
        _int("int8_asym", 8, True, "INT8 asymmetric, codes 0..255 with a zero point (reference point)"),
        _int("int4", 4, False, "INT4 symmetric, codes -7..7, two per byte (KIVI-style reference point)"),
        _int("int4_asym", 4, True, "INT4 asymmetric, codes 0..15 with a zero point, two per byte (KIVI-style)"),
        _fp4_e2m1("FP4 E2M1 (values 0, .5, 1, 1.5, 2, 3, 4, 6), saturating, two per byte; per-group scales only"),
    )
}


# Element formats a codec family brings for its own cache types (register_format): an engine's INT6 or
# other width whose codes its slot codec packs itself. Scheme strings of evalkit's own grammar never name
# them (only FORMATS); a family's scheme does, through its codec.
FAMILY_FORMATS: dict[str, KVFormat] = {}


def register_format(fmt: KVFormat) -> KVFormat:
    """Add a codec family's own element format (see :data:`FAMILY_FORMATS`); its codes are stored by the
    family's slot codec, since :func:`evalkit.kv.quantize.encode` holds only the widths :func:`storable`
    says. Re-registering the same row is a no-op; another row under a taken name is refused."""
    taken = FORMATS.get(fmt.name) or FAMILY_FORMATS.get(fmt.name)
    if taken is not None and taken != fmt:
        raise SchemeError(f"KV format {fmt.name!r} is taken: give the family's format a name of its own")
    FAMILY_FORMATS[fmt.name] = fmt
    return fmt


def storable(fmt: KVFormat) -> str | None:
    """None when evalkit's own store (:func:`evalkit.kv.quantize.encode`) holds ``fmt``'s codes as they are
    (8-bit codes in int8, uint8 with a zero point or a float8 dtype; 4-bit codes two per byte; E2M1's own
    codes), else why not, in words: a wider range than the storage dtype, or a width it cannot pack."""
    if fmt.is_unscaled or fmt.own_codes:
        return None
    if fmt.kind is FormatKind.FLOAT:
        return None if fmt.torch_dtype is not None and fmt.torch_dtype.is_floating_point else "no float dtype"
    if fmt.bits == 4:
        return None
    if fmt.bits == 8 and fmt.torch_dtype == (torch.uint8 if fmt.asymmetric else torch.int8):
        return None
    sign = "asymmetric (unsigned)" if fmt.asymmetric else "signed"
    return f"{fmt.bits}-bit {sign} codes in {str(fmt.torch_dtype).removeprefix('torch.')}"


def get_format(name: str) -> KVFormat:
    fmt = FORMATS.get(name) or FAMILY_FORMATS.get(name)
    if fmt is None:
        raise SchemeError(f"unknown KV format {name!r}: use one of {', '.join(FORMATS)}")
    return fmt
