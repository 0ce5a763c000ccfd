"""llama.cpp's KV cache types as evalkit schemes: ``llamacpp:<k>[/<v>]``, one codec per pair.

``--cache-type-k/-v`` take ``f32 f16 bf16 q8_0 q4_0 q4_1 iq4_nl q5_0 q5_1`` (common/arg.cpp); each
``(type_k, type_v)`` pair is a slot codec (:mod:`evalkit.kv.codecs.slot`) with its own recipe
(``llamacpp_<k>_<v>``), so that the storage cache, the byte counts and the scheme strings reach it the
way they reach vLLM's rotation dtypes. ``llamacpp:q8_0`` is K and V
both q8_0 (equal types print once); ``llamacpp:q8_0/q4_0`` is K q8_0, V q4_0; ``+skip=`` (and
``+attn=``) follow as for ``vllm:`` schemes.

What a codec models (llama.cpp's CPU backend, the cache write of ``llama_kv_cache::cpy_k``/``cpy_v``):

- the rotation: with a quantized type and ``head_dim % 64 == 0``, K is multiplied by the ``nrot``-point
  normalised Walsh-Hadamard matrix (``nrot`` the largest power of two dividing ``head_dim``), V by the
  64-point one, per head, in float32 as the CPU's FWHT does (:func:`.ggml_blocks.fwht_llamacpp`);
  no rotation for f16/bf16/f32 or another head_dim (``LLAMA_ATTN_ROT_DISABLE`` unset);
- the bytes: each token's row of ``n_head_kv * head_dim`` values encoded by the type's CPU ``from_float``
  (:func:`.ggml_blocks.encode`), so ``stored`` (B, H, S, width) holds exactly the cache row,
  cut per head (a 32-value block never straddles two heads);
- ``values``: ggml's dequantization, rotated back (``H H = I``): what attention reads, in the original
  space. llama.cpp attends in the rotated space instead (Q rotated alike, the output un-rotated) and,
  with flash attention, converts Q to K's dot type and accumulates V in its own precision; none of that
  is storage, and none of it is modelled by the codecs (compare cache bytes exactly, logits
  statistically); what it does to Q is :mod:`.attention` (:meth:`LlamacppFamily.query_rounding`).

Refused in one line: a type llama.cpp does not take, a quantized type on a head_dim that is not a
multiple of 32 (llama.cpp refuses the context), MLA models (llama.cpp's MLA cache is another layout).
"""

from __future__ import annotations

import torch

from evalkit.errors import SchemeError
from evalkit.kv.codec import register_family
from evalkit.kv.codecs.llamacpp import ggml_blocks as gb
from evalkit.kv.codecs.llamacpp.attention import round_query
from evalkit.kv.codecs.slot import TOKEN, Codec, SlotFamily, packed
from evalkit.kv.formats import CodecRecipe
from evalkit.kv.scheme import Scheme

PREFIX = "llamacpp:"
RECIPE_PREFIX = "llamacpp_"
# llama.cpp's --cache-type-k/-v choices (common/arg.cpp kv_cache_types), in its order
LLAMACPP_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
# the nominal element format of a codec (the bytes are the codec's): its K type's nearest evalkit format
_FORMAT = {"q4_0": "int4", "iq4_nl": "int4", "q4_1": "int4_asym", "q5_0": "int4", "q5_1": "int4_asym"}


def recipe_of(type_k: str, type_v: str) -> CodecRecipe:
    return CodecRecipe(f"{RECIPE_PREFIX}{type_k}_{type_v}")


def check_type(name: str) -> None:
    if name not in LLAMACPP_TYPES:
        raise SchemeError(
            f"llama.cpp has no KV cache type {name!r}: use one of {', '.join(LLAMACPP_TYPES)} "
            "(e.g. llamacpp:q8_0 or llamacpp:q8_0/q4_0)"
        )


def check_type_head_size(type_name: str, head_dim: int) -> None:
    if gb.block_type(type_name).quantized and head_dim % gb.QK:
        raise SchemeError(
            f"llama.cpp's {type_name} cache stores blocks of {gb.QK} values, which do not divide head_dim "
            f"{head_dim} (llama.cpp refuses the context): use llamacpp:f16 for this model"
        )


def _make(type_k: str, type_v: str) -> Codec:
    types = {"k": type_k, "v": type_v}

    def check_head_size(head_dim: int) -> None:
        for t in dict.fromkeys((type_k, type_v)):
            check_type_head_size(t, head_dim)

    def width(role: str, head_dim: int) -> int:
        return gb.block_type(types[role]).row_bytes(head_dim)

    def encode(x: torch.Tensor, role: str = "k"):
        b, h, s, d = x.shape
        check_type_head_size(types[role], d)
        t, n = types[role], gb.rotation(types[role], role, d)
        y = gb.fwht_llamacpp(x.float(), n) if n else x.float()
        rows = y.permute(0, 2, 1, 3).reshape(b, s, h * d)  # one cache row per token: its heads in order
        stored = gb.encode(t, rows).reshape(b, s, h, -1).permute(0, 2, 1, 3).contiguous()
        values = _read(stored, t, n)
        return packed(stored, stored, values, ~torch.isfinite(y).all())

    def decode(stored: torch.Tensor, role: str, head_dim: int) -> torch.Tensor:
        return _read(stored, types[role], gb.rotation(types[role], role, head_dim))

    name = type_k if type_k == type_v else f"{type_k}/{type_v}"
    return Codec(
        name=name,
        recipe=recipe_of(type_k, type_v),
        format=_FORMAT.get(type_k, "int8"),
        granularity=TOKEN,
        encode=encode,
        decode=decode,
        width=width,
        check_head_size=check_head_size,
    )


def _read(stored: torch.Tensor, type_name: str, n: int) -> torch.Tensor:
    values = gb.decode(type_name, stored)
    return gb.fwht_llamacpp(values, n) if n else values


CODECS = tuple(_make(k, v) for k in LLAMACPP_TYPES for v in LLAMACPP_TYPES)
_TYPES = {recipe_of(k, v): (k, v) for k in LLAMACPP_TYPES for v in LLAMACPP_TYPES}


def types_of(scheme) -> tuple[str, str]:
    """``(type_k, type_v)`` of a ``llamacpp:`` scheme (or its recipe)."""
    return _TYPES[getattr(scheme, "recipe", scheme)]


class LlamacppFamily(SlotFamily):
    prefix = "llamacpp"
    engine = "llama.cpp"
    grammar = "llamacpp:<k>[/<v>][+skip=...] (llama.cpp's --cache-type-k/-v)"
    recipe_hint = "llama.cpp's cache types: write llamacpp:<k>[/<v>]"
    own_attention = "llama.cpp's own attention (Q in the K type's dot type)"
    kind = "cache"
    fixes = "blocks"

    def __init__(self):
        super().__init__(CODECS)

    def names(self) -> list[str]:
        """The cache types (any ``<k>/<v>`` pair of them is a name too)."""
        return list(LLAMACPP_TYPES)

    def parse(self, text: str, options: dict) -> Scheme:
        """The scheme of ``llamacpp:<text>`` (``text`` = ``<k>`` or ``<k>/<v>``); ``options``: skip/attn/rope."""
        parts = text.split("/")
        if len(parts) > 2 or not all(parts):
            raise SchemeError(
                f"malformed llama.cpp scheme {PREFIX + text!r}: write {PREFIX}<k> or {PREFIX}<k>/<v> with types "
                f"{', '.join(LLAMACPP_TYPES)}"
            )
        for t in parts:
            check_type(t)
        return self.scheme(self.codecs[recipe_of(parts[0], parts[-1])], options)

    def check_layout(self, scheme: Scheme, is_mla: bool, head_dims: tuple[int, ...]) -> None:
        """A llama.cpp pair on a model llama.cpp would not store it for (one line)."""
        if is_mla:
            raise SchemeError(
                f"{PREFIX}{self.codecs[scheme.recipe].name} models llama.cpp's standard K/V cache rows; its "
                "multi-head latent attention cache is not modelled: use vllm:fp8 or a generic scheme for this model"
            )
        k, v = types_of(scheme)
        check_type_head_size(k, head_dims[0])
        check_type_head_size(v, head_dims[-1])

    def query_rounding(self, scheme: Scheme):
        """Q as llama.cpp's CPU attention reads it against the K type (:func:`.attention.round_query`)."""
        type_k = types_of(scheme)[0]
        return lambda query: round_query(query, type_k, query.shape[-1])


FAMILY = register_family(LlamacppFamily())
