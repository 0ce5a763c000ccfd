"""Scheme strings: canonical form round-trips, and every bad input is one clear error."""

from __future__ import annotations

import pytest

from evalkit.errors import SchemeError
from evalkit.kv.scheme import (
    AttentionPrecision,
    Granularity,
    GranularityKind,
    ScaleSource,
    Scheme,
    parse_scheme,
    parse_schemes,
)

from tests.cli_checks import one_line_exit_2

CANONICAL = [
    "auto",
    "fp8_e4m3/tensor/dynamic",
    "fp8_e4m3/head/dynamic",
    "fp8_e5m2/tensor/unit",
    "fp8_e4m3fnuz/head/unit",
    "fp8_e4m3/block16/dynamic",
    "fp8_e4m3/block64/dynamic",
    "fp8_e4m3/token/dynamic",
    "int4/group32/dynamic",
    "int8/token/dynamic",
    "int8_asym/token/dynamic",
    "int4_asym/group32/dynamic",
    "fp8_e4m3/tensor/static+scales=calibration/x.safetensors",
    "fp8_e4m3/head/static+scales=/abs/path/h.safetensors+skip=0,3",
    "fp8_e4m3/head/dynamic+skip=sliding",
    "fp8_e4m3/head/dynamic+attn=fa3",
    "fp8_e4m3/group128/dynamic+rope=bf16",
    # FP4 and microscaling: named schemes are their own canonical strings
    "nvfp4",
    "mxfp4",
    "mxfp8_e4m3",
    "sglang_fp4",
    "nvfp4+skip=0,3",
    "mxfp4+skip=sliding+attn=fa3",
    "nvfp4+rope=bf16",
    "fp4_e2m1/group16/dynamic",
    "fp4_e2m1/group32/dynamic+scale_dtype=e4m3",
    "fp4_e2m1/group8/dynamic+scale_dtype=e4m3+tensor_scale=fp32",
    "fp4_e2m1/group32/dynamic+scale_dtype=e8m0+recipe=sglang",
    "fp8_e5m2/group32/dynamic+scale_dtype=e8m0",
    "fp8_e4m3/group16/dynamic+scale_dtype=e8m0+skip=1",
    # rounding: rtz/rna are written after scales=, before skip/attn/rope; rne (the default) never is
    "fp8_e4m3/tensor/unit+rounding=rtz",
    "fp8_e5m2/tensor/unit+rounding=rtz",
    "fp8_e4m3fnuz/head/unit+rounding=rna",
    "fp8_e4m3/tensor/static+scales=calibration/x.safetensors+rounding=rtz",
    "fp8_e4m3/head/static+scales=h.safetensors+rounding=rna+skip=0,3+attn=fa3",
    "fp8_e4m3/block16/dynamic+rounding=rtz+skip=sliding",
    "int8/token/dynamic+rounding=rtz",
    "int4_asym/group32/dynamic+rounding=rna",
    "fp4_e2m1/group16/dynamic+rounding=rtz",
    "fp4_e2m1/group32/dynamic+scale_dtype=e8m0+rounding=rna",
    "fp4_e2m1/group16/dynamic+scale_dtype=e4m3+tensor_scale=fp32+rounding=rtz",
    "fp8_e4m3/group32/dynamic+scale_dtype=e8m0+rounding=rtz+rope=bf16",
    "fp4_e2m1/group16/dynamic+scale_dtype=e8m0+recipe=sglang",  # SGLang's scale rule with nearest-even elements
]


@pytest.mark.parametrize(
    "long, name",
    [
        ("fp4_e2m1/group16/dynamic+scale_dtype=e4m3+tensor_scale=fp32", "nvfp4"),
        ("fp4_e2m1/group32/dynamic+scale_dtype=e8m0", "mxfp4"),
        ("fp8_e4m3/group32/dynamic+scale_dtype=e8m0+skip=0", "mxfp8_e4m3+skip=0"),
        ("fp4_e2m1/group16/dynamic+scale_dtype=e8m0+recipe=sglang+rounding=rna+rope=bf16", "sglang_fp4+rope=bf16"),
        ("fp4_e2m1/group16/dynamic+rounding=rna+scale_dtype=e8m0+recipe=sglang", "sglang_fp4"),
        ("fp8_e4m3/group32/dynamic+scale_dtype=e8m0+rounding=rne", "mxfp8_e4m3"),
        ("fp4_e2m1/group16/dynamic+scale_dtype=e4m3+tensor_scale=fp32+skip=3,1", "nvfp4+skip=1,3"),
    ],
)
def test_long_forms_print_as_their_name(long, name):
    assert str(parse_scheme(long)) == name and parse_scheme(name) == parse_scheme(long)


def test_existing_strings_keep_fp32_scales_and_their_text():
    s = parse_scheme("fp8_e4m3/tensor/dynamic")
    assert s.scale_dtype.value == "fp32" and not s.tensor_scale and s.name is None
    assert s.kv_format.scale_nbytes == 4 and str(s) == "fp8_e4m3/tensor/dynamic"


@pytest.mark.parametrize("text", CANONICAL)
def test_canonical_round_trip(text):
    scheme = parse_scheme(text)
    assert str(scheme) == text
    assert parse_scheme(str(scheme)) == scheme
    assert hash(scheme) == hash(parse_scheme(text))


def test_fields_and_defaults():
    s = parse_scheme("fp8_e4m3/block/dynamic")
    assert s.granularity == Granularity(GranularityKind.BLOCK, 16) and str(s) == "fp8_e4m3/block16/dynamic"
    s = parse_scheme("fp8_e4m3/head/static+scales=a.safetensors+skip=5,0+attn=fa3")
    assert s.scales is ScaleSource.STATIC and s.static_path == "a.safetensors"
    assert s.skip_layers == (0, 5) and s.attention is AttentionPrecision.FA3
    assert parse_scheme("auto") == Scheme() and Scheme().is_identity


def test_list_parsing_keeps_skip_commas():
    schemes = parse_schemes("auto,fp8_e4m3/tensor/dynamic+skip=0,1,int4/token/dynamic")
    assert [str(s) for s in schemes] == ["auto", "fp8_e4m3/tensor/dynamic+skip=0,1", "int4/token/dynamic"]
    schemes = parse_schemes("nvfp4+skip=0,1,mxfp4,fp4_e2m1/group16/dynamic,mxfp8_e4m3+skip=2,3,sglang_fp4")
    assert [str(s) for s in schemes] == [
        "nvfp4+skip=0,1",
        "mxfp4",
        "fp4_e2m1/group16/dynamic",
        "mxfp8_e4m3+skip=2,3",
        "sglang_fp4",
    ]


@pytest.mark.parametrize(
    "text, bad, why",
    [
        (
            "fp8_e4m3/tensor/unit,fp8_e4m4/tensor/unit",
            "scheme 2 of 2, 'fp8_e4m4/tensor/unit'",
            "unknown KV format 'fp8_e4m4'",
        ),
        ("auto,nvfp4,mxfp5", "scheme 3 of 3, 'mxfp5'", "malformed KV scheme 'mxfp5'"),
        ("auto,fp9_e5m2/tensor/unit+skip=0,1,nvfp4", "scheme 2 of 3, 'fp9_e5m2/tensor/unit+skip=0,1'", "'fp9_e5m2'"),
        ("fp8_e4m3/tensor/dynamic+skip=0,1,fp8_e5m2/tensr/unit", "scheme 2 of 2, 'fp8_e5m2/tensr/unit'", "'tensr'"),
    ],
)
def test_a_typo_in_a_later_scheme_is_reported_against_that_scheme(text, bad, why, capsys):
    with pytest.raises(SchemeError) as err:
        parse_schemes(text)
    msg = str(err.value)
    assert msg.startswith(bad) and why in msg and "\n" not in msg, msg
    # at the command line: one line, exit 2, naming the bad item (before any model loads)
    one_line_exit_2(["run", "--schemes", text], capsys, bad, why)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("fp9/tensor/dynamic", "unknown KV format"),
        ("fp8_e4m3/channel/dynamic", "unknown granularity"),
        ("fp8_e4m3/tensor/magic", "unknown scale source"),
        ("fp8_e4m3/block0/dynamic", "positive"),
        ("fp8_e4m3/block-4/dynamic", "positive"),
        ("fp8_e4m3/group/dynamic", "group needs a width"),
        ("fp8_e4m3/group0/dynamic", "positive"),
        ("fp8_e4m3/head", "FORMAT/GRANULARITY/SCALES"),
        ("fp8_e4m3/tensor/static", "+scales=PATH"),
        ("fp8_e4m3/token/static+scales=x", "tensor) or per layer and head"),
        ("fp8_e4m3/tensor/dynamic+scales=x", "only goes with static"),
        ("fp8_e4m3/tensor/dynamic+skip=a,b", "layer indices"),
        ("fp8_e4m3/tensor/dynamic+attn=fa4", "attn="),
        ("fp8_e4m3/tensor/dynamic+color=red", "unknown scheme option"),
        ("int4_asym/tensor/unit", "zero point"),
        ("int8_asym/tensor/static+scales=s.safetensors", "which static scales do not have"),
        ("bf16+attn=fa3", "takes no options"),
        ("fp4_e2m1/tensor/dynamic", "one scale per group of values along head_dim, not per tensor"),
        ("fp4_e2m1/token/dynamic", "not per token"),
        ("fp4_e2m1/group16/unit", "not unit scales"),
        ("fp4_e2m1/group16/static+scales=s.safetensors", "not static scales"),
        ("fp8_e4m3/head/static+scales=s.safetensors+scale_dtype=e8m0", "not static scales"),
        ("fp8_e4m3/block16/dynamic+scale_dtype=e8m0", "not per block16"),
        ("fp8_e4m3/group32/dynamic+scale_dtype=e4m3", "does not take e4m3 scales"),
        ("int8/group32/dynamic+scale_dtype=e8m0", "takes fp32 scales only"),
        ("fp8_e4m3fnuz/group32/dynamic+scale_dtype=e8m0", "takes fp32 scales only"),
        ("fp4_e2m1/group16/dynamic+scale_dtype=e5m2", "scale_dtype='e5m2'"),
        ("fp4_e2m1/group16/dynamic+tensor_scale=fp32", "goes with scale_dtype=e4m3"),
        ("fp8_e4m3/group16/dynamic+recipe=sglang", "recipe=sglang"),
        ("mxfp4+scale_dtype=e4m3", "mxfp4 fixes its format and scales"),
        ("nvfp4+scales=x.safetensors", "nvfp4 fixes its format and scales"),
        ("nvfp4+color=red", "unknown scheme option"),
        ("nvfp4+rounding=rtz", "nvfp4 fixes its format and scales (and rounding)"),
        ("sglang_fp4+rounding=rne", "sglang_fp4 fixes its format and scales (and rounding)"),
        ("fp8_e4m3/tensor/unit+rounding=up", "rounding='up': use rne"),
        ("fp8_e4m3/tensor/unit+rounding=", "unknown scheme option"),
        ("bf16+rounding=rtz", "takes no options"),
        ("fp4_e2m1", "needs a granularity and a scale source"),
        ("nvfp4/group16/dynamic", "unknown KV format"),
        ("", "empty"),
    ],
)
def test_bad_schemes_are_one_clear_line(text, fragment):
    with pytest.raises(SchemeError) as err:
        parse_scheme(text)
    message = str(err.value)
    assert fragment in message and "\n" not in message


@pytest.mark.parametrize(
    "text, order",
    [
        (
            "fp8_e4m3/head/static+skip=3+rounding=rtz+attn=fa3+scales=h.safetensors",
            "fp8_e4m3/head/static+scales=h.safetensors+rounding=rtz+skip=3+attn=fa3",
        ),
        ("int8/token/dynamic+rounding=rna", "int8/token/dynamic+rounding=rna"),
        ("fp8_e4m3/tensor/unit+rounding=rne", "fp8_e4m3/tensor/unit"),
    ],
)
def test_rounding_takes_its_place_in_the_canonical_order(text, order):
    assert str(parse_scheme(text)) == order and parse_scheme(order) == parse_scheme(text)


def test_rounding_field_default_and_binding():
    from evalkit.kv.rounding import Rounding

    s = parse_scheme("fp8_e4m3/tensor/unit+rounding=rtz")
    assert s.rounding is Rounding.RTZ and s.kv_format.rounding is Rounding.RTZ
    assert s != parse_scheme("fp8_e4m3/tensor/unit") and hash(s) != hash(parse_scheme("fp8_e4m3/tensor/unit"))
    assert Scheme(format="fp8_e4m3", scales=ScaleSource.UNIT, rounding="rtz") == s  # a string reads as the mode
    assert parse_scheme("sglang_fp4").rounding is Rounding.RNA and parse_scheme("nvfp4").rounding is Rounding.RNE
    with pytest.raises(SchemeError, match="takes no granularity"):
        Scheme(rounding=Rounding.RTZ)


@pytest.mark.parametrize("text", CANONICAL)
def test_nearest_even_is_never_written(text):
    """Existing strings (and so run ids and the published store) keep their text: rne is the default."""
    from evalkit.kv.rounding import Rounding

    s = parse_scheme(text)
    assert ("rounding=" in str(s)) == (s.rounding is not Rounding.RNE and s.name is None)
    assert "rounding=rne" not in str(s)
