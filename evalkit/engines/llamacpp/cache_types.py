"""llama.cpp's KV cache types: the whitelist, its refusals, and the bytes of one cache row.

A cache pair (``type_k`` / ``type_v``) is llama.cpp's ``--cache-type-k/-v``: :data:`CACHE_TYPES` maps the
whitelist to ggml's type enum. :func:`check_cache_types` refuses, in one line and before any model is
loaded, a name outside it and a quantized V without flash attention (llama.cpp stores V transposed without
flash attention, one element per row, which no quant block fits). :func:`row_size` is ggml's own
``ggml_row_size`` when its library can be reached (the KV allocation is ``n_layer * cells * row_size``),
else ggml's block table, identical for the whitelisted types.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
from pathlib import Path

from evalkit.errors import EvalkitError

# llama.cpp's --cache-type-k / --cache-type-v whitelist -> ggml_type enum values.
CACHE_TYPES = {
    "f32": 0,
    "f16": 1,
    "bf16": 30,
    "q8_0": 8,
    "q4_0": 2,
    "q4_1": 3,
    "iq4_nl": 20,
    "q5_0": 6,
    "q5_1": 7,
}
QUANTIZED_TYPES = ("q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
# (elements per block, bytes per block): ggml's sizes, used only where libggml-base cannot be reached.
BLOCK_SIZES = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "iq4_nl": (32, 18),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
}


def check_cache_types(type_k: str, type_v: str, flash_attn: bool) -> None:
    """llama.cpp's refusals for a cache pair, in one line, before any model is loaded."""
    for which, name in (("K", type_k), ("V", type_v)):
        if name not in CACHE_TYPES:
            raise EvalkitError(f"llama.cpp has no {which} cache type {name!r}: use one of {', '.join(CACHE_TYPES)}")
    if type_v in QUANTIZED_TYPES and not flash_attn:
        raise EvalkitError(
            f"llama.cpp needs flash attention for a quantized V cache ({type_v}): "
            "turn flash attention on (flash_attn=true), or store V as f16"
        )


def row_size(type_name: str, n: int) -> int:
    """Bytes of one row of ``n`` elements of a cache type: ggml's own ``ggml_row_size`` when its library
    can be reached, else ggml's block table (identical for the whitelisted types)."""
    fn = _row_size_fn()
    if fn is not None:
        return int(fn(CACHE_TYPES[type_name], n))
    blck, size = BLOCK_SIZES[type_name]
    if n % blck:
        raise EvalkitError(f"a {type_name} row of {n} elements is not whole {blck}-element blocks: use another type")
    return n // blck * size


@functools.cache
def _row_size_fn():
    try:
        lib_dir = Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib"
        base = ctypes.CDLL(str(lib_dir / "libggml-base.so"), mode=getattr(ctypes, "RTLD_GLOBAL", 0))
        fn = base.ggml_row_size
        fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int64], ctypes.c_size_t
    except (OSError, AttributeError, TypeError):
        return None
    return fn
