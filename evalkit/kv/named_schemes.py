"""Named KV schemes: the standard format-and-scales combinations (NVFP4, MXFP4, MXFP8, SGLang's FP4) with
a short canonical name.

A named scheme's canonical string is its name, and its long form parses to the same
:class:`~evalkit.kv.scheme.Scheme` (the table is in :mod:`evalkit.kv.scheme`'s docstring). Here on its
own so the scheme value, its checks and the listing of ``evalkit schemes`` read one table.
"""

from __future__ import annotations

from dataclasses import dataclass

from evalkit.kv.formats import Recipe, Rounding, ScaleDType
from evalkit.kv.microscaling import MX_BLOCK, NVFP4_BLOCK, SGLANG_FP4_BLOCK, SGLANG_FP4_SCALE_DTYPE
from evalkit.kv.scheme_parts import Granularity, GranularityKind, ScaleSource


@dataclass(frozen=True)
class NamedScheme:
    """A standard format-and-scales combination with a short canonical name."""

    format: str
    group: int
    scale_dtype: ScaleDType
    description: str
    tensor_scale: bool = False
    recipe: Recipe = Recipe.STANDARD
    rounding: Rounding = Rounding.RNE

    def core(self) -> tuple:
        return (
            self.format,
            Granularity(GranularityKind.GROUP, self.group),
            ScaleSource.DYNAMIC,
            None,
            self.scale_dtype,
            self.tensor_scale,
            self.recipe,
            self.rounding,
        )

    def fields(self) -> dict:
        """The :class:`~evalkit.kv.scheme.Scheme` fields this name fixes (its format, groups and scales)."""
        return dict(
            format=self.format,
            granularity=Granularity(GranularityKind.GROUP, self.group),
            scales=ScaleSource.DYNAMIC,
            scale_dtype=self.scale_dtype,
            tensor_scale=self.tensor_scale,
            recipe=self.recipe,
            rounding=self.rounding,
        )

    def long_form(self) -> str:
        text = f"{self.format}/group{self.group}/dynamic+scale_dtype={self.scale_dtype.value}"
        text += "+tensor_scale=fp32" if self.tensor_scale else ""
        text += f"+recipe={self.recipe.value}" if self.recipe is not Recipe.STANDARD else ""
        return text + (f"+rounding={self.rounding.value}" if self.rounding is not Rounding.RNE else "")


NAMED_SCHEMES: dict[str, NamedScheme] = {
    "nvfp4": NamedScheme(
        "fp4_e2m1",
        NVFP4_BLOCK,
        ScaleDType.E4M3,
        tensor_scale=True,
        description=(
            "NVIDIA NVFP4: E2M1, one E4M3 scale per 16 values along head_dim, one FP32 scale per tensor "
            "(from each sequence's first write, then frozen)"
        ),
    ),
    "mxfp4": NamedScheme(
        "fp4_e2m1",
        MX_BLOCK,
        ScaleDType.E8M0,
        description=("OCP MX v1.0 MXFP4: E2M1, one E8M0 (power-of-two) scale per 32 values"),
    ),
    "mxfp8_e4m3": NamedScheme(
        "fp8_e4m3", MX_BLOCK, ScaleDType.E8M0, description=("OCP MX v1.0 MXFP8: FP8 E4M3, one E8M0 scale per 32 values")
    ),
    "sglang_fp4": NamedScheme(
        "fp4_e2m1",
        SGLANG_FP4_BLOCK,
        ScaleDType(SGLANG_FP4_SCALE_DTYPE),
        recipe=Recipe.SGLANG,
        rounding=Rounding.RNA,
        description=(
            "SGLang --kv-cache-dtype fp4_mx_block16: E2M1, one E8M0 scale per 16 values, "
            "exponent ceil(log2(amax/6)), elements rounded half away from zero"
        ),
    ),
}
