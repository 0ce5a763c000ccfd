"""Every ``kv_cache_dtype`` of the installed vLLM: the scheme that models it (or why none does), the
kernel it was read from, the backend that serves it and its bytes per token on a model.

The per-dtype facts (scheme or one-line reason, kernel file and function, architecture) are
:data:`evalkit.kv.codecs.vllm.dtypes.VLLM_DTYPES`: they sit in ``kv`` because ``vllm:<dtype>`` must parse
wherever a scheme does, without vLLM. This module adds what needs vLLM itself:

- :func:`installed_dtypes`: the ``CacheDType`` values of the installed vLLM, read at run time
  (``vllm/config/cache.py``), so a newer vLLM's additions show up as :func:`unknown_dtypes`;
- :data:`BACKENDS`: the attention backend that serves each dtype on standard attention (GQA) and on
  MLA, as its ``supported_kv_cache_dtypes`` lists it (``None``: no backend of that architecture
  takes it, so the dtype is refused for such a model);
- :func:`rows`: one row per installed dtype for a model: status, scheme (or reason), vLLM's bytes
  per token (:mod:`evalkit.engines.vllm.pages`), evalkit's bytes per token for the scheme, source.
"""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass

from evalkit.errors import SchemeError
from evalkit.kv.codecs.vllm.dtypes import VLLM_DTYPES, Status, VllmDtype
from evalkit.kv.codecs.vllm.family import vllm_scheme
from evalkit.models.info import KVLayout

_B = "vllm.v1.attention.backends."
FLASH_ATTN = _B + "flash_attn:FlashAttentionBackend"
TRITON_ATTN = _B + "triton_attn:TritonAttentionBackend"
TURBOQUANT = _B + "turboquant_attn:TurboQuantAttentionBackend"
ULTRAQUANT = _B + "ultraquant_attn:UltraQuantAttentionBackend"
FLASHINFER = _B + "flashinfer:FlashInferBackend"
FLASHMLA = _B + "mla.flashmla:FlashMLABackend"
FLASHMLA_SPARSE = _B + "mla.flashmla_sparse:FlashMLASparseBackend"
ROCM_AITER_MLA = _B + "mla.rocm_aiter_mla:AiterMLABackend"  # the one MLA backend that lists fp8_e5m2 (ROCm)
ROCM_OCTAVE = _B + "rocm_octave_attn:RocmOctaveAttentionBackend"  # vLLM 0.33+ (ROCm)

# dtype -> (backend on standard attention, backend on MLA); None: no backend of that kind lists it
BACKENDS: dict[str, tuple[str | None, str | None]] = {
    "auto": (FLASH_ATTN, FLASHMLA),
    "float16": (FLASH_ATTN, FLASHMLA),
    "bfloat16": (FLASH_ATTN, FLASHMLA),
    "fp8": (FLASH_ATTN, FLASHMLA),
    "fp8_e4m3": (FLASH_ATTN, FLASHMLA),
    "fp8_e5m2": (TRITON_ATTN, ROCM_AITER_MLA),
    "fp8_inc": (None, None),
    "int8_per_token_head": (TRITON_ATTN, None),
    "fp8_per_token_head": (TRITON_ATTN, None),
    "int4_per_token_head": (TRITON_ATTN, None),
    "turboquant_k8v4": (TURBOQUANT, None),
    "turboquant_4bit_nc": (TURBOQUANT, None),
    "turboquant_k3v4_nc": (TURBOQUANT, None),
    "turboquant_3bit_nc": (TURBOQUANT, None),
    "ultraquant_4bit": (ULTRAQUANT, None),
    "nvfp4": (FLASHINFER, None),
    "nvfp4_4over6": (FLASHINFER, None),
    "fp8_ds_mla": (None, FLASHMLA_SPARSE),
    "nvfp4_ds_mla": (None, FLASHMLA_SPARSE),
    "octave_k3v4": (ROCM_OCTAVE, None),
    "octave_k3v3": (ROCM_OCTAVE, None),
    "octave_k3v3_compact": (ROCM_OCTAVE, None),
}


def installed_dtypes() -> tuple[str, ...]:
    """vLLM's ``CacheDType`` values, read from the installed package."""
    from vllm.config.cache import CacheDType

    return typing.get_args(CacheDType)


def unknown_dtypes() -> list[str]:
    """Installed dtypes this table does not know (a newer vLLM): each must be modelled or refused here."""
    return [d for d in installed_dtypes() if d not in VLLM_DTYPES or d not in BACKENDS]


def backend_for(name: str, layout: KVLayout) -> str | None:
    return BACKENDS[name][1 if layout.is_mla else 0]


def applies(d: VllmDtype, layout: KVLayout) -> str | None:
    """Why ``d`` does not apply to the model (one line), or None."""
    if backend_for(d.name, layout) is None:
        arch = "multi-head latent attention" if layout.is_mla else "standard (MHA/GQA) attention"
        return f"does not apply: no attention backend of vLLM 0.32 for {arch} lists {d.name} (CUDA backends)"
    return None


@dataclass(frozen=True)
class Row:
    kv_cache_dtype: str
    status: str
    scheme: str | None
    reason: str | None  # not modelled / refused / does not apply to this model
    what: str
    source: str
    function: str
    backend: str | None
    vllm_bytes_per_token: int | None
    evalkit_bytes_per_token: float | None
    page_how: str | None

    def to_dict(self) -> dict:
        return asdict(self)


def row(name: str, layout: KVLayout, pages: bool = True) -> Row:
    from evalkit.kv.memory import bytes_per_token, check_layout_scheme

    d = VLLM_DTYPES[name]
    backend, reason, scheme, ours = backend_for(name, layout), applies(d, layout), None, None
    if d.status is Status.REFUSED:
        reason = f"refused: {d.what}"
    applicable = reason is None
    if applicable and d.status in (Status.MODELLED, Status.BASELINE):
        try:
            parsed = vllm_scheme(name)
            check_layout_scheme(parsed, layout)
            scheme, ours = str(parsed), float(bytes_per_token(layout, parsed))
        except SchemeError as exc:  # e.g. a head size the backend does not take
            reason, applicable = f"does not apply: {exc}", False
    elif applicable:
        reason = f"{d.status.value}: {d.what} ({d.source})"
    vllm_bytes = how = None
    if pages and applicable:
        from evalkit.engines.vllm.pages import page

        p = page(name, layout, backend)
        vllm_bytes, how = p.per_token, p.how
    return Row(name, d.status.value, scheme, reason, d.what, d.source, d.function, backend, vllm_bytes, ours, how)


def rows(layout: KVLayout, pages: bool = True) -> list[Row]:
    """One :class:`Row` per installed dtype (the table's order where it knows it)."""
    unknown = unknown_dtypes()
    if unknown:
        raise SchemeError(
            f"the installed vLLM has kv_cache_dtype(s) evalkit does not know: {', '.join(unknown)}: "
            "add them to evalkit/kv/codecs/vllm/dtypes.py and evalkit/engines/vllm/dtypes.py (modelled or refused)"
        )
    return [row(name, layout, pages) for name in installed_dtypes()]
