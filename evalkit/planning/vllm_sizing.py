"""How each vLLM release sizes its KV cache on a GPU: the block size, the memory share and the reserve.

``capacity --vllm-version X`` counts with these; without it the count is evalkit's plain one (no block
rounding, ``--utilization`` 0.9, the reserve estimate). Read in the released wheels' source:

- 0.32, 0.33: ``CacheConfig.DEFAULT_BLOCK_SIZE = 16`` (0.32 ``vllm/config/cache.py:72``, 0.33 ``:185``);
  ``gpu_memory_utilization`` defaults to 0.92 (0.32 ``cache.py:102``, 0.33 ``:215``); the cache is
  ``ceil(total x utilization)`` (``vllm/v1/worker/utils.py`` ``request_memory``) less the weights, the
  profiled activation peak and the CUDA graph estimate.
- 0.34: ``DEFAULT_BLOCK_SIZE = 64`` (``vllm/config/cache.py:185``); ``gpu_memory_utilization`` defaults
  to None (``cache.py:216``), resolved as 1.0 with the extensible KV cache and 0.92 without
  (``CacheConfig.resolved_gpu_memory_utilization``, ``cache.py:495-501``); ``enable_extensible_kv_cache``
  is on where unset on CUDA and ROCm (``VllmConfig._resolve_extensible_kv_cache``,
  ``vllm/config/vllm.py:3181-3254``): the cache is sized after warm-up and CUDA graph capture from the
  memory actually free (``vllm/v1/worker/extensible_kv_cache.py:592-618`` ``measure_kv_cache_bytes``)::

      available = min(requested - non_kv_used, headroom - margin) - max(transient_peak, torch growth)
      margin    = max(1 GiB (3 GiB on ROCm), 0.75 x transient_peak)       (extensible_kv_cache.py:64-65)

  With nothing else on the GPU, ``requested - non_kv_used`` = ``ceil(total x utilization) - weights -
  graphs`` and ``headroom`` = ``total - weights - graphs``, so per rank::

      KV budget = min(ceil(total x utilization), total - margin) - weights - graphs - peak

  evalkit puts its activation estimate (:mod:`evalkit.planning.reserve`) for the transient peak
  (``reserved_headroom_bytes`` is the profiled ``peak_activation_memory``, ``gpu_worker.py``
  ``initialize_from_config``) and its CUDA graph estimate for the graphs' measured footprint.

The blocks (``vllm/v1/core/kv_cache_planning.py``: 0.33 ``:681``, 0.34 ``:724``) are
``available // bytes_per_block``: whole blocks of ``block_size`` tokens, and a request at the context
takes ``ceil(context / block_size)`` of them (``get_max_concurrency_for_kv_cache_config``). An attention
backend that prefers another block size (FlashMLA: 64) sets its own
(``Platform.update_block_size_for_backend``); the default is what a backend without a preference gets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from evalkit.errors import EvalkitError

GIB = 2**30
MARGIN_FLOOR = {"cuda": 1 * GIB, "rocm": 3 * GIB}  # KV_CACHE_MARGIN_FLOOR_BYTES (extensible_kv_cache.py:64)
MARGIN_FRACTION = 0.75  # KV_CACHE_MARGIN_FRACTION (extensible_kv_cache.py:65)


@dataclass(frozen=True)
class VllmSizing:
    """One release's KV cache sizing defaults on a GPU."""

    version: str
    block_size: int  # CacheConfig.DEFAULT_BLOCK_SIZE
    utilization: float  # gpu_memory_utilization when not given (resolved)
    extensible: bool  # enable_extensible_kv_cache on by default on CUDA/ROCm
    source: str

    def margin(self, peak: int, platform: str = "cuda") -> int:
        """Memory the extensible cache keeps free beside the transient peak (0 without it)."""
        if not self.extensible:
            return 0
        return max(MARGIN_FLOOR[platform], int(peak * MARGIN_FRACTION))

    def usable(self, memory: int, utilization: float, peak: int, platform: str = "cuda") -> int:
        """Bytes of the GPU's ``memory`` the weights, the reserve and the cache may share."""
        share = math.ceil(memory * utilization)
        return min(share, memory - self.margin(peak, platform)) if self.extensible else share

    def describe(self) -> str:
        mode = (
            "extensible KV cache (sized from memory free after CUDA graph capture, less max(1 GiB, 0.75 x the "
            "transient peak))"
            if self.extensible
            else "estimate-based sizing (ceil(memory x utilization) less weights and the profiled reserve)"
        )
        return (
            f"vLLM {self.version}: block size {self.block_size}, gpu_memory_utilization default "
            f"{self.utilization:g}, {mode} ({self.source})"
        )


SIZING = {
    "0.32": VllmSizing("0.32", 16, 0.92, False, "vllm 0.32.0 vllm/config/cache.py:72,102"),
    "0.33": VllmSizing("0.33", 16, 0.92, False, "vllm 0.33.0 vllm/config/cache.py:185,215"),
    "0.34": VllmSizing(
        "0.34",
        64,
        1.0,
        True,
        "vllm 0.34.0 vllm/config/cache.py:185,216,495-501; vllm/config/vllm.py:3181-3254; "
        "vllm/v1/worker/extensible_kv_cache.py:64-65,592-618",
    ),
}


def vllm_sizing(version: str) -> VllmSizing:
    """The sizing of vLLM ``version`` (``0.34`` or ``0.34.0``), or one line naming the versions known."""
    key = ".".join(str(version).strip().split(".")[:2])
    if key not in SIZING:
        raise EvalkitError(
            f"--vllm-version {version}: evalkit knows how vLLM {', '.join(SIZING)} size the KV cache: use one of those"
        )
    return SIZING[key]
