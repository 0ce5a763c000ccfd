"""Slot codecs: engine cache types whose store does more than scale-and-round one tensor (a rotation, a
codebook, different K and V formats, one packed slot per head), and the family made of a table of them.

Each :class:`Codec` says, for ``<prefix>:<name>``:

- the scheme it is (``format``/``granularity``/``scale_dtype`` plus its recipe, fixed:
  :meth:`SlotFamily.check` refuses any other combination in one line);
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
  cache only in decode and continuation chunks; the storage cache does the same;
  ``raw_prefill_over``: only a first write of more than that many tokens does (vLLM's Octave: a step of at
  most 128 query tokens reads every token from the packed cache);
- ``rope_aware``: the slot depends on how many dims RoPE rotates (vLLM's Octave: 4-bit codes there, 3-bit
  elsewhere): ``encode``/``decode``/``width`` then take the model's ``rope_dim`` (``KVLayout.rotary_dim``,
  bound into the format as ``KVFormat.rope_dim``; None: every dim, vLLM's default);
- ``numerics_group``: a codec added after its family's numbers were pinned is fingerprinted in a group of
  its own (tests/numerics), so adding it moves no existing pin;
- ``mla``: a DeepSeek MLA row, whose role ``k`` is the latent and ``v`` the RoPE key.

The families: :mod:`evalkit.kv.codecs.vllm` (``int4_per_token_head``, ``turboquant_*``,
``ultraquant_4bit``, ``nvfp4*``, the MLA rows), :mod:`evalkit.kv.codecs.llamacpp` (every type pair),
:mod:`evalkit.kv.codecs.dsv4` (the DeepSeek V4 records) and :mod:`evalkit.kv.codecs.sglang` (``mxfp8``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from evalkit.errors import SchemeError
from evalkit.kv.codec import CodecFamily
from evalkit.kv.formats import CodecRecipe, Rounding, ScaleDType
from evalkit.kv.quantize import Quantized
from evalkit.kv.scheme import Granularity, GranularityKind, ScaleSource, Scheme

TOKEN = Granularity(GranularityKind.TOKEN)


@dataclass(frozen=True)
class Codec:
    name: str  # the family's name for it: vLLM's kv_cache_dtype, llama.cpp's k[/v] pair
    recipe: CodecRecipe
    format: str
    granularity: Granularity
    encode: Callable[[torch.Tensor, str], Quantized]
    decode: Callable[[torch.Tensor, str, int], torch.Tensor]
    width: Callable[[str, int], int]
    check_head_size: Callable[[int], None]
    scale_dtype: ScaleDType = ScaleDType.FP32
    boundary_layers: int = 0
    prefill_reads_raw: bool = False
    mla: bool = False  # a DeepSeek MLA row (evalkit.kv.codecs.vllm.ds_mla): role "k" is the latent, "v" the RoPE key
    roles_alike: bool = False  # encode ignores the role (K and V stored alike): one call may store both
    raw_prefill_over: int = 0  # with prefill_reads_raw: a first write of more tokens than this attends raw K/V
    rope_aware: bool = False  # encode/decode/width take rope_dim (the model's rotary dims; None: every dim)
    numerics_group: str | None = None  # its own fingerprint group (tests/numerics), apart from its family's

    def rope(self, rope_dim: int | None) -> dict:
        """The keyword a rope-aware codec's functions take (``{}`` for the others)."""
        return {"rope_dim": rope_dim} if self.rope_aware else {}

    def reads_raw(self, tokens: int) -> bool:
        """Whether a sequence's first write of ``tokens`` tokens attends the raw K/V it was given."""
        return self.prefill_reads_raw and tokens > self.raw_prefill_over

    @property
    def chunked_like_turboquant(self) -> bool:
        """Whether evalkit models this codec's chunked prefill: vLLM's TurboQuant/UltraQuant, whose continuation
        chunks were read in its source (:mod:`evalkit.integration.chunked`); Octave's 128-token rule is not."""
        return self.prefill_reads_raw and not self.raw_prefill_over

    def boundary(self, num_layers: int) -> set[int]:
        """The attention layers the engine keeps unquantized for this type on a model of ``num_layers``."""
        n = min(self.boundary_layers, num_layers // 2)
        return set(range(n)) | set(range(num_layers - n, num_layers)) if n > 0 else set()


def packed(codes: torch.Tensor, stored: torch.Tensor, values: torch.Tensor, nonfinite: torch.Tensor) -> Quantized:
    """A codec's :class:`Quantized`: the engine's bytes, the values attention reads, no separate scale."""
    empty = codes.new_zeros(*codes.shape[:-1], 0)
    return Quantized(codes, empty, None, TOKEN, nonfinite, stored=stored, values=values)


class SlotFamily(CodecFamily):
    """A codec family made of a table of :class:`Codec`: its recipes, names, schemes, refusals and stores
    are the codecs'. ``kind`` and ``fixes`` word the refusal of a long form (``vLLM's nvfp4 store, which
    fixes its formats``; ``llama.cpp's q8_0 cache, which fixes its blocks``)."""

    kind = "store"
    fixes = "formats"

    def __init__(self, codecs: Iterable[Codec]):
        self.codecs = {c.recipe: c for c in codecs}

    def recipes(self) -> tuple[CodecRecipe, ...]:
        return tuple(self.codecs)

    def names(self) -> list[str]:
        return [c.name for c in self.codecs.values()]

    def codec(self, recipe: CodecRecipe) -> Codec | None:
        return self.codecs.get(recipe)

    def by_name(self, name: str) -> Codec | None:
        return next((c for c in self.codecs.values() if c.name == name), None)

    def scheme(self, codec: Codec, options: dict) -> Scheme:
        """The scheme that is ``codec`` (``options``: skip/attn/rope fields)."""
        return Scheme(
            format=codec.format,
            granularity=codec.granularity,
            scales=ScaleSource.DYNAMIC,
            scale_dtype=codec.scale_dtype,
            recipe=codec.recipe,
            **options,
        )

    def scheme_name(self, scheme: Scheme) -> str:
        return f"{self.prefix}:{self.codecs[scheme.recipe].name}"

    def check(self, scheme: Scheme) -> None:
        c = self.codecs[scheme.recipe]
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
        if got != want:
            raise SchemeError(
                f"recipe={scheme.recipe.value} is {self.engine}'s {c.name} {self.kind}, which fixes its "
                f"{self.fixes}, scales and rounding: write {self.prefix}:{c.name}"
            )

    def quantize(self, x: torch.Tensor, fmt, role: str) -> Quantized:
        c = self.codecs[fmt.recipe]
        return c.encode(x, role, **c.rope(fmt.rope_dim))
