"""Bytes of KV cache: per cached element, per layer, per token and per sequence for a whole model.

Conventions (shared with the real storage cache in :mod:`evalkit.integration.storage`, which is tested to hold
exactly these bytes): data takes ``bits / 8`` bytes per element (INT4 and FP4 pack two per byte);
a scale takes its storage dtype's bytes (``fp32`` 4, ``e4m3`` and ``e8m0`` 1); asymmetric formats
store a float32 zero point beside each scale. Dynamic per-tensor and per-head scales are kept per
sequence, static and unit ones once per layer. NVFP4's second-level FP32 scale is one per
sequence for K and one for V in each layer (engines keep one per layer, ``k_scale``/``v_scale``;
either way it adds nothing per token). Layers kept unquantized (skipped) take 2 bytes per
element (BF16) and no scales.

So per element: FP8 with per-tensor scales 1 byte; NVFP4 0.5 + 1/16 = 0.5625 (4.5 bits, like
SGLang's fp4_e2m1: 0.5 + 1/16); MXFP4 0.5 + 1/32 = 0.53125 (4.25 bits); MXFP8 1 + 1/32.

A whole model (a :class:`~evalkit.models.info.KVLayout`) stores, per attention layer and token:

- full attention (MHA, GQA, MQA alike): K and V, ``kv_heads x head_dim`` values each;
- sliding-window layers: the same, but at most ``window`` tokens per sequence (what an engine
  keeps; transformers' dynamic cache keeps ``window - 1``), so their share per token falls as the
  context grows past the window;
- multi-head latent attention (DeepSeek-V3, Kimi K2): one latent (``kv_lora_rank`` values) and one
  RoPE key (``qk_rope_head_dim`` values), stored as two single-head tensors exactly as transformers'
  ``cache.update(latent, rope_key)`` hands them over. ``+rope=bf16`` keeps the RoPE key in BF16.
  FP8 latent with 128-value tiles and BF16 RoPE: 512 + 4 x 4 + 64 x 2 = 656 bytes per layer and token.

:func:`model_cache_bytes` is exact for any sequence length and batch (partial blocks, per-sequence
scales); :func:`bytes_per_token` is the per-token rate at long context without window caps (the
number people quote: Kimi K2 BF16 70,272 B, FP8 35,136 B); :func:`bytes_per_token_at` is the exact
average over a sequence of a given length, window caps included.
"""

from __future__ import annotations

import math
from fractions import Fraction

from evalkit.errors import SchemeError
from evalkit.kv.codec import check_layout, codec_for, is_codec
from evalkit.kv.quantize import check_granularity
from evalkit.kv.scheme import GranularityKind, ScaleSource, Scheme
from evalkit.models.info import KVLayout

SCALE_BYTES = 4  # a float32 scale or zero point (static/unit scales, zero points, NVFP4's per-tensor scale)
BASELINE_BYTES = 2  # BF16


def scale_bytes(scheme: Scheme) -> int:
    """Bytes of one dynamic scale as stored (its dtype), plus its float32 zero point (asymmetric formats)."""
    return scheme.kv_format.scale_nbytes + (SCALE_BYTES if scheme.kv_format.asymmetric else 0)


def tensor_scale_bytes(scheme: Scheme, batch: int) -> int:
    """NVFP4's second-level FP32 scale: one per sequence for one K (or V, latent, RoPE key) tensor."""
    return SCALE_BYTES * batch if scheme.kv_format.tensor_scale else 0


def scale_bytes_per_element(scheme: Scheme, head_dim: int) -> float:
    """Scale overhead amortized per element for long sequences (tensor and head scales -> 0)."""
    if scheme.is_unscaled:
        return 0.0
    if scheme.scales is not ScaleSource.DYNAMIC:
        return 0.0  # static and unit scales are a per-layer constant
    kind, size = scheme.granularity.kind, scheme.granularity.size
    per_scale = scale_bytes(scheme)
    if kind is GranularityKind.TOKEN:
        return per_scale / head_dim
    if kind is GranularityKind.GROUP:
        return per_scale / size
    if kind is GranularityKind.BLOCK:
        return per_scale / (size * head_dim)
    return 0.0


def bytes_per_element(scheme: Scheme, head_dim: int, rope_dim: int | None = None) -> float:
    """``rope_dim``: the model's rotary dims, for a codec whose slot follows them (None: every dim)."""
    c = codec_for(scheme.recipe)
    if c is not None:  # an engine's slot codec: its slot (K and V) per 2 * head_dim elements
        r = c.rope(rope_dim)
        return (c.width("k", head_dim, **r) + c.width("v", head_dim, **r)) / (2 * head_dim)
    data = BASELINE_BYTES if scheme.is_unscaled else scheme.kv_format.bits / 8
    return data + scale_bytes_per_element(scheme, head_dim)


def layer_cache_bytes(
    scheme: Scheme,
    batch: int,
    heads: int,
    seq: int,
    head_dim: int,
    quantized: bool = True,
    role: str = "k",
    rope_dim: int | None = None,
) -> int:
    """Exact bytes one layer's K (or V: ``role="v"``) takes for ``batch`` sequences of ``seq`` stored tokens
    (``rope_dim``: the model's rotary dims, for a codec whose slot follows them; None: every dim)."""
    if not quantized or scheme.is_unscaled:
        return BASELINE_BYTES * batch * heads * seq * head_dim
    c = codec_for(scheme.recipe)
    if c is not None:  # an engine's slot codec: its packed bytes per (token, head), scales inside
        return batch * heads * seq * c.width(role, head_dim, **c.rope(rope_dim))
    data = batch * heads * seq * math.ceil(head_dim * scheme.kv_format.bits / 8)
    kind, size = scheme.granularity.kind, scheme.granularity.size
    if scheme.scales is not ScaleSource.DYNAMIC:
        # static and unit scales: one float32 per layer (a unit scale is 1.0 whatever the granularity),
        # or one per layer and head for static head scales
        fixed = heads if scheme.scales is ScaleSource.STATIC and kind is GranularityKind.HEAD else 1
        return data + fixed * SCALE_BYTES
    if kind is GranularityKind.TENSOR:
        n_scales = batch
    elif kind is GranularityKind.HEAD:
        n_scales = batch * heads
    elif kind is GranularityKind.BLOCK:
        n_scales = batch * heads * math.ceil(seq / size)
    elif kind is GranularityKind.TOKEN:
        n_scales = batch * heads * seq
    else:
        n_scales = batch * heads * seq * (head_dim // size)
    return data + n_scales * scale_bytes(scheme) + tensor_scale_bytes(scheme, batch)


# -- MLA ----------------------------------------------------------------------------------------
MLA_GRANULARITIES = (GranularityKind.TENSOR, GranularityKind.TOKEN, GranularityKind.GROUP)


def check_layout_scheme(scheme: Scheme, layout: KVLayout) -> None:
    """One clear error where a scheme cannot tile a model's cached tensors (MLA rules, or a group
    width that does not divide head_dim)."""
    if scheme.is_unscaled:
        return
    if layout.is_mla:
        check_mla_scheme(scheme, layout)
        return
    check_layout(scheme, False, (layout.head_dim, layout.v_head_dim))
    c = codec_for(scheme.recipe)
    if c is not None and c.rope_aware:  # vLLM's Octave: refuses, in one line, rotary dims its format does not take
        c.width("k", layout.head_dim, layout.rotary_dim)
    for dim in dict.fromkeys((layout.head_dim, layout.v_head_dim)):
        check_granularity(scheme.granularity, dim)


def check_mla_scheme(scheme: Scheme, layout: KVLayout) -> None:
    if scheme.is_unscaled or not layout.is_mla:
        return
    check_layout(scheme, True, (layout.mla_latent_dim, layout.mla_rope_dim))
    if scheme.granularity.kind not in MLA_GRANULARITIES:
        raise SchemeError(
            f"{scheme.granularity} has no meaning for the MLA latent of {layout.model_type} (one shared latent per token, no KV heads): "
            "use tensor, token or group<N> (e.g. group128 for 128-value tiles)"
        )
    if scheme.granularity.kind is GranularityKind.GROUP:
        size = scheme.granularity.size
        if layout.mla_latent_dim % size:
            raise SchemeError(
                f"group{size} does not divide the latent width {layout.mla_latent_dim}: "
                f"use a group width that divides {layout.mla_latent_dim}"
            )
        if not scheme.rope_bf16 and layout.mla_rope_dim % min(size, layout.mla_rope_dim):
            raise SchemeError(
                f"group{size} does not tile the {layout.mla_rope_dim}-value RoPE key: "
                "use a width dividing it or +rope=bf16"
            )


def mla_rope_granularity(scheme: Scheme, layout: KVLayout):
    """The RoPE key's granularity: a group wider than the key covers the whole key (one scale per token)."""
    g = scheme.granularity
    if g.kind is GranularityKind.GROUP and g.size > layout.mla_rope_dim:
        return type(g)(GranularityKind.GROUP, layout.mla_rope_dim)
    return g


def _part_bytes(scheme: Scheme, batch: int, seq: int, dim: int, quantized: bool, role: str = "k") -> int:
    """One single-head MLA part (latent or RoPE key: ``role="v"``); a group wider than the part has one scale
    per token."""
    if quantized and is_codec(scheme.recipe):  # a vLLM MLA row (kv.codecs.vllm.ds_mla): its bytes for this side
        return layer_cache_bytes(scheme, batch, 1, seq, dim, quantized, role)
    if quantized and scheme.granularity.kind is GranularityKind.GROUP and dim % scheme.granularity.size:
        data = batch * seq * math.ceil(dim * scheme.kv_format.bits / 8)
        return (
            data
            + batch * seq * math.ceil(dim / scheme.granularity.size) * scale_bytes(scheme)
            + tensor_scale_bytes(scheme, batch)
        )
    return layer_cache_bytes(scheme, batch, 1, seq, dim, quantized)


def mla_layer_bytes(
    scheme: Scheme, batch: int, seq: int, latent_dim: int, rope_dim: int, quantized: bool = True
) -> int:
    """Exact bytes of one MLA layer: the latent plus the RoPE key (BF16 under ``+rope=bf16``)."""
    latent = _part_bytes(scheme, batch, seq, latent_dim, quantized)
    rope = _part_bytes(scheme, batch, seq, rope_dim, quantized and not scheme.rope_bf16, "v")
    return latent + rope


# -- whole model --------------------------------------------------------------------------------
def attention_layers(layout: KVLayout) -> tuple[int, ...]:
    if layout.attention_layers is not None:
        return layout.attention_layers
    return tuple(range(layout.num_layers))


def stored_tokens(
    layout: KVLayout, layer_idx: int, seq: int, window_caps: bool = True, keep: str = "engine", block: int = 0
) -> int:
    """Tokens a layer holds for a sequence of ``seq``: a sliding layer keeps at most its window.

    ``keep="engine"``: ``window`` tokens (what a serving engine allocates); ``keep="transformers"``:
    ``window - 1`` tokens as transformers' dynamic cache (and evalkit's storage cache) keep, rounded
    out to whole blocks of ``block`` tokens when scales are per block. A DeepSeek V4 layer
    (``layout.compress_ratios``) keeps its window plus one compressed entry per ratio tokens."""
    if layout.compress_ratios is not None:
        ratio = layout.compress_ratios[layer_idx]
        return min(seq, layout.sliding_window) + (seq // ratio if ratio else 0)
    if not (window_caps and layout.is_sliding(layer_idx) and layout.sliding_window):
        return seq
    if keep == "engine":
        return min(seq, layout.sliding_window)
    if keep != "transformers":
        raise ValueError(f"keep must be 'engine' or 'transformers', got {keep!r}")
    window = layout.sliding_window - 1
    if seq <= window:
        return seq
    dropped = seq - window
    if block:
        dropped = dropped // block * block
    return seq - dropped


def model_cache_bytes(
    layout: KVLayout, scheme: Scheme, seq: int, batch: int = 1, window_caps: bool = True, keep: str = "engine"
) -> int:
    """Exact KV bytes of ``batch`` sequences of ``seq`` tokens over every attention layer.

    ``keep`` says how many tokens sliding-window layers hold (see :func:`stored_tokens`)."""
    check_layout_scheme(scheme, layout)
    total = 0
    for i in attention_layers(layout):
        quantized = not scheme.is_unscaled and not scheme.skips_layer(i, layout.is_sliding(i), layout.num_layers)
        block = scheme.granularity.size if quantized and scheme.granularity.kind is GranularityKind.BLOCK else 0
        n = stored_tokens(layout, i, seq, window_caps, keep, block)
        if layout.is_mla:
            total += mla_layer_bytes(scheme, batch, n, layout.mla_latent_dim, layout.mla_rope_dim, quantized)
        else:
            heads, rope = layout.num_kv_heads, layout.rotary_dim
            total += layer_cache_bytes(scheme, batch, heads, n, layout.head_dim, quantized, "k", rope)
            total += layer_cache_bytes(scheme, batch, heads, n, layout.v_head_dim, quantized, "v", rope)
    return total


def _period(scheme: Scheme) -> int:
    return scheme.granularity.size if scheme.granularity.kind is GranularityKind.BLOCK else 1


def bytes_per_token(layout: KVLayout, scheme: Scheme) -> Fraction:
    """Bytes each further token adds at long context, every layer storing it (no window caps).

    Exact as a fraction: data plus scales amortized (a block's scale over its tokens; per-tensor and
    per-head scales, a per-sequence constant, add nothing). DeepSeek V4 (``layout.compress_ratios``): the
    compressed entries each further token adds past the window (the window is a per-sequence constant)."""
    n = _period(scheme)
    if layout.compress_ratios is not None:
        n *= math.lcm(*[r for r in layout.compress_ratios if r] or [1])
        start = n * -(-layout.sliding_window // n)  # the first multiple of n past the window
        return Fraction(model_cache_bytes(layout, scheme, start + n) - model_cache_bytes(layout, scheme, start), n)
    grow = model_cache_bytes(layout, scheme, n, window_caps=False) - model_cache_bytes(
        layout, scheme, 0, window_caps=False
    )
    return Fraction(grow, n)


def bytes_per_token_at(layout: KVLayout, scheme: Scheme, context: int) -> float:
    """Average bytes per token of one sequence of ``context`` tokens (window caps and scales included)."""
    if context <= 0:
        raise SchemeError(f"context must be a positive number of tokens, got {context}")
    return model_cache_bytes(layout, scheme, context) / context
