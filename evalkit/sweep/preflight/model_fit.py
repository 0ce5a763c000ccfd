"""Whether each planned scheme fits its model's architecture, read from the model's config alone.

A scheme that cannot run on a model (an MLA cache row on standard attention, a per-token-head dtype
on a head size its kernel refuses, a group width that does not divide head_dim, ``+skip=`` past the
last layer) is otherwise refused when the run binds it to the loaded model, which takes minutes for a
70B. The config comes from :func:`evalkit.models.facts.read_config` (the embedded model, a local folder,
the local Hugging Face cache or an evalkit preset; never the network); a model whose config is not on
this machine is a note, and its schemes are checked once it loads, as before.

The rules are the run's own (:func:`evalkit.kv.memory.check_layout_scheme`: MLA rules, vLLM's
per-token-head and rotation dtypes, group widths; the ``+rope=`` and ``+skip=`` checks of
:class:`evalkit.integration.binding.BoundScheme`), with one more that only vLLM imposes:
``vllm:fp8_ds_mla`` and ``vllm:nvfp4_ds_mla`` run on sparse-attention MLA models only (DeepSeek
V3.2: ``index_topk`` in the config, :func:`evalkit.models.facts.sparse_attention`). In vLLM 0.33 the
only attention backends listing either dtype are sparse ones (``FlashMLASparseBackend``,
vllm/v1/attention/backends/mla/flashmla_sparse.py; FlashInfer's SM120 sparse backend,
flashinfer_mla_sparse.py), the dense MLA backends (FLASHMLA, CUTLASS_MLA, FLASHINFER_MLA, TRITON_MLA,
FLASH_ATTN_MLA, TOKENSPEED_MLA, ROCM_AITER_MLA) list neither, and a backend whose sparseness differs from
the model's is refused (``validate_configuration``, vllm/v1/attention/backend.py). So on dense MLA (Kimi
K2, DeepSeek V3) vLLM has no backend for them; its FP8 cache there is ``vllm:fp8``. With an engine
profile, the profile's own check with the model's head size (``head_dim_multiple``) is made here too.
"""

from __future__ import annotations

from collections.abc import Sequence

from evalkit.errors import EvalkitError, SchemeError
from evalkit.kv.scheme import Scheme, parse_scheme
from evalkit.models.folder import Arch, model_arch
from evalkit.models.info import NO_INTERFACE_MODEL_TYPES, KVLayout
from evalkit.sweep.preflight.engines import applied, profile_or_none
from evalkit.sweep.preflight.planned import PlannedRun, Problem, distinct


def architecture_problem(scheme: Scheme, layout: KVLayout, sparse: bool = False) -> str | None:
    """Why ``scheme`` cannot run on a model of ``layout`` (``sparse``: its attention is sparse), in one
    line; None when it fits."""
    if scheme.is_unscaled:
        return None
    from evalkit.kv.memory import check_layout_scheme

    try:
        check_layout_scheme(scheme, layout)
    except SchemeError as exc:
        return str(exc)
    if scheme.rope_bf16 and not layout.is_mla:
        return "+rope=bf16 applies to multi-head latent attention models only: drop it"
    skips = scheme.skip_layers
    if isinstance(skips, tuple) and skips and max(skips) >= layout.num_layers:
        return f"skip={max(skips)} but the model has layers 0..{layout.num_layers - 1}: fix the layer list"
    row = _mla_row(scheme)
    if row and layout.is_mla and not sparse:
        return (
            f"vllm:{row} is a cache row of vLLM's sparse MLA backends (FLASHMLA_SPARSE; DeepSeek V3.2, whose "
            f"config sets index_topk), and this model's MLA is dense: no dense MLA backend of vLLM 0.33 takes "
            f"{row}. Use vllm:fp8 (what vLLM stores for it: one E4M3 entry of latent and RoPE key per token)"
        )
    return None


def _mla_row(scheme: Scheme) -> str | None:
    """The vLLM dtype of a DeepSeek MLA row scheme (``fp8_ds_mla``, ``nvfp4_ds_mla``), else None."""
    from evalkit.kv.codec import codec_for

    codec = codec_for(scheme.recipe)
    return codec.name if codec is not None and codec.mla else None


def check_model_fit(runs: Sequence[PlannedRun]) -> list[Problem]:
    """Each planned scheme against its model's architecture (and its engine profile's head-size rule); a
    model whose config is not here, or that evalkit cannot run, is said once."""
    archs: dict[str, Arch] = {}
    out: list[Problem] = []
    for run in distinct(runs, "model", "scheme", "engine_profile", "engine"):
        name = run.model.name
        arch = archs.get(name) or archs.setdefault(name, model_arch(name))
        whole = _model_problem(run, arch)
        if whole is not None:
            out += [whole] if whole not in out else []
            continue
        try:
            scheme = parse_scheme(run.scheme)
        except EvalkitError:
            continue  # the grid (or --schemes) reports it
        if arch.latent and not arch.layout.is_mla and not scheme.is_identity:
            out.append(Problem(run.scheme_key, f"{run.scheme} on {name}: {_unread_mla(arch)}"))
            continue
        reason = architecture_problem(scheme, arch.layout, arch.sparse)
        if reason is None and run.engine_profile:
            reason = _profile_problem(run, scheme, arch.layout)
        if reason:
            out.append(Problem(run.scheme_key, f"{run.scheme} on {name} ({arch.describe()}): {reason}"))
    return out


def _unread_mla(arch: Arch) -> str:
    """A config with a latent cache (``kv_lora_rank``) of a model type evalkit does not read as MLA."""
    from evalkit.models.info import MLA_MODEL_TYPES

    return (
        f"its config caches a compressed latent (kv_lora_rank {arch.latent}), but evalkit reads model type "
        f"{arch.layout.model_type} as standard attention (its MLA types: {', '.join(sorted(MLA_MODEL_TYPES))}), "
        "so no quantized scheme would store what the model caches: run auto only, or a model of those types"
    )


def _model_problem(run: PlannedRun, arch: Arch) -> Problem | None:
    """The model's own problem (no config here: a note; a config evalkit cannot size or intercept), or None."""
    if arch.layout is None:
        what = f"model {arch.name}: {arch.why}"
        if arch.fatal:
            return Problem(run.model_key, f"{what}: evalkit cannot size its KV cache")
        return Problem(run.model_key, f"{what}: its schemes are checked against it once it loads", note=True)
    if run.engine == "emulation" and arch.layout.model_type in NO_INTERFACE_MODEL_TYPES:
        return Problem(
            run.model_key,
            f"model {arch.name} ({arch.layout.model_type}) does not route attention through transformers' "
            "AttentionInterface, so evalkit cannot intercept its KV cache: use a model such as llama, "
            "mistral, qwen2/3, gemma, phi3, gpt2, gpt_neox or opt",
        )
    return None


def _profile_problem(run: PlannedRun, scheme: Scheme, layout: KVLayout) -> str | None:
    """The engine profile's own refusal of the scheme on this layout (its head-size rule); None when it
    runs, or when the profile or scheme has a problem of its own (reported by the profile check)."""
    profile = profile_or_none(run.engine_profile)
    mapped = scheme if run.profile_applied or profile is None else applied(profile, scheme)
    if profile is None or mapped is None:
        return None
    try:
        profile.check(mapped, layout)
    except SchemeError as exc:
        return str(exc)
    return None
