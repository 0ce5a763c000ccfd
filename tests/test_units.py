"""evalkit.units: sizes read in SI or binary units, printed in binary units; durations."""

from __future__ import annotations

import pytest

from evalkit.errors import EvalkitError
from evalkit.units import format_bytes, format_seconds, parse_bytes


@pytest.mark.parametrize("text,want", [("80GiB", 80 * 2**30), ("80GB", 80 * 10**9), ("1.03TB", 1_030_000_000_000),
                                       ("512MiB", 512 * 2**20), ("1024", 1024), ("141 GB", 141 * 10**9)])
def test_parse_bytes(text, want):
    assert parse_bytes(text) == want


@pytest.mark.parametrize("bad", ["80 parsecs", "GiB", "", "-3GB"])
def test_parse_bytes_rejects(bad):
    with pytest.raises(EvalkitError, match="cannot read a memory size"):
        parse_bytes(bad)


@pytest.mark.parametrize("n,want", [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (10**6, "976.6 KiB"),
                                    (2**20, "1.0 MiB"), (80 * 2**30, "80.0 GiB"), (141 * 10**9, "131.3 GiB"),
                                    (1.03e12, "959.3 GiB"), (3 * 2**40, "3.0 TiB"), (-2**30, "-1.0 GiB")])
def test_format_bytes_is_binary_one_decimal(n, want):
    assert format_bytes(n) == want


def test_format_bytes_reads_back():
    for n in (2**20, 80 * 2**30, 3 * 2**40):
        assert parse_bytes(format_bytes(n).replace(" ", "")) == n


@pytest.mark.parametrize("s,want", [(None, "?"), (0.04, "0.0 s"), (59.94, "59.9 s"), (60, "1 min 00 s"),
                                    (245.9, "4 min 05 s"), (3600, "1 h 00 min"), (7625, "2 h 07 min")])
def test_format_seconds(s, want):
    assert format_seconds(s) == want
