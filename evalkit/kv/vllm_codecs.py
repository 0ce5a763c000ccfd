"""vLLM's rotation-based KV cache dtypes as codecs: one entry per ``kv_cache_dtype`` whose store does
more than scale-and-round one tensor (a rotation, a codebook, different K and V formats, one packed
slot per head), so that the storage path, byte counts and scheme strings read one table.

Each :class:`Codec` says, for ``vllm:<name>``:

- the scheme it is (``format``/``granularity``/``scale_dtype`` plus ``recipe=vllm_<name>``, fixed:
  :func:`check_scheme` refuses any other combination in one line);
- ``encode(x, role)``: K or V (B, H, S, D) -> a :class:`~evalkit.kv.quantize.Quantized` whose
  ``stored`` holds exactly the engine's bytes for that side of each (token, head) slot (codes,
  scales, zero points, norms packed as the kernel packs them) and whose ``values`` are what the
  engine's attention reads, back in the original (unrotated) space; its ``scale`` is empty (the
  scales live inside ``stored``, so byte counts see them once);
- ``decode(stored, role, head_dim)``: those bytes -> the same values (float32), read independently
  of ``encode`` (tests hold the two equal);
- ``width(role, head_dim)``: the bytes of one side of one slot; a test holds K + V to vLLM's
  ``page_size_bytes`` per token and head;
- ``check_head_size``: the head sizes the engine's kernels take (one-line refusal otherwise);
- ``boundary_layers``: TurboQuant and UltraQuant keep the first and last ``min(2, layers // 2)``
  attention layers in the model's dtype (``TurboQuantConfig.get_boundary_skip_layers``, added by
  ``vllm/engine/arg_utils.py`` to ``kv_cache_dtype_skip_layers`` for every non-hybrid model);
- ``roles_alike``: K and V are stored by the same arithmetic (INT4 per token-head), so the storage
  cache may encode the two in one call (:func:`evalkit.integration.stored.append_pair`);
- ``prefill_reads_raw``: TurboQuant and UltraQuant attend a first-chunk prefill from the raw K/V it
  was given (``_prefill_attention``: flash-attention, or SDPA, on ``key``/``value``), and read the
  cache only in decode and continuation chunks; the storage cache does the same.

The codecs: :mod:`evalkit.kv.int4_per_token_head`, :mod:`evalkit.kv.turboquant`,
:mod:`evalkit.kv.ultraquant`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from evalkit.errors import SchemeError
from evalkit.kv.formats import Recipe, Rounding, ScaleDType
from evalkit.kv.quantize import Quantized
from evalkit.kv.scheme import Granularity, GranularityKind, ScaleSource

TOKEN = Granularity(GranularityKind.TOKEN)


@dataclass(frozen=True)
class Codec:
    name: str  # vLLM's kv_cache_dtype
    recipe: Recipe
    format: str
    granularity: Granularity
    encode: Callable[[torch.Tensor, str], Quantized]
    decode: Callable[[torch.Tensor, str, int], torch.Tensor]
    width: Callable[[str, int], int]
    check_head_size: Callable[[int], None]
    scale_dtype: ScaleDType = ScaleDType.FP32
    boundary_layers: int = 0
    prefill_reads_raw: bool = False
    mla: bool = False  # a DeepSeek MLA row (evalkit.kv.ds_mla): role "k" is the latent, "v" the RoPE key
    roles_alike: bool = False  # encode ignores the role (K and V stored alike): one call may store both
    engine: str = "vllm"  # whose cache this is: the scheme prints as <engine>:<name> (llamacpp: kv.llamacpp_codecs)

    def boundary(self, num_layers: int) -> set[int]:
        """The attention layers vLLM keeps unquantized for this dtype on a model of ``num_layers``."""
        n = min(self.boundary_layers, num_layers // 2)
        return set(range(n)) | set(range(num_layers - n, num_layers)) if n > 0 else set()


def packed(codes: torch.Tensor, stored: torch.Tensor, values: torch.Tensor, nonfinite: torch.Tensor) -> Quantized:
    """A codec's :class:`Quantized`: the engine's bytes, the values attention reads, no separate scale."""
    empty = codes.new_zeros(*codes.shape[:-1], 0)
    return Quantized(codes, empty, None, TOKEN, nonfinite, stored=stored, values=values)


def float32_bytes(t: torch.Tensor) -> torch.Tensor:
    """float32 (..., 1) -> its 4 little-endian bytes (..., 4) uint8."""
    return t.contiguous().view(torch.uint8)


def float16_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float16).contiguous().view(torch.uint8)


def bytes_float16(b: torch.Tensor) -> torch.Tensor:
    """(..., 2) uint8 -> (..., 1) float32 read as float16."""
    return b.contiguous().view(torch.float16).float()


def bytes_float32(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float32)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Integer codes 0..15 (..., D) -> (..., D/2) uint8, element 2i in the low nibble (vLLM's order)."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_nibbles(b: torch.Tensor) -> torch.Tensor:
    return torch.stack((b & 0xF, b >> 4), dim=-1).reshape(*b.shape[:-1], b.shape[-1] * 2)


def pack_3bit(codes: torch.Tensor) -> torch.Tensor:
    """Codes 0..7 (..., D), D a multiple of 8 -> (..., 3D/8) uint8: each 8 codes as one 24-bit word,
    code j at bits 3j, stored little-endian (TurboQuant's 3-bit packing)."""
    c = codes.to(torch.int32).reshape(*codes.shape[:-1], -1, 8)
    word = (c << (torch.arange(8, device=c.device, dtype=torch.int32) * 3)).sum(-1)
    out = torch.stack(((word & 0xFF), (word >> 8) & 0xFF, (word >> 16) & 0xFF), dim=-1)
    return out.to(torch.uint8).reshape(*codes.shape[:-1], -1)


def unpack_3bit(b: torch.Tensor) -> torch.Tensor:
    w = b.to(torch.int32).reshape(*b.shape[:-1], -1, 3)
    word = w[..., 0] | (w[..., 1] << 8) | (w[..., 2] << 16)
    shifts = torch.arange(8, device=b.device, dtype=torch.int32) * 3
    return ((word[..., None] >> shifts) & 7).reshape(*b.shape[:-1], -1)


def _codecs() -> dict[Recipe, Codec]:
    from evalkit.kv import ds_mla, int4_per_token_head, llamacpp_codecs, nvfp4_kv, turboquant, ultraquant

    return {
        c.recipe: c
        for c in (
            int4_per_token_head.CODEC,
            *turboquant.CODECS,
            ultraquant.CODEC,
            *ds_mla.CODECS,
            *nvfp4_kv.CODECS,
            *llamacpp_codecs.CODECS,
        )
    }


_TABLE: dict[Recipe, Codec] | None = None


def codecs() -> dict[Recipe, Codec]:
    global _TABLE
    if _TABLE is None:
        _TABLE = _codecs()
    return _TABLE


CODEC_RECIPES = frozenset(
    {
        Recipe.VLLM_INT4_PER_TOKEN_HEAD,
        Recipe.VLLM_TURBOQUANT_K8V4,
        Recipe.VLLM_TURBOQUANT_4BIT_NC,
        Recipe.VLLM_TURBOQUANT_K3V4_NC,
        Recipe.VLLM_TURBOQUANT_3BIT_NC,
        Recipe.VLLM_ULTRAQUANT_4BIT,
        Recipe.VLLM_FP8_DS_MLA,
        Recipe.VLLM_NVFP4_DS_MLA,
        Recipe.VLLM_NVFP4,
        Recipe.VLLM_NVFP4_4OVER6,
        *(r for r in Recipe if r.value.startswith("llamacpp_")),  # llama.cpp's pairs (kv.llamacpp_codecs)
    }
)


def is_codec(recipe: Recipe) -> bool:
    return recipe in CODEC_RECIPES


def codec_for(recipe: Recipe) -> Codec:
    return codecs()[recipe]


def one_forward_reads_raw(scheme) -> bool:
    """Whether a scheme's engine attends a sequence's first write from the raw K/V it was given
    (``prefill_reads_raw``): then an evaluation of one forward per sequence (perplexity windows, lm-eval
    log-likelihoods) reads nothing quantized, and its numbers are the baseline's, not the cache's cost.
    ``scheme``: a Scheme or its text."""
    from evalkit.kv.scheme import parse_scheme

    recipe = parse_scheme(scheme).kv_format.recipe if isinstance(scheme, str) else scheme.kv_format.recipe
    return is_codec(recipe) and codec_for(recipe).prefill_reads_raw


def by_name(name: str) -> Codec | None:
    return next((c for c in codecs().values() if c.name == name and c.engine == "vllm"), None)


def check_scheme(scheme) -> None:
    """A ``recipe=vllm_<dtype>`` scheme must be exactly the codec's: refuse anything else in one line."""
    c = codec_for(scheme.recipe)
    want = (c.format, c.granularity, ScaleSource.DYNAMIC, c.scale_dtype, False, Rounding.RNE, None)
    got = (
        scheme.format,
        scheme.granularity,
        scheme.scales,
        scheme.scale_dtype,
        scheme.tensor_scale,
        scheme.rounding,
        scheme.static_path,
    )
    if got != want and c.engine == "llamacpp":
        raise SchemeError(
            f"recipe={scheme.recipe.value} is llama.cpp's {c.name} cache, which fixes its blocks, scales and "
            f"rounding: write llamacpp:{c.name}"
        )
    if got != want:
        raise SchemeError(
            f"recipe={scheme.recipe.value} is vLLM's {c.name} store, which fixes its formats, scales and rounding: "
            f"write vllm:{c.name}"
        )


def scheme_for(name: str, **options):
    """The :class:`~evalkit.kv.scheme.Scheme` modelling ``--kv-cache-dtype name`` (``options``: skip/attn/rope)."""
    from evalkit.kv.scheme import Scheme

    c = by_name(name)
    return Scheme(
        format=c.format,
        granularity=c.granularity,
        scales=ScaleSource.DYNAMIC,
        scale_dtype=c.scale_dtype,
        recipe=c.recipe,
        **options,
    )
