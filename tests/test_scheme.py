"""Scheme strings: canonical form round-trips, and every bad input is one clear error."""

from __future__ import annotations

import pytest

from evalkit.errors import SchemeError
from evalkit.kv.scheme import AttentionPrecision, Granularity, GranularityKind, ScaleSource, Scheme, parse_scheme, parse_schemes

CANONICAL = [
    "bf16",
    "fp8_e4m3/tensor/dynamic", "fp8_e4m3/head/dynamic", "fp8_e5m2/tensor/unit", "fp8_e4m3fnuz/head/unit",
    "fp8_e4m3/block16/dynamic", "fp8_e4m3/block64/dynamic", "fp8_e4m3/token/dynamic", "int4/group32/dynamic",
    "int8/token/dynamic", "int8_asym/token/dynamic", "int4_asym/group32/dynamic",
    "fp8_e4m3/tensor/static+scales=calibration/x.safetensors",
    "fp8_e4m3/head/static+scales=/abs/path/h.safetensors+skip=0,3",
    "fp8_e4m3/head/dynamic+skip=sliding", "fp8_e4m3/head/dynamic+attn=fa3", "fp8_e4m3/group128/dynamic+rope=bf16",
]


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
    assert parse_scheme("bf16") == Scheme() and Scheme().is_identity


def test_list_parsing_keeps_skip_commas():
    schemes = parse_schemes("bf16,fp8_e4m3/tensor/dynamic+skip=0,1,int4/token/dynamic")
    assert [str(s) for s in schemes] == ["bf16", "fp8_e4m3/tensor/dynamic+skip=0,1", "int4/token/dynamic"]


@pytest.mark.parametrize("text, fragment", [
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
    ("", "empty"),
])
def test_bad_schemes_are_one_clear_line(text, fragment):
    with pytest.raises(SchemeError) as err:
        parse_scheme(text)
    message = str(err.value)
    assert fragment in message and "\n" not in message
