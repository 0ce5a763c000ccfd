"""Whether vLLM on the GPU a run is planned for can store its ``kv_cache_dtype`` (before any model loads).

A run planned for a GPU (``sweep --dry-run --assume-device h200``: :attr:`PlannedRun.gpu`) whose
scheme is one vLLM stores (``vllm:<dtype>``, or a scheme the run's vLLM profile maps to a
``kv_cache_dtype``) is held to :func:`evalkit.planning.kv_backends.kv_support`: which of vLLM 0.33's
attention backends store that dtype on that GPU's compute capability, for the model's attention
(standard, dense MLA or sparse MLA). NVFP4 on an H200 with MLA, for one, has none.

What it means for the run: under the ``vllm-cuda`` profile or the vLLM engine the number would be
the engine's, so a dtype vLLM cannot store there is a problem; an emulation run measures the scheme
anywhere, so there it is a note saying which GPUs would run it.
"""

from __future__ import annotations

from collections.abc import Sequence

from evalkit.errors import EvalkitError
from evalkit.kv.scheme import parse_scheme
from evalkit.models.folder import model_arch
from evalkit.sweep.preflight.planned import PlannedRun, Problem, distinct

ENGINE_PROFILES = ("vllm-cuda", "vllm-rocm")


def vllm_dtype(run: PlannedRun) -> str | None:
    """The ``kv_cache_dtype`` vLLM would store the run's scheme as (None: not a vLLM cache row)."""
    from evalkit.engines.registry import get_profile

    try:
        scheme = parse_scheme(run.scheme)
    except EvalkitError:
        return None  # the grid (or --schemes) reports it
    if scheme.is_unscaled:
        return None
    from evalkit.engines.registry import engine_of_scheme, get_engine

    declared_vllm = get_engine("vllm")
    owner = engine_of_scheme(scheme)
    if owner is not None:  # an engine's own cache type (its codec family's): vLLM's is its kv_cache_dtype
        return declared_vllm.cache_type(scheme) if owner is declared_vllm else None
    profile = run.engine_profile if run.engine_profile in ENGINE_PROFILES else "vllm-cuda"
    return get_profile(profile).kv_cache_dtype_of(scheme)


def check_gpu_fit(runs: Sequence[PlannedRun]) -> list[Problem]:
    """Each run planned for a GPU whose vLLM cannot store its dtype there: a problem under a vLLM profile
    or engine, a note for the emulation."""
    from evalkit.planning.gpus import get_gpu
    from evalkit.planning.kv_backends import kv_support

    out: list[Problem] = []
    for run in distinct(runs, "model", "scheme", "engine_profile", "engine", "gpu"):
        if run.gpu is None:
            continue
        dtype = vllm_dtype(run)
        if dtype is None:
            continue
        gpu = get_gpu(run.gpu)
        arch = model_arch(run.model.name)
        kind, head = "standard", 128
        if arch.layout is not None:
            kind = ("sparse_mla" if arch.sparse else "mla") if arch.layout.is_mla else "standard"
            head = arch.layout.head_dim
        support = kv_support(gpu, dtype, kind=kind, head_size=head)
        if support.runs:
            continue
        engine = run.engine == "vllm" or run.engine_profile in ENGINE_PROFILES
        what = "vLLM would not run this row" if engine else "the emulation measures it, but vLLM would not run it there"
        out.append(
            Problem(
                run.scheme_key,
                f"{run.scheme} on {gpu.name} (kv_cache_dtype={dtype}): {support.reason}: {what}",
                note=not engine,
            )
        )
    return out
