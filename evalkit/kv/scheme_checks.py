"""The rules a :class:`~evalkit.kv.scheme.Scheme`'s scale fields keep against its element format: which scale
dtypes, per-group scales, tensor scale and recipe a format takes, and what a static table's declared model
and format must be. Each refusal is one line (:class:`~evalkit.errors.SchemeError`) naming the scheme to
write instead.

A scheme checks itself with these when it is made (``Scheme.__post_init__``); they sit apart from the
value so the value reads as its fields and its canonical string. A codec family's scheme is checked by
its family (:func:`evalkit.kv.codec.family_of`).
"""

from __future__ import annotations

from evalkit.errors import SchemeError
from evalkit.kv import codec as codecs
from evalkit.kv.formats import FORMATS, KVFormat, Recipe, Rounding, ScaleDType
from evalkit.kv.microscaling import MX_BLOCK, NVFP4_BLOCK, SGLANG_FP4_BLOCK
from evalkit.kv.named_schemes import NAMED_SCHEMES
from evalkit.kv.scheme_parts import GranularityKind, ScaleSource


def check_scales_declaration(scheme) -> None:
    """``+scales_model=`` and ``+scales_format=`` name a static table's model and format: both or
    neither, with ``+scales=PATH`` only, the format a known one."""
    given = (scheme.scales_model is not None, scheme.scales_format is not None)
    if not any(given):
        return
    if not scheme.static_path:
        raise SchemeError("+scales_model= and +scales_format= describe a static table: add +scales=PATH or drop them")
    if not all(given):
        missing = "scales_format" if given[0] else "scales_model"
        raise SchemeError(
            f"+scales_model= and +scales_format= go together: add +{missing}=... naming what the table was made for"
        )
    if scheme.scales_format not in FORMATS:
        raise SchemeError(
            f"scales_format={scheme.scales_format!r} is not a format: use one of {', '.join(sorted(FORMATS))}"
        )


def check_scale_encoding(scheme, fmt: KVFormat) -> None:
    """Scale dtype, per-group scales, tensor scale and recipe against the format (one line each)."""
    family = codecs.family_of(scheme.recipe)
    if family is not None:  # an engine's own cache type fixes all of it (its codec family)
        family.check(scheme)
        return
    if scheme.scale_dtype not in fmt.scale_dtypes:
        if len(fmt.scale_dtypes) == 1:
            raise SchemeError(
                f"{fmt.name} takes {fmt.scale_dtypes[0].value} scales only, not {scheme.scale_dtype.value}: "
                f"drop +scale_dtype={scheme.scale_dtype.value}"
            )
        raise SchemeError(
            f"{fmt.name} does not take {scheme.scale_dtype.value} scales: use scale_dtype "
            f"{' or '.join(d.value for d in fmt.scale_dtypes)} (named schemes: `python -m evalkit schemes`)"
        )
    if scheme.tensor_scale and scheme.scale_dtype is not ScaleDType.E4M3:
        raise SchemeError(
            "tensor_scale=fp32 is NVFP4's second-level scale and goes with scale_dtype=e4m3: "
            "add +scale_dtype=e4m3 or write nvfp4"
        )
    if scheme.recipe is Recipe.VLLM_CPU:  # vLLM's CPU FP8 store arithmetic (evalkit.kv.rounding.round_vllm_cpu)
        takers = " or ".join(f.name for f in FORMATS.values() if Recipe.VLLM_CPU in f.recipes)
        fixed = (ScaleDType.FP32, False, Rounding.RTZ)
        if scheme.recipe not in fmt.recipes or (scheme.scale_dtype, scheme.tensor_scale, scheme.rounding) != fixed:
            raise SchemeError(
                f"recipe=vllm_cpu is vLLM's CPU FP8 store, which writes {takers} with float32 scales and "
                f"truncates: use e.g. fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz"
            )
        return
    if scheme.recipe not in fmt.recipes or (
        scheme.recipe is Recipe.SGLANG and scheme.scale_dtype is not ScaleDType.E8M0
    ):
        takers = [f.name for f in FORMATS.values() if scheme.recipe in f.recipes]
        named = [n for n, d in NAMED_SCHEMES.items() if d.recipe is scheme.recipe]
        raise SchemeError(
            f"recipe={scheme.recipe.value} goes with {' or '.join(takers)} values and e8m0 scales "
            f"(SGLang's FP4 KV recipe): use {takers[0]}/group{SGLANG_FP4_BLOCK}/dynamic+scale_dtype=e8m0"
            f"+recipe={scheme.recipe.value}, i.e. {' or '.join(named)}"
        )
    if not (fmt.group_scaled or scheme.scale_dtype is not ScaleDType.FP32):
        return
    needs = f"{fmt.name} values need" if fmt.group_scaled else f"{scheme.scale_dtype.value} scales are"
    per_group = (
        f"{fmt.name} values need one scale per group of values along head_dim"
        if fmt.group_scaled
        else f"{scheme.scale_dtype.value} scales exist per group of values along head_dim"
    )
    example = f"{fmt.name}/group{NVFP4_BLOCK if fmt.group_scaled else MX_BLOCK}/dynamic"
    if scheme.scale_dtype is not ScaleDType.FP32:
        example += f"+scale_dtype={scheme.scale_dtype.value}"
    if scheme.scales is not ScaleSource.DYNAMIC:
        raise SchemeError(
            f"{needs} per-group scales computed from the values, not {scheme.scales.value} scales: "
            f"use dynamic, e.g. {example}"
        )
    if scheme.granularity.kind is not GranularityKind.GROUP:
        raise SchemeError(f"{per_group}, not per {scheme.granularity}: use group<N>, e.g. {example}")
