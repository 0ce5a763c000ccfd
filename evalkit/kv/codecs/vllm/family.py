"""vLLM's ``kv_cache_dtype`` values as a codec family: ``vllm:<kv_cache_dtype>``.

Every dtype of :data:`evalkit.kv.codecs.vllm.dtypes.VLLM_DTYPES` parses here: to evalkit's own scheme
for the per-tensor FP8 and 16-bit ones (``vllm:fp8`` is ``fp8_e4m3/tensor/unit``), to the family's
recipes for the rest, or to a one-line refusal saying what the kernel does and where it is. The
recipes are the per-token-head store (:mod:`~evalkit.kv.codecs.vllm.per_token_head`: codes and a
float32 scale per token and head, kept as evalkit's token-granularity schemes keep them, printed back
as ``vllm:int8_per_token_head`` / ``vllm:fp8_per_token_head``) and the slot codecs
(:mod:`evalkit.kv.codecs.slot`): ``int4_per_token_head``, ``turboquant_*``, ``ultraquant_4bit``,
``nvfp4``/``nvfp4_4over6``, the DeepSeek MLA rows ``fp8_ds_mla``/``nvfp4_ds_mla`` and vLLM 0.33's ROCm
``octave_*`` caches (:mod:`~evalkit.kv.codecs.vllm.octave`). Each also
parses from its long form (``int4_asym/token/dynamic+recipe=vllm_int4_per_token_head``), which must be
exactly the dtype's.

Where they apply (:meth:`VllmFamily.check_layout`): the per-token-head and rotation dtypes run on
standard attention only (vLLM's Triton or FlashInfer backends; no MLA backend of vLLM 0.32 lists
them), at the head sizes their kernels take, K and V of one head size per slot; the MLA rows on a
512-value latent with a 64-value RoPE key only.
"""

from __future__ import annotations

import dataclasses

import torch

from evalkit.errors import SchemeError
from evalkit.kv.codec import register_family
from evalkit.kv.codecs.slot import Codec, SlotFamily
from evalkit.kv.codecs.vllm import ds_mla, int4_per_token_head, nvfp4, octave, per_token_head, turboquant, ultraquant
from evalkit.kv.codecs.vllm.dtypes import VLLM_DTYPES, Status, get_dtype
from evalkit.kv.formats import CodecRecipe, Rounding, ScaleDType
from evalkit.kv.quantize import Quantized
from evalkit.kv.scheme import Granularity, GranularityKind, ScaleSource, Scheme, parse_scheme

PER_TOKEN_HEAD = per_token_head.RECIPE


class VllmFamily(SlotFamily):
    prefix = "vllm"
    engine = "vLLM"
    grammar = "vllm:<kv_cache_dtype>[+skip=...] (see --engine vllm)"

    def __init__(self):
        super().__init__(
            (
                int4_per_token_head.CODEC,
                *turboquant.CODECS,
                ultraquant.CODEC,
                *ds_mla.CODECS,
                *nvfp4.CODECS,
                *octave.CODECS,
            )
        )

    def recipes(self) -> tuple[CodecRecipe, ...]:
        return (PER_TOKEN_HEAD, *self.codecs)

    def names(self) -> list[str]:
        return list(VLLM_DTYPES)

    def parse(self, name: str, options: dict) -> Scheme:
        """The scheme that models ``--kv-cache-dtype name``; ``options`` are ``skip``/``attn``/``rope`` fields."""
        d = get_dtype(name)
        if d.status in (Status.NOT_MODELLED, Status.REFUSED):
            label = "is not modelled yet" if d.status is Status.NOT_MODELLED else "is refused"
            raise SchemeError(f"vllm:{name} {label}: {d.what} ({d.source}, {d.function})")
        codec = self.by_name(name)
        if codec is not None:  # rotation dtypes, NVFP4, the MLA rows: slot codecs
            return self.scheme(codec, options)
        if name in per_token_head.DTYPES:
            return Scheme(
                format=per_token_head.DTYPES[name],
                granularity=Granularity(GranularityKind.TOKEN),
                scales=ScaleSource.DYNAMIC,
                recipe=PER_TOKEN_HEAD,
                **options,
            )
        scheme = parse_scheme(d.scheme)
        if options and scheme.is_unscaled:
            raise SchemeError(f"vllm:{name} keeps K/V unquantized and takes no options: write just 'vllm:{name}'")
        return dataclasses.replace(scheme, **options)

    def scheme_name(self, scheme: Scheme) -> str:
        if scheme.recipe == PER_TOKEN_HEAD:
            return "vllm:" + next(n for n, f in per_token_head.DTYPES.items() if f == scheme.format)
        return super().scheme_name(scheme)

    def check(self, scheme: Scheme) -> None:
        if scheme.recipe != PER_TOKEN_HEAD:
            super().check(scheme)
            return
        fixed = (GranularityKind.TOKEN, ScaleSource.DYNAMIC, ScaleDType.FP32, False, Rounding.RNE)
        got = (scheme.granularity.kind, scheme.scales, scheme.scale_dtype, scheme.tensor_scale, scheme.rounding)
        if scheme.format not in per_token_head.DTYPES.values() or got != fixed:
            raise SchemeError(
                "recipe=vllm_per_token_head is vLLM's per-token-head store, which fixes token/dynamic float32 "
                "scales and its own rounding: write vllm:int8_per_token_head or vllm:fp8_per_token_head"
            )

    def check_layout(self, scheme: Scheme, is_mla: bool, head_dims: tuple[int, ...]) -> None:
        """Refuse, in one line, a vLLM dtype on a model vLLM would not run it for."""
        codec = self.codec(scheme.recipe)
        if codec is None:  # the per-token-head store
            name = self.scheme_name(scheme)
            if is_mla:
                raise SchemeError(
                    f"{name} is a per-token-head dtype of vLLM's Triton attention backend; no MLA backend of vLLM "
                    "0.32 takes it: use vllm:fp8 (a per-tensor latent) for this multi-head latent attention model"
                )
            for d in head_dims:
                per_token_head.check_head_size(d)
        elif codec.mla:  # a DeepSeek MLA row (head_dims: latent and RoPE widths on MLA)
            ds_mla.check_layout(codec.name, is_mla, head_dims, scheme.rope_bf16)
        else:
            _check_slot_layout(codec, is_mla, head_dims)

    def quantize(self, x: torch.Tensor, fmt, role: str) -> Quantized:
        if fmt.recipe == PER_TOKEN_HEAD:  # vLLM's per-token-head store kernel, modelled on its own
            return per_token_head.quantize_per_token_head(x, fmt)
        return super().quantize(x, fmt, role)


def _check_slot_layout(codec: Codec, is_mla: bool, head_dims: tuple[int, ...]) -> None:
    """A rotation dtype on a model vLLM would not run it for: MLA, a head size its kernels refuse, K and V
    of different widths (one head_size per slot)."""
    if is_mla:
        raise SchemeError(
            f"vllm:{codec.name} is a standard-attention dtype of vLLM; no MLA backend of vLLM 0.32 takes it: use "
            "vllm:fp8 (a per-tensor latent) for this multi-head latent attention model"
        )
    if len(set(head_dims)) > 1:
        raise SchemeError(
            f"vllm:{codec.name} stores K and V of one head_size per slot, not K {head_dims[0]} and V {head_dims[1]}: "
            "use vllm:fp8 for this model"
        )
    for d in dict.fromkeys(head_dims):
        codec.check_head_size(d)


FAMILY = register_family(VllmFamily())


def vllm_scheme(name: str, options: dict | None = None) -> Scheme:
    """The scheme that models ``--kv-cache-dtype name`` (``vllm:<name>``); ``options``: skip/attn/rope fields."""
    return FAMILY.parse(name, options or {})
