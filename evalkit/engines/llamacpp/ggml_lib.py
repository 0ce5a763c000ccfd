"""ggml's own block quantizers, reached through ctypes in the installed llama-cpp-python, and the
kernel conformance of evalkit's encoder (:mod:`evalkit.kv.codecs.llamacpp.ggml_blocks`) against them.

llama.cpp's CPU KV-cache write calls ``ggml_get_type_traits_cpu(type)->from_float`` once per token
row (``libggml-cpu.so``); that, not ``ggml_quantize_chunk`` (the model-file quantizer, which differs for
q8_0 and iq4_nl), is the oracle here. Dequantization is ``ggml_get_type_traits(type)->to_float``
(``libggml-base.so``). The libraries are loaded on the first call, never at import.

:func:`kernel_conformance` feeds the same float32 rows to both and compares every 32-value block's
bytes (for f16/bf16/f32: every 32 values' bytes); a differing block is counted under the first class
that explains it (:data:`CLASSES`), and one no class explains is counted as ``unexplained``.
:func:`synthetic_rows` are deterministic rows at several magnitudes with exact ties, zeros, tiny and
fp16-overflowing values; real rows (post-RoPE K or V, one token's heads per row) go in the same way.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np

from evalkit.errors import EvalkitError

NOT_INSTALLED = "llama.cpp is not installed: pip install -e '.[llamacpp]'"

NONFINITE = "non-finite input"
ZERO_IQ4 = "all-zero block: iq4_nl packs stale indices, values equal"
UNEXPLAINED = "unexplained"
CLASSES = (NONFINITE, ZERO_IQ4, UNEXPLAINED)


class _TypeTraits(ctypes.Structure):  # struct ggml_type_traits (ggml.h)
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


class _TypeTraitsCpu(ctypes.Structure):  # struct ggml_type_traits_cpu (ggml-cpu.h)
    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


_ROW_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def lib_dir() -> Path:
    """The folder holding llama-cpp-python's shared libraries."""
    try:
        import llama_cpp
    except ImportError:
        raise EvalkitError(NOT_INSTALLED) from None
    return Path(llama_cpp.__file__).parent / "lib"


@functools.lru_cache(maxsize=1)
def _libs() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    folder = lib_dir()
    try:
        base = ctypes.CDLL(str(folder / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        cpu = ctypes.CDLL(str(folder / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise EvalkitError(f"llama.cpp's ggml libraries do not load from {folder} ({e}): {NOT_INSTALLED}") from None
    base.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
    base.ggml_get_type_traits.argtypes = [ctypes.c_int]
    base.ggml_row_size.restype = ctypes.c_size_t
    base.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_TypeTraitsCpu)
    cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
    cpu.ggml_cpu_init.restype = None
    cpu.ggml_cpu_init()
    return base, cpu


def _type(name: str) -> int:
    from evalkit.kv.codecs.llamacpp.ggml_blocks import block_type

    return block_type(name).ggml_type


def row_size(type_name: str, n: int) -> int:
    """ggml's bytes for a row of ``n`` values of ``type_name`` (``ggml_row_size``)."""
    return int(_libs()[0].ggml_row_size(_type(type_name), n))


def _rows2d(rows: np.ndarray) -> np.ndarray:
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    return rows.reshape(-1, rows.shape[-1]) if rows.ndim != 1 else rows[None]


def from_float(type_name: str, rows_f32: np.ndarray) -> np.ndarray:
    """Rows (..., n) float32 -> ggml's bytes (..., row_size(n)) uint8: the CPU ``from_float``, one call per
    row, as the KV-cache write makes it."""
    rows = _rows2d(rows_f32)
    t = _type(type_name)
    fn = _ROW_FN(_libs()[1].ggml_get_type_traits_cpu(t).contents.from_float)
    n = rows.shape[-1]
    out = np.zeros((rows.shape[0], row_size(type_name, n)), dtype=np.uint8)
    for i in range(rows.shape[0]):
        fn(rows[i].ctypes.data, out[i].ctypes.data, n)
    return out.reshape(*np.shape(rows_f32)[:-1], -1)


def to_float(type_name: str, data: np.ndarray) -> np.ndarray:
    """ggml bytes (..., row_size(n)) -> float32 (..., n) through the type's ``to_float``."""
    from evalkit.kv.codecs.llamacpp.ggml_blocks import block_type

    bt = block_type(type_name)
    data = np.ascontiguousarray(data, dtype=np.uint8)
    flat = data.reshape(-1, data.shape[-1])
    n = flat.shape[-1] // bt.nbytes * bt.block
    if type_name == "f32":  # ggml has no to_float for f32 (the values are the bytes)
        return flat.view(np.float32).reshape(*data.shape[:-1], n).copy()
    fn = _ROW_FN(_libs()[0].ggml_get_type_traits(bt.ggml_type).contents.to_float)
    out = np.zeros((flat.shape[0], n), dtype=np.float32)
    for i in range(flat.shape[0]):
        fn(flat[i].ctypes.data, out[i].ctypes.data, n)
    return out.reshape(*data.shape[:-1], n)


# -- rows ------------------------------------------------------------------------------------------
SCALES = (1e-3, 1.0, 30.0, 1e4)


def synthetic_rows(seed: int = 0, rows: int = 64, n: int = 256) -> np.ndarray:
    """Deterministic float32 rows (R, n), n a multiple of 32: N(0, 1) at each of :data:`SCALES`; rows
    of exact half-way values (ties for q8_0's and q4's rounding); all-zero rows and rows with single
    zero blocks; tiny (subnormal and near-eps) rows; rows whose amax overflows fp16's scale."""
    rng = np.random.default_rng(seed)
    out = [rng.standard_normal((rows, n)) * s for s in SCALES]
    ties = np.tile(np.array([127.0, 0.5, 1.5, 2.5, -2.5, -0.5, 3.5, -3.5]), n // 8)
    out.append(np.stack([ties, -ties, ties / 8, ties * 2.0**-10]))
    q4 = np.tile(np.arange(-8, 8, dtype=np.float64) + 0.5, n // 16)  # x*id + 8.5 lands on integers
    out.append(np.stack([q4, -q4, q4 * 3]))
    zero = np.zeros((3, n))
    zero[1, 32:64] = rng.standard_normal(32)  # a zero block before and after a real one
    zero[2, 64:] = rng.standard_normal(n - 64) * 1e-16  # below iq4_nl's 1e-15
    out.append(zero)
    out.append(rng.standard_normal((4, n)) * np.array([[1e-40], [1e-38], [1e-30], [1e-20]]))
    big = rng.standard_normal((4, n)) * np.array([[1e7], [3e7], [1e30], [1e38]])
    out.append(big)
    return np.concatenate(out).astype(np.float32)


# -- conformance -----------------------------------------------------------------------------------
def _classify(type_name: str, x: np.ndarray, got: np.ndarray, want: np.ndarray) -> str:
    """The class of one differing block: its input ``x`` (32,), evalkit's and ggml's bytes."""
    from evalkit.kv.codecs.llamacpp.ggml_blocks import GROUP_MAX_EPS

    if not np.isfinite(x).all():
        return NONFINITE
    if type_name == "iq4_nl" and np.abs(x).max() < GROUP_MAX_EPS and (got[:2] == want[:2]).all():
        if not to_float(type_name, got).any() and not to_float(type_name, want).any():
            return ZERO_IQ4
    return UNEXPLAINED


def kernel_conformance(types, rows: np.ndarray) -> list[dict]:
    """Per type: ``{"type", "blocks", "equal", "differences": {class: count}, "examples": [...]}``,
    ggml's ``from_float`` against :func:`evalkit.kv.codecs.llamacpp.ggml_blocks.encode` on the same float32 rows (R, n)
    (``n`` a multiple of 32); ``examples`` names up to 3 differing blocks of each class (row, block)."""
    import torch

    from evalkit.kv.codecs.llamacpp.ggml_blocks import QK, block_type, encode

    rows = _rows2d(rows)
    if rows.shape[-1] % QK:
        raise EvalkitError(f"kernel conformance compares blocks of {QK} values: rows of {rows.shape[-1]} do not divide")
    out = []
    for name in types:
        bt = block_type(name)
        want = from_float(name, rows)
        got = encode(name, torch.from_numpy(rows.copy())).numpy()
        per = bt.nbytes * (QK // bt.block)  # bytes per 32 values
        w = want.reshape(rows.shape[0], -1, per)
        g = got.reshape(rows.shape[0], -1, per)
        x = rows.reshape(rows.shape[0], -1, QK)
        diff = (w != g).any(-1)
        classes: dict[str, int] = {}
        examples: dict[str, list] = {}
        for r, b in zip(*np.nonzero(diff)):
            c = _classify(name, x[r, b], g[r, b], w[r, b])
            classes[c] = classes.get(c, 0) + 1
            if len(examples.setdefault(c, [])) < 3:
                examples[c].append(
                    {
                        "row": int(r),
                        "block": int(b),
                        "evalkit": g[r, b].tobytes().hex(),
                        "ggml": w[r, b].tobytes().hex(),
                    }
                )
        out.append(
            {
                "type": name,
                "blocks": int(diff.size),
                "equal": int(diff.size - diff.sum()),
                "differences": classes,
                "examples": examples,
            }
        )
    return out
