"""Engine profiles: what a serving engine's KV-cache kernels do, as data, and the scheme that models them.

A profile (:class:`EngineProfile`) is a small frozen table of one engine's KV-cache behaviour: which
``kv_cache_dtype`` values it takes and the evalkit format each stores, how it rounds ``x / scale``
(``+rounding=``, :mod:`evalkit.kv.rounding`), which scale granularities and sources it can run
(checkpoint ``k_scale``/``v_scale``, 1.0 when there are none, never a runtime estimate), what it
does to checkpoint scales, and its requirements. Each fact carries its source in the engine's public
repository (:class:`Fact`), marked ``verified=False`` where it was stated elsewhere (an issue, a
changelog) rather than read in the code or measured. This module says what a profile is; each engine
declares its own in its folder (``evalkit/engines/vllm/profiles.py``: vllm-cpu, vllm-cuda, vllm-rocm;
``engines/sglang/engine.py``; ``engines/tensorrt_llm/engine.py``; a plugin's or a test's engine likewise),
and :data:`evalkit.engines.registry.PROFILES` reads them from the engine registry. A profile may also name the dtypes of its
engine that no scheme models (``not_modelled``, refused in one line saying why) and the names an earlier
release used (``renamed``: SGLang 0.5.23's ``fp4_mx_block16`` was ``fp4_e2m1``). Three operations:

- :meth:`EngineProfile.scheme_for` turns the engine's settings into the evalkit scheme that models
  them: ``get_profile("vllm-cpu").scheme_for("fp8_e4m3")`` is
  ``fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz`` (vLLM's CPU store: ``x * float32(1 / scale)``,
  truncated, an exact zero stored +0), with ``scales=PATH`` (a scale table, e.g. imported from the
  checkpoint with ``python -m evalkit calibrate --import-vllm``)
  ``fp8_e4m3/tensor/static+recipe=vllm_cpu+scales=PATH+rounding=rtz``.
- :meth:`EngineProfile.check` refuses, with one :class:`~evalkit.errors.SchemeError` line naming
  what the engine supports, a scheme that engine cannot run (``head`` scales or dynamic scales on
  vllm-cpu, block16, FP4 or INT formats, the wrong rounding).
- :meth:`EngineProfile.apply` maps a plain emulation scheme onto the engine's kernels: it sets the
  engine's rounding and store recipe, its storage format (E4M3 is E4M3-fnuz on MI300) and its treatment of
  checkpoint scales, then checks the result. This is what ``--engine-profile NAME`` runs.

A profile can also record the attention kernel the engine runs per GPU generation
(:mod:`evalkit.engines.attention_paths`: vllm-cuda runs FlashAttention 3 with Q and P in FP8 on H100/H200,
FlashInfer with only K/V in FP8 on A100/L40S/RTX 50): :meth:`EngineProfile.attention_path` looks it up,
and ``scheme_for(..., gpu="h200")`` gives the scheme with that path's attention precision
(``fp8_e4m3/tensor/unit+attn=fa3``).

Checkpoint scales that the engine changes (vLLM on ROCm doubles them on fnuz platforms; ModelOpt exports FP8
KV scales of at least 1.0) are read and derived by :mod:`evalkit.engines.checkpoint_scales`.

Profiles map the per-tensor ``kv_cache_dtype`` values (``auto``, ``fp8``, ``fp8_e4m3``,
``fp8_e5m2``, and the engines' FP4 dtypes) of standard (MHA/GQA) attention layers onto plain
evalkit schemes; MLA latents (``+rope=bf16``) are refused here. vLLM's other ``kv_cache_dtype``
values (per-token-head INT8/FP8/INT4, TurboQuant, UltraQuant, NVFP4 and the MLA row layouts) are
schemes of their own, ``vllm:<dtype>`` (:mod:`evalkit.kv.codecs.vllm`), each modelling CUDA
vLLM's store kernel as it is, so they need no profile mapping (the report lists them as run by
``vllm-cuda``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.engines.attention_paths import GENERATIONS, AttentionPath, Fact, path_for
from evalkit.engines.checkpoint_scales import declared_of, load_checkpoint_scales, with_engine_scales
from evalkit.errors import SchemeError
from evalkit.kv.formats import Recipe, Rounding, ScaleDType
from evalkit.kv.scheme import AttentionPrecision, Granularity, GranularityKind, ScaleSource, Scheme, parse_scheme


@dataclass(frozen=True)
class KVDtype:
    """One value of the engine's ``kv_cache_dtype``: what it stores and how it rounds."""

    name: str
    format: str | None  # evalkit format of the stored K/V; None: "auto", unquantized
    rounding: Rounding = Rounding.RNE
    # a named evalkit scheme it is exactly (its own scales), e.g. sglang_fp4, or an engine codec's (vllm:octave_k3v4)
    named: str | None = None
    checkpoint_scales: bool = True  # takes per-tensor k_scale/v_scale from the checkpoint
    recipe: Recipe = Recipe.STANDARD  # the store's arithmetic around the rounding (vllm_cpu: x * float32(1/scale))

    @property
    def numerics(self) -> str:
        """The scheme options that name this dtype's store arithmetic: ``+recipe=vllm_cpu+rounding=rtz``, or ''."""
        recipe = f"+recipe={self.recipe.value}" if self.recipe is not Recipe.STANDARD else ""
        return recipe + (f"+rounding={self.rounding.value}" if self.rounding is not Rounding.RNE else "")


@dataclass(frozen=True)
class EngineProfile:
    name: str
    description: str
    kv_cache_dtypes: tuple[KVDtype, ...]
    head_scales: str | None = None  # per-head static scales: None (never) or the attention precision they need
    attention: tuple[AttentionPrecision, ...] = (AttentionPrecision.KV,)
    skip_layers: bool = False  # layers kept unquantized (+skip=) can be expressed in the engine
    format_map: tuple[tuple[str, str], ...] = ()  # emulation format -> the engine's storage format (apply)
    checkpoint_scale_factor: float = 1.0  # the engine multiplies loaded scales by this
    checkpoint_scale_floor: float = 0.0  # loaded scales are at least this (0: no floor)
    head_dim_multiple: int = 0  # FP8 KV needs head_dim % this == 0 (0: no requirement)
    requirements: tuple[str, ...] = ()
    facts: tuple[Fact, ...] = field(default=(), compare=False)
    # the attention kernel it runs per GPU generation (evalkit.engines.attention_paths), and the generation a
    # prediction assumes when none is named
    attention_paths: tuple[AttentionPath, ...] = field(default=(), compare=False)
    default_gpu: str | None = None
    # the engine's dtypes that no evalkit scheme models (name, why), and names an earlier version used
    # ((old, new): refused in one line naming the new one)
    not_modelled: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    renamed: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    release: str | None = None  # the release its kv_cache_dtype values were read in ("SGLang 0.5.23")

    # -- lookups --------------------------------------------------------------------------------
    def dtype(self, kv_cache_dtype: str) -> KVDtype:
        for d in self.kv_cache_dtypes:
            if d.name == kv_cache_dtype:
                return d
        why = dict(self.not_modelled).get(kv_cache_dtype)
        if why is not None:
            raise SchemeError(f"{self.name}'s kv_cache_dtype {kv_cache_dtype} is not modelled: {why}")
        new = dict(self.renamed).get(kv_cache_dtype)
        if new is not None:
            raise SchemeError(
                f"{self.release or self.name} has no kv_cache_dtype {kv_cache_dtype}: it takes {new} "
                f"instead (--kv-cache-dtype {new})"
            )
        raise SchemeError(
            f"{self.name} has no kv_cache_dtype {kv_cache_dtype!r}: use one of "
            f"{', '.join(d.name for d in self.kv_cache_dtypes)}"
        )

    @property
    def formats(self) -> tuple[str, ...]:
        """The evalkit formats this engine stores K/V in (plain schemes, not named ones)."""
        return tuple(
            dict.fromkeys(
                d.format for d in self.kv_cache_dtypes if d.format and not d.named and not _unscaled(d.format)
            )
        )

    @property
    def named(self) -> tuple[str, ...]:
        return tuple(d.named for d in self.kv_cache_dtypes if d.named)

    def _checkpoint_format(self, fmt: str) -> str:
        """The format a checkpoint's scales are calibrated for when this engine stores ``fmt`` (OCP E4M3
        for E4M3-fnuz: the engine converts them)."""
        return {stored: plain for plain, stored in self.format_map}.get(fmt, fmt)

    def _for_format(self, fmt: str) -> KVDtype:
        return next(d for d in self.kv_cache_dtypes if d.format == fmt and not d.named)

    def _supported(self) -> str:
        plain = []
        for f in self.formats:
            d = self._for_format(f)
            rounding = d.numerics
            plain.append(f"{f}/tensor/{'unit|static' if d.checkpoint_scales else 'unit'}{rounding}")
            if self.head_scales and d.checkpoint_scales and f == "fp8_e4m3":
                plain.append(f"{f}/head/static{rounding}+attn={self.head_scales}")
        return ", ".join(plain + list(self.named))

    # -- the attention path per GPU generation ----------------------------------------------------------
    def kv_cache_dtype_of(self, scheme: Scheme) -> str | None:
        """The ``kv_cache_dtype`` that stores ``scheme``'s K/V on this engine (the one named like its format,
        ``fp8_e4m3`` rather than ``fp8``), or None for the unquantized baseline and formats it does not store."""
        if scheme.is_unscaled:
            return None
        name = named_of(scheme)
        if name is not None:
            return next((d.name for d in self.kv_cache_dtypes if d.named == name), None)
        fmt = dict(self.format_map).get(scheme.format, scheme.format)
        names = [d.name for d in self.kv_cache_dtypes if d.format == fmt and not d.named]
        return next((n for n in names if n == fmt), names[0] if names else None)

    def attention_path(self, kv_cache_dtype: str, gpu: str | None = None) -> AttentionPath | None:
        """The attention path this engine runs for ``kv_cache_dtype`` on ``gpu`` (a generation such as
        ``hopper``, or a GPU such as ``h200``; default :attr:`default_gpu`), or None where none was read."""
        gpu = gpu or self.default_gpu
        if not self.attention_paths or gpu is None:
            return None
        return path_for(self.attention_paths, kv_cache_dtype, gpu)

    def path_of(self, scheme: Scheme, gpu: str | None = None) -> AttentionPath | None:
        """The attention path that runs ``scheme``'s ``kv_cache_dtype`` on ``gpu`` (see :meth:`attention_path`)."""
        dtype = self.kv_cache_dtype_of(scheme)
        return None if dtype is None else self.attention_path(dtype, gpu)

    # -- engine settings -> scheme ----------------------------------------------------------------
    def scheme_for(
        self,
        kv_cache_dtype: str,
        scales: str | Path | None = None,
        *,
        attention: str | None = None,
        gpu: str | None = None,
        out_dir: str | Path | None = None,
    ) -> Scheme:
        """The evalkit scheme that models this engine run with ``kv_cache_dtype`` and, optionally, the
        checkpoint's scales (``scales``: a scale table path; per-tensor, or per-head where the engine
        takes them). ``attention="fa3"``: the engine's FlashAttention-3 FP8 path (vllm-cuda); ``gpu``
        (``hopper``, ``h200``...): the attention precision of the path the engine runs on that GPU."""
        d = self.dtype(kv_cache_dtype)
        if d.format is None or _unscaled(d.format):
            if scales is not None:
                raise SchemeError(f"kv_cache_dtype {d.name} keeps K/V unquantized: scales do not apply")
            return Scheme() if d.format is None else parse_scheme(d.format)
        if gpu is not None and attention is None:
            attention = self._gpu_attention(d.name, gpu)
        precision = AttentionPrecision(attention) if attention else AttentionPrecision.KV
        if d.named:
            if scales is not None:
                raise SchemeError(
                    f"{self.name} {d.name} ({d.named}) computes its own per-group scales; "
                    "a checkpoint's per-tensor scale in front of them is not modeled: drop the scales"
                )
            scheme = dataclasses.replace(parse_scheme(d.named), attention=precision)
        elif scales is None:
            scheme = Scheme(
                format=d.format, scales=ScaleSource.UNIT, rounding=d.rounding, recipe=d.recipe, attention=precision
            )
        else:
            if not d.checkpoint_scales:
                raise SchemeError(
                    f"{self.name} runs {d.name} with scale 1.0 only (it takes no checkpoint scales): drop the "
                    f"scales, i.e. {d.format}/tensor/unit{d.numerics}"
                )
            table = load_checkpoint_scales(self, str(scales), self._checkpoint_format(d.format))
            scheme = Scheme(
                format=d.format,
                granularity=Granularity(GranularityKind(table.granularity)),
                scales=ScaleSource.STATIC,
                static_path=str(scales),
                rounding=d.rounding,
                recipe=d.recipe,
                attention=precision,
            )
            self.check(scheme)
            return with_engine_scales(self, scheme, table, self._checkpoint_format(d.format), out_dir)
        self.check(scheme)
        return scheme

    def _gpu_attention(self, kv_cache_dtype: str, gpu: str) -> str:
        if not self.attention_paths:
            raise SchemeError(f"{self.name} records no attention path per GPU: drop the GPU")
        path = self.attention_path(kv_cache_dtype, gpu)
        if path is None:
            read = [
                g
                for g in GENERATIONS
                if any(g in p.generations and kv_cache_dtype in p.kv_cache_dtypes for p in self.attention_paths)
            ]
            raise SchemeError(
                f"{self.name}'s attention path for kv_cache_dtype {kv_cache_dtype} on {gpu} was not read (it is for "
                f"{', '.join(read) or 'no GPU'}): name the attention precision instead (+attn=kv or +attn=fa3)"
            )
        return path.attention.value

    # -- what the engine can run ------------------------------------------------------------------
    def check(self, scheme: Scheme, layout=None) -> None:
        """Refuse (one SchemeError line naming what is supported) a scheme this engine cannot run;
        ``layout`` (a :class:`evalkit.models.info.KVLayout`) adds the engine's head_dim requirement."""
        if scheme.is_unscaled:
            return
        where = f"{self.name} cannot run {scheme}"
        if scheme.rope_bf16:
            raise SchemeError(f"{where}: its profile models standard K/V caches, not MLA latents; drop +rope=bf16")
        if scheme.attention not in self.attention:
            raise SchemeError(
                f"{where}: attention precision {scheme.attention.value} is not one of its kernels "
                f"(it runs {', '.join('+attn=' + a.value if a is not AttentionPrecision.KV else 'kv' for a in self.attention)})"
            )
        if scheme.skip_layers and not self.skip_layers:
            raise SchemeError(f"{where}: it quantizes every attention layer with one kv_cache_dtype; drop +skip=")
        name = named_of(scheme)
        if name is not None:
            if name not in self.named:
                raise SchemeError(f"{where}: {name} is not one of its KV cache dtypes; it runs {self._supported()}")
        else:
            self._check_plain(scheme, where)
        if layout is not None and self.head_dim_multiple:
            for dim in {layout.head_dim, layout.v_head_dim}:
                if dim % self.head_dim_multiple:
                    raise SchemeError(
                        f"{self.name} needs head_dim divisible by {self.head_dim_multiple} for a "
                        f"quantized KV cache; this model's is {dim}"
                    )

    def _check_plain(self, scheme: Scheme, where: str) -> None:
        if scheme.format not in self.formats:
            hint = (
                f" (on this engine {scheme.format} is stored as {dict(self.format_map)[scheme.format]}: apply the profile)"
                if scheme.format in dict(self.format_map)
                else ""
            )
            raise SchemeError(
                f"{where}: it stores K/V as {' or '.join(self.formats)}, not {scheme.format}{hint}; "
                f"it runs {self._supported()}"
            )
        if scheme.scale_dtype is not ScaleDType.FP32 or scheme.tensor_scale or scheme.recipe not in STORE_RECIPES:
            raise SchemeError(f"{where}: its scales are float32 per tensor; it runs {self._supported()}")
        if scheme.attention is AttentionPrecision.FA3 and scheme.format != "fp8_e4m3":
            raise SchemeError(f"{where}: its FlashAttention-3 FP8 path runs E4M3 only: use fp8_e4m3 with +attn=fa3")
        d = self._for_format(scheme.format)
        kind = scheme.granularity.kind
        if kind is GranularityKind.HEAD and self.head_scales and scheme.scales is ScaleSource.STATIC:
            if scheme.attention.value != self.head_scales:
                raise SchemeError(
                    f"{where}: per-head scales run on its FlashAttention-3 path only: add "
                    f"+attn={self.head_scales}, or use tensor scales"
                )
        elif kind is not GranularityKind.TENSOR:
            heads = f", or head with static scales and +attn={self.head_scales}" if self.head_scales else ""
            raise SchemeError(
                f"{where}: it keeps one scale per layer for K and one for V (per-tensor), not per "
                f"{scheme.granularity}: use tensor granularity{heads}"
            )
        if scheme.scales is ScaleSource.DYNAMIC:
            raise SchemeError(
                f"{where}: it never computes scales from the values (a checkpoint's k_scale/v_scale, "
                f"else 1.0): use {scheme.format}/tensor/static+scales=PATH or {scheme.format}/tensor/unit"
            )
        if scheme.scales is ScaleSource.STATIC and not d.checkpoint_scales:
            raise SchemeError(
                f"{where}: it runs kv_cache_dtype {d.name} with scale 1.0 only: use {scheme.format}/tensor/unit"
            )
        if scheme.rounding is not d.rounding or scheme.recipe is not d.recipe:
            how = _ROUNDING_WORDS[d.rounding] + (f" ({_RECIPE_WORDS[d.recipe]})" if d.recipe in _RECIPE_WORDS else "")
            fixed = dataclasses.replace(scheme, rounding=d.rounding, recipe=d.recipe)
            fix = f"use {fixed}" if d.numerics else "drop +rounding= and +recipe="
            raise SchemeError(
                f"{where}: it rounds {scheme.format} {how}: {fix} (or apply the profile: --engine-profile {self.name})"
            )

    # -- emulation scheme -> the engine's kernels -----------------------------------------------------
    def apply(self, scheme: Scheme, *, out_dir: str | Path | None = None) -> Scheme:
        """``scheme`` as this engine's kernels run it: the engine's storage format and rounding, its
        treatment of checkpoint scales (a derived table where it changes them); then :meth:`check`."""
        if scheme.is_unscaled or scheme.name is not None:
            self.check(scheme)
            return scheme
        fmt = dict(self.format_map).get(scheme.format, scheme.format)
        changes: dict = {"format": fmt, **self.numerics_changes(scheme, fmt)}
        try:
            mapped = dataclasses.replace(scheme, **changes)
        except SchemeError as exc:
            raise SchemeError(f"{self.name} cannot run {scheme}: {exc}") from None
        self.check(mapped)
        if mapped.scales is ScaleSource.STATIC:
            source = self._checkpoint_format(mapped.format)
            table = load_checkpoint_scales(self, scheme.static_path, source, declared_of(scheme))
            mapped = with_engine_scales(self, mapped, table, source, out_dir)
        return mapped

    def numerics_changes(self, scheme: Scheme, fmt: str) -> dict:
        """The fields that give ``scheme`` (stored as ``fmt``) this engine's store arithmetic: its rounding
        and, where the scheme's recipe is a store recipe (standard or vllm_cpu), the engine's recipe."""
        if fmt not in self.formats:
            return {}
        d = self._for_format(fmt)
        changes: dict = {"rounding": d.rounding}
        if scheme.recipe in STORE_RECIPES:
            changes["recipe"] = d.recipe
        return changes

    def summary(self) -> str:
        """The profile's facts, one per line, each with its source."""
        lines = [f"{self.name}: {self.description}"]
        lines += [f"  - {f.text} [{f.source}]{'' if f.verified else ' (unverified)'}" for f in self.facts]
        lines += [
            f"  - on {p.where()} ({', '.join(p.kv_cache_dtypes)}): {p.backend}, in FP8 {p.in_fp8}; "
            f"modeled by +attn={p.attention.value}{' (approximate: ' + p.unmodeled + ')' if p.approximate else ''}"
            for p in self.attention_paths
        ]
        return "\n".join(lines)


# recipes that are a store's arithmetic around the rounding (apply swaps them for the engine's own); the
# others (sglang's scale rule, vLLM's per-token-head store) are whole schemes that a profile runs or refuses
STORE_RECIPES = (Recipe.STANDARD, Recipe.VLLM_CPU)
_RECIPE_WORDS = {Recipe.VLLM_CPU: "after x * float32(1 / scale); an exact zero stored +0"}

_ROUNDING_WORDS = {
    Rounding.RNE: "to nearest, ties to even",
    Rounding.RTZ: "toward zero",
    Rounding.RNA: "to nearest, ties away from zero",
}


def named_of(scheme: Scheme) -> str | None:
    """The name a profile's ``KVDtype.named`` gives ``scheme``: its named scheme (``sglang_fp4``), or for an engine
    codec's scheme the family's canonical head (``vllm:octave_k3v4``, options left out); None for plain schemes."""
    if scheme.name is not None:
        return scheme.name
    from evalkit.kv.codec import family_of

    family = family_of(scheme.recipe)
    return None if family is None else family.scheme_name(scheme)


def _unscaled(fmt: str) -> bool:
    """Whether format ``fmt`` keeps K/V unquantized (bf16, fp16): a dtype storing it takes no scales."""
    from evalkit.kv.formats import FORMATS

    return FORMATS[fmt].is_unscaled
