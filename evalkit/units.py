"""Bytes and durations as people read and write them: the one place evalkit turns sizes and times into text.

Printed sizes use binary units, one decimal: ``KiB`` = 2**10 bytes, ``MiB`` = 2**20, ``GiB`` = 2**30,
``TiB`` = 2**40 (what memory and disk tools report), plain ``B`` below a KiB. Sizes read from the
command line take either family: ``80GiB`` (2**30 each) or ``80GB`` (10**9 each), ``1.03TB``,
``512MiB``; a bare number is bytes. Durations print as ``12.3 s``, ``4 min 05 s`` or ``2 h 07 min``.
A value with its interval prints as ``+0.83 [-0.02, +1.87]`` (:func:`value_with_interval`), the
form of every table cell that carries one.

The bottom floor with :mod:`evalkit.errors`: it imports nothing else of evalkit.
"""

from __future__ import annotations

import re

from evalkit.errors import EvalkitError

BYTE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_PRINTED = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def parse_number(text, units: dict[str, float], what: str, example: str) -> float:
    """``<number><unit>`` (case-insensitive unit from ``units``) as a float; one clear error otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in units:
        raise EvalkitError(f"cannot read {what} {text!r}: write e.g. {example}")
    return float(m.group(1)) * units[m.group(2).lower()]


def parse_bytes(text) -> int:
    """``80GiB`` -> 85899345920, ``80GB`` -> 80e9, ``1.03TB``, ``512MiB``; a bare number is bytes."""
    return int(parse_number(text, BYTE_UNITS, "a memory size", "80GiB, 80GB or 1.03TB"))


def format_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit it reaches, one decimal: ``1.5 GiB``, ``976.6 KiB``, ``12 B``."""
    for unit, size in _PRINTED:
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def format_seconds(s: float | None) -> str:
    """``12.3 s``, ``4 min 05 s``, ``2 h 07 min``; ``?`` for a time not known (None)."""
    if s is None:
        return "?"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def _missing(v) -> bool:
    """None, NaN or pandas' NA: a cell with nothing to show."""
    if v is None:
        return True
    try:
        return bool(v != v)
    except TypeError:  # pandas.NA compares to NA
        return True


def value_with_interval(row, key: str, scale: float = 1.0, fmt: str = "+.2f", unit: str = "") -> str:
    """``row[key]`` (times ``scale``, formatted by ``fmt``, then ``unit``) followed by
    ``[row[key_lo], row[key_hi]]`` where both bounds are present; "" when the value is missing."""
    v = row.get(key)
    if _missing(v):
        return ""
    text = format(v * scale, fmt) + unit
    lo, hi = row.get(f"{key}_lo"), row.get(f"{key}_hi")
    if not _missing(lo) and not _missing(hi):
        text += f" [{format(lo * scale, fmt)}, {format(hi * scale, fmt)}]"
    return text
