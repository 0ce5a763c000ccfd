"""A scheme's ``+key=value`` options: which keys exist, and each value read into the
:class:`~evalkit.kv.scheme.Scheme` field it sets (``+attn=``, ``+skip=``, ``+rounding=``, ``+recipe=``,
the scale options), one line (:class:`~evalkit.errors.SchemeError`) for an unknown key or a bad value.

The head of a scheme string (format, granularity, scale source, or a name) is read by
:func:`evalkit.kv.scheme.parse_scheme`, which hands its options here; a codec family's ``PREFIX:NAME``
takes the options of a named scheme (``skip``, ``attn``, ``rope``).
"""

from __future__ import annotations

from evalkit.errors import SchemeError
from evalkit.kv import codec as codecs
from evalkit.kv.formats import CodecRecipe, Recipe, Rounding, ScaleDType
from evalkit.kv.scheme_parts import SLIDING, AttentionPrecision

OPTION_KEYS = (
    "scale_dtype",
    "tensor_scale",
    "recipe",
    "scales",
    "scales_model",
    "scales_format",
    "rounding",
    "skip",
    "attn",
    "rope",
)
ROUNDING_CHOICES = (
    "rne (to nearest, ties to even; the default), rtz (toward zero) or rna (to nearest, ties away "
    "from zero), each saturating at the format's max"
)
NAMED_OPTION_KEYS = ("skip", "attn", "rope")


def parse_options(text: str, options: list[str], allowed: tuple[str, ...]) -> dict:
    """``options`` (the ``key=value`` pieces after a scheme's ``+``) as Scheme keyword arguments; a key outside
    ``allowed`` is refused, with the long form to write where a named scheme fixes it."""
    kwargs: dict = {}
    for opt in options:
        key, sep, value = opt.partition("=")
        if key in OPTION_KEYS and key not in allowed and sep and value:
            raise SchemeError(
                f"{text.split('+')[0]} fixes its format and scales (and rounding), so +{key}= does not apply: "
                f"write the long form (see `python -m evalkit schemes`) to change them"
            )
        if not sep or key not in allowed or not value:
            raise SchemeError(
                f"unknown scheme option {opt!r} in {text!r}: options are {', '.join(k + '=...' for k in allowed)}"
            )
        if key == "scales":
            kwargs["static_path"] = value
        elif key in ("scales_model", "scales_format"):
            kwargs[key] = value
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
                raise SchemeError(
                    f"attn={value!r}: use attn=kv (only stored K/V quantized), attn=fa3 (also Q and P in FP8), "
                    "attn=fa3:acc1 or attn=fa3:acc2 (and FA3's FP8 accumulation, one or two level)"
                ) from None
        elif key == "rope":
            if value not in ("bf16", "quant"):
                raise SchemeError(f"rope={value!r}: use rope=bf16 to keep the MLA RoPE key unquantized")
            kwargs["rope_bf16"] = value == "bf16"
        elif key == "scale_dtype":
            try:
                kwargs["scale_dtype"] = ScaleDType(value)
            except ValueError:
                raise SchemeError(
                    f"scale_dtype={value!r}: use one of {', '.join(d.value for d in ScaleDType)}"
                ) from None
        elif key == "tensor_scale":
            if value not in ("fp32", "none"):
                raise SchemeError(f"tensor_scale={value!r}: use tensor_scale=fp32 (NVFP4's per-tensor FP32 scale)")
            kwargs["tensor_scale"] = value == "fp32"
        elif key == "recipe":
            kwargs["recipe"] = _recipe(value)
        elif key == "rounding":
            try:
                kwargs["rounding"] = Rounding(value)
            except ValueError:
                raise SchemeError(f"rounding={value!r}: use {ROUNDING_CHOICES}") from None
    return kwargs


def _recipe(value: str) -> Recipe | CodecRecipe:
    """``+recipe=value``: one of evalkit's recipes or a codec family's; SchemeError listing them otherwise."""
    if value in Recipe._value2member_map_:
        return Recipe(value)
    recipe = codecs.recipe_named(value)
    if recipe is not None:
        return recipe
    families = codecs.families().values()
    listed = [r.value for r in Recipe] + [r.value for f in families if f.recipe_hint is None for r in f.recipes()]
    hints = "".join(f" ({f.recipe_hint})" for f in families if f.recipe_hint is not None)
    raise SchemeError(f"recipe={value!r}: use one of {', '.join(listed)}{hints}")
