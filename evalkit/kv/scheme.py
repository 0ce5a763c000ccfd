"""KV schemes: what is stored, at which granularity, with which scales.

A :class:`Scheme` is a small frozen value with one canonical string form that parses back to the
same value::

    FORMAT/GRANULARITY/SCALES[+option=value...]
    NAME[+skip=...][+attn=fa3][+rope=bf16]
    PREFIX:NAME[+skip=...][+attn=fa3][+rope=bf16]   an engine's own cache type (vllm:, llamacpp:)

    auto                              unquantized baseline: the model's own dtype (the identity scheme)
    bf16, fp16                        K/V rounded to 16 bits, no scales (auto on a model of that dtype)
    fp8_e4m3/tensor/dynamic           one scale per layer for K and one for V, from the values
    fp8_e4m3/head/static+scales=calibration/x.safetensors
    fp8_e5m2/tensor/unit              scale 1.0, what engines use when no scale is given
    fp8_e4m3/block16/dynamic+skip=0,29
    int4/group32/dynamic
    fp8_e4m3/head/dynamic+attn=fa3    also Q and softmax P in FP8, as FlashAttention-3 does
    fp8_e4m3/head/dynamic+attn=fa3:acc2  and its FP8 tensor-core accumulation (acc1: one level, acc2: two)
    fp8_e4m3/tensor/unit+rounding=rtz elements rounded toward zero, as vLLM's CPU KV store does
    nvfp4                             = fp4_e2m1/group16/dynamic+scale_dtype=e4m3+tensor_scale=fp32
    mxfp4+skip=0                      = fp4_e2m1/group32/dynamic+scale_dtype=e8m0+skip=0

Granularities (the elements sharing one scale), for K of shape (batch, kv_heads, seq, head_dim):
``tensor`` (all of a layer's K, or V), ``head`` (one per KV head), ``block<N>`` (one per KV head per
N consecutive tokens, like a paged-KV block; ``block`` means ``block16``), ``token`` (one per token
per head) and ``group<N>`` (N channels of head_dim per token per head).

Options (canonical order): ``scale_dtype=e4m3|e8m0`` (how each scale is stored; ``fp32``, the
default, is not written), ``tensor_scale=fp32`` (a second-level FP32 scale per tensor, with E4M3
group scales: NVFP4), ``recipe=sglang`` (SGLang's own FP4 scale rule and zero sign),
``recipe=vllm_cpu`` (vLLM's CPU FP8 store: ``x * float32(1 / scale)``, an exact-zero quotient
stored +0, E4M3 subnormals through float32; with ``+rounding=rtz``, :func:`evalkit.kv.rounding.round_vllm_cpu`),
``scales=PATH`` (the static table), ``scales_model=MODEL`` and ``scales_format=FORMAT`` (what a
static table without its JSON sidecar was made for: the model, named as ``--model`` names it, and
the format its scales were calibrated for; both or neither, see
:func:`evalkit.kv.scale_table.load_scale_table`), ``rounding=rtz|rna`` (how ``x / scale`` becomes a code:
toward zero, or to nearest with ties away from zero, both saturating; ``rne``, to nearest with
ties to even, is the default and is never written, so strings without the option keep their
meaning and their run ids; every quantized format takes each mode, see
:mod:`evalkit.kv.rounding`), ``skip=0,5`` or ``skip=sliding`` (layers kept unquantized),
``attn=fa3``, ``attn=fa3:acc1`` or ``attn=fa3:acc2`` (attention precision), ``rope=bf16`` (MLA models: keep the RoPE key unquantized).

``PREFIX:NAME`` is handed to the codec family registered for the prefix (:mod:`evalkit.kv.codec`),
which says what scheme it is; such a scheme carries the family's recipe, and its canonical string, its
checks and its store are the family's. This module knows no family.

Named schemes (:data:`NAMED_SCHEMES`) are the standard combinations. A named scheme's canonical
string is its name (plus ``skip``/``attn``/``rope`` options), and its long form parses to the same
value, so ``fp4_e2m1/group16/dynamic+scale_dtype=e4m3+tensor_scale=fp32`` prints as ``nvfp4``:

==============  ==========================================================================
``nvfp4``       E2M1, 16-element groups along head_dim, E4M3 group scales, FP32 per-tensor scale
``mxfp4``       E2M1, 32-element groups, E8M0 scales (OCP MX v1.0 MXFP4)
``mxfp8_e4m3``  FP8 E4M3, 32-element groups, E8M0 scales (OCP MX v1.0 MXFP8)
``sglang_fp4``  SGLang's ``--kv-cache-dtype fp4_mx_block16`` (its 0.5.23 name): E2M1, 16-element groups, E8M0 scales by
                SGLang's ceil rule (``recipe=sglang``), elements rounded half away from zero
                (``rounding=rna``)
==============  ==========================================================================

A named scheme fixes its rounding too (``nvfp4+rounding=rtz`` is refused: write the long form).
``recipe=sglang`` is SGLang's scale rule only; before rounding was an option it also implied ties
away from zero, so a long form written without ``+rounding=rna`` now rounds to nearest even
(``sglang_fp4`` itself, its numbers and its string, are unchanged).

Scales stored as E4M3 or E8M0 exist per group of elements only, computed from the values:
``static``/``unit`` scales, or a granularity other than ``group<N>``, are refused for them and for
FP4 (whose 8 magnitudes need a scale per small group). NVFP4's per-tensor scale is, like
``tensor/dynamic`` scales, taken from each sequence's first write and then frozen
(see :mod:`evalkit.kv.quantize`).

Here: the :class:`Scheme` value, its canonical string, and the grammar's entry (:func:`parse_scheme`,
:func:`parse_schemes`). Beside it: its parts (:mod:`evalkit.kv.scheme_parts`: granularity, scale source,
attention precision; importable from here too, as a Scheme's field types), the named schemes
(:mod:`evalkit.kv.named_schemes`), the ``+key=value`` options (:mod:`evalkit.kv.scheme_options`) and the
scale fields' rules (:mod:`evalkit.kv.scheme_checks`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass, field

from evalkit.errors import SchemeError
from evalkit.kv import codec as codecs
from evalkit.kv.formats import FORMATS, CodecRecipe, KVFormat, Recipe, Rounding, ScaleDType, get_format
from evalkit.kv.named_schemes import NAMED_SCHEMES
from evalkit.kv.scheme_checks import check_scale_encoding, check_scales_declaration
from evalkit.kv.scheme_options import NAMED_OPTION_KEYS, OPTION_KEYS, ROUNDING_CHOICES, parse_options
from evalkit.kv.scheme_parts import SLIDING, AttentionPrecision, Granularity, GranularityKind, ScaleSource


@dataclass(frozen=True)
class Scheme:
    format: str = "auto"
    granularity: Granularity = field(default_factory=lambda: Granularity(GranularityKind.TENSOR))
    scales: ScaleSource = ScaleSource.DYNAMIC
    static_path: str | None = None
    skip_layers: tuple[int, ...] | str = ()
    attention: AttentionPrecision = AttentionPrecision.KV
    rope_bf16: bool = False
    scale_dtype: ScaleDType = ScaleDType.FP32
    tensor_scale: bool = False
    recipe: Recipe | CodecRecipe = Recipe.STANDARD  # an engine codec family's own (evalkit.kv.codec)
    rounding: Rounding = Rounding.RNE
    scales_model: str | None = None  # the model a sidecar-less static table was made for (+scales_model=)
    scales_format: str | None = None  # the format it was calibrated for (+scales_format=)

    def __post_init__(self):
        fmt = get_format(self.format)
        if self.format not in FORMATS and isinstance(self.recipe, Recipe):
            raise SchemeError(
                f"{self.format} is a codec family's own element format: write that family's scheme "
                "(`python -m evalkit schemes` lists them)"
            )
        if not isinstance(self.rounding, Rounding):  # Scheme(rounding="rtz") reads as Rounding.RTZ
            try:
                object.__setattr__(self, "rounding", Rounding(self.rounding))
            except ValueError:
                raise SchemeError(f"rounding={self.rounding!r}: use {ROUNDING_CHOICES}") from None
        if fmt.is_unscaled:
            defaults = (
                Granularity(GranularityKind.TENSOR),
                ScaleSource.DYNAMIC,
                None,
                (),
                AttentionPrecision.KV,
                False,
                ScaleDType.FP32,
                False,
                Recipe.STANDARD,
                Rounding.RNE,
            )
            if (
                self.granularity,
                self.scales,
                self.static_path,
                self.skip_layers,
                self.attention,
                self.rope_bf16,
                self.scale_dtype,
                self.tensor_scale,
                self.recipe,
                self.rounding,
            ) != defaults:
                raise SchemeError(
                    f"{self.format} is an unscaled 16-bit cache and takes no granularity, scales or options: "
                    f"write just '{self.format}'"
                )
            return
        check_scale_encoding(self, fmt)
        if self.scales is ScaleSource.STATIC:
            if self.granularity.kind not in (GranularityKind.TENSOR, GranularityKind.HEAD):
                raise SchemeError(
                    f"static scales exist per layer (tensor) or per layer and head (head), not per {self.granularity}: "
                    "use tensor or head granularity, or dynamic scales"
                )
            if not self.static_path:
                raise SchemeError(
                    "static scales need a scale file: add +scales=PATH (make one with `python -m evalkit calibrate`)"
                )
        elif self.static_path:
            raise SchemeError(f"+scales=PATH only goes with static scales, not {self.scales.value}")
        check_scales_declaration(self)
        if self.scales is not ScaleSource.DYNAMIC and fmt.asymmetric:
            raise SchemeError(
                f"{fmt.name} needs a zero point, which {self.scales.value} scales do not have: "
                f"use {fmt.name.replace('_asym', '')} or dynamic scales"
            )
        if isinstance(self.skip_layers, str):
            if self.skip_layers != SLIDING:
                raise SchemeError(f"skip must be a list of layer indices or 'sliding', got {self.skip_layers!r}")
        elif any(i < 0 for i in self.skip_layers) or list(self.skip_layers) != sorted(set(self.skip_layers)):
            raise SchemeError("skip layers must be distinct non-negative indices in increasing order, e.g. skip=0,5")

    # -- derived --------------------------------------------------------------------------------
    @property
    def kv_format(self) -> KVFormat:
        """The element format with this scheme's scale encoding bound to it (what the quantizer reads)."""
        return (
            get_format(self.format)
            .with_scales(self.scale_dtype, self.tensor_scale, self.recipe)
            .with_rounding(self.rounding)
        )

    @property
    def name(self) -> str | None:
        """The named scheme this is (ignoring skip/attn/rope options), or None."""
        core = self._core()
        return next((name for name, named in NAMED_SCHEMES.items() if named.core() == core), None)

    def _core(self) -> tuple:
        return (
            self.format,
            self.granularity,
            self.scales,
            self.static_path,
            self.scale_dtype,
            self.tensor_scale,
            self.recipe,
            self.rounding,
        )

    @property
    def is_identity(self) -> bool:
        """The baseline ``auto``: K/V stored as the model computed them."""
        return self.kv_format.is_identity

    @property
    def is_unscaled(self) -> bool:
        """A 16-bit cache without scales: ``auto``, ``bf16`` or ``fp16``."""
        return self.kv_format.is_unscaled

    def skips_layer(self, layer_idx: int, is_sliding: bool = False, num_layers: int | None = None) -> bool:
        """Whether the layer is kept unquantized: ``+skip=``, plus the boundary layers an engine dtype keeps
        (vLLM's TurboQuant/UltraQuant: the first and last two; needs ``num_layers``)."""
        codec = codecs.codec_for(self.recipe) if num_layers is not None else None
        if codec is not None and layer_idx in codec.boundary(num_layers):
            return True
        if self.skip_layers == SLIDING:
            return is_sliding
        return layer_idx in self.skip_layers

    # -- canonical string -----------------------------------------------------------------------
    def __str__(self) -> str:
        if self.is_unscaled:
            return self.format
        family = codecs.family_of(self.recipe)
        name = self.name if family is None else family.scheme_name(self)  # vllm:int4_per_token_head
        if name:
            text = name
        else:
            text = f"{self.format}/{self.granularity}/{self.scales.value}"
            if self.scale_dtype is not ScaleDType.FP32:
                text += f"+scale_dtype={self.scale_dtype.value}"
            if self.tensor_scale:
                text += "+tensor_scale=fp32"
            if self.recipe is not Recipe.STANDARD:
                text += f"+recipe={self.recipe.value}"
        if self.static_path:
            text += f"+scales={self.static_path}"
        if self.scales_model is not None:
            text += f"+scales_model={self.scales_model}+scales_format={self.scales_format}"
        if self.rounding is not Rounding.RNE and not name:  # a named scheme's name says its rounding
            text += f"+rounding={self.rounding.value}"
        if self.skip_layers:
            skip = self.skip_layers if isinstance(self.skip_layers, str) else ",".join(map(str, self.skip_layers))
            text += f"+skip={skip}"
        if self.attention is not AttentionPrecision.KV:
            text += f"+attn={self.attention.value}"
        if self.rope_bf16:
            text += "+rope=bf16"
        return text

    @classmethod
    def parse(cls, text: str) -> Scheme:
        return parse_scheme(text)


def parse_scheme(text: str) -> Scheme:
    """Parse ``FORMAT/GRANULARITY/SCALES[+key=value...]``, ``NAME[+key=value...]`` or ``auto`` into a :class:`Scheme`."""
    if not isinstance(text, str) or not text.strip():
        raise SchemeError("empty KV scheme: write e.g. fp8_e4m3/tensor/dynamic, nvfp4 or auto")
    text = text.strip()
    head, *options = text.split("+")
    prefix, colon, name = head.partition(":")
    family = codecs.family_for_prefix(prefix) if colon else None
    if family is not None:  # an engine's own cache type: vllm:int8_per_token_head, llamacpp:q8_0/q4_0
        return family.parse(name, parse_options(text, options, NAMED_OPTION_KEYS))
    parts = head.split("/")
    if len(parts) == 1 and head in FORMATS and FORMATS[head].is_unscaled:  # auto, bf16, fp16
        if options:
            raise SchemeError(f"{head} is an unscaled 16-bit cache and takes no options: write just '{head}'")
        return Scheme(format=head)
    if len(parts) == 1 and head in NAMED_SCHEMES:
        return Scheme(**NAMED_SCHEMES[head].fields(), **parse_options(text, options, NAMED_OPTION_KEYS))
    if len(parts) != 3:
        if len(parts) == 1 and head in FORMATS:
            raise SchemeError(
                f"{head} needs a granularity and a scale source: write e.g. {head}/group16/dynamic "
                f"(or a named scheme: {', '.join(NAMED_SCHEMES)})"
            )
        raise SchemeError(
            f"malformed KV scheme {text!r}: write FORMAT/GRANULARITY/SCALES, e.g. fp8_e4m3/head/dynamic, "
            f"or a named scheme ({', '.join(NAMED_SCHEMES)}) (see `python -m evalkit schemes`)"
        )
    fmt, gran, scales = parts
    if fmt not in FORMATS:  # evalkit's own grammar: its own formats (a codec family's come through its scheme)
        raise SchemeError(f"unknown KV format {fmt!r}: use one of {', '.join(FORMATS)}")
    granularity = Granularity.parse(gran)
    try:
        source = ScaleSource(scales)
    except ValueError:
        raise SchemeError(
            f"unknown scale source {scales!r}: use one of {', '.join(s.value for s in ScaleSource)}"
        ) from None
    return Scheme(format=fmt, granularity=granularity, scales=source, **parse_options(text, options, OPTION_KEYS))


_IDENT = r"[A-Za-z_]\w*"


@functools.lru_cache(maxsize=4)
def _scheme_start(prefixes: tuple[str, ...]) -> re.Pattern:
    """A comma that starts a scheme: a codec family's ``prefix:``, a format or named-scheme name, or what has a
    scheme's shape (see :func:`parse_schemes`)."""
    return re.compile(
        r",(?=\s*(?:"
        + "".join(f"{re.escape(p)}:|" for p in prefixes)
        + "(?:"
        + "|".join(re.escape(n) for n in sorted([*FORMATS, *NAMED_SCHEMES], key=len, reverse=True))
        + r")(?:[/+,\s]|$)"
        # a mistyped scheme still starts a new item: NAME/GRANULARITY/SCALES or a bare NAME, up to the next
        # option, comma or the end (a skip list continues with digits; a scales path with one slash stays put)
        + rf"|{_IDENT}/[^,+/]*/[^,+/]*(?:[+,]|\s*$)|{_IDENT}\s*(?:[+,]|$)))"
    )


def one_forward_reads_raw(scheme: Scheme | str) -> bool:
    """Whether a scheme's engine attends a sequence's first write from the raw K/V it was given (its slot
    codec's ``prefill_reads_raw``): then an evaluation of one forward per sequence (perplexity windows, lm-eval
    log-likelihoods) reads nothing quantized, and its numbers are the baseline's, not the cache's cost."""
    scheme = parse_scheme(scheme) if isinstance(scheme, str) else scheme
    codec = codecs.codec_for(scheme.kv_format.recipe)
    return codec is not None and codec.prefill_reads_raw


def declare_scales(schemes: list[Scheme], model: str, fmt: str) -> list[Scheme]:
    """``schemes`` with every static one declaring its table's model and format (``+scales_model=``,
    ``+scales_format=``; ``--scales-model``/``--scales-format``). SchemeError when none reads a table
    (the flags would be ignored) or one already declares something else."""
    out, touched = [], False
    for s in schemes:
        if not s.static_path:
            out.append(s)
            continue
        touched = True
        if s.scales_model is not None and (s.scales_model, s.scales_format) != (model, fmt):
            raise SchemeError(
                f"{s} already names its table's model and format: drop --scales-model/--scales-format or those options"
            )
        out.append(dataclasses.replace(s, scales_model=model, scales_format=fmt))
    if not touched:
        raise SchemeError(
            "--scales-model/--scales-format describe a static scale table, but no scheme reads one "
            "(+scales=PATH): drop them"
        )
    return out


def parse_schemes(text: str | list[str]) -> list[Scheme]:
    """Parse a list: schemes separated by commas (or passed as a list).

    ``skip=0,5`` contains commas, so a comma-separated string is split only at commas that start a
    scheme: a format or named-scheme name, or what has a scheme's shape (``NAME/GRAN/SCALES``, a bare
    ``NAME``) even when its name is mistyped, so the error names the item that is wrong, not the one
    before it. A list of several names the item and its position in each error.
    """
    pieces = _scheme_start(tuple(codecs.families())).split(text) if isinstance(text, str) else list(text)
    pieces = [p for p in pieces if p.strip()]
    out = []
    for i, piece in enumerate(pieces, 1):
        try:
            out.append(parse_scheme(piece))
        except SchemeError as e:
            if len(pieces) == 1:
                raise
            raise SchemeError(f"scheme {i} of {len(pieces)}, {piece.strip()!r}: {e}") from None
    return out
