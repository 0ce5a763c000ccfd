"""Who computes an evaluation's numbers: the backend an evaluation asks, and the stamp its rows carry.

The protocol itself (the plain requests, :class:`TokenScores`, :class:`Capabilities`, the
:class:`Backend` interface) is :mod:`evalkit.evals.protocol`, re-exported here. An evaluation finds
its backend with :func:`backend_of`: the one set with :func:`use_backend`, or else a fresh
:class:`~evalkit.evals.emulation.backend.EmulationBackend` of its own (one backend instance per
evaluation, since a backend keeps its evaluation's baseline). Each row an evaluation emits carries
``info["backend"]`` (:func:`stamp`). vLLM (``evalkit.engines.vllm.backend``) and llama.cpp
(``evalkit.engines.llamacpp.backend``) are the engines' backends, found through the engine registry.
"""

from __future__ import annotations

import dataclasses

from evalkit.errors import EvalkitError
from evalkit.evals.protocol import (  # noqa: F401 (re-exported: the protocol's names)
    REQUESTS,
    Backend,
    Capabilities,
    DecodeRequest,
    LmevalRequest,
    LogprobsRequest,
    TokenScores,
)


def backend_of(ev) -> Backend:
    """The backend an evaluation asks: the one :func:`use_backend` set, or a new emulation backend of
    its own (kept on the evaluation, which it then serves)."""
    backend = getattr(ev, "backend", None)
    if backend is None:
        backend = ev.backend = emulation_backend()
    return backend


def emulation_backend() -> Backend:
    """A new emulation backend (imported here, when an evaluation first asks for one: it loads
    transformers, which building the command line must not)."""
    from evalkit.evals.emulation.backend import EmulationBackend

    return EmulationBackend()


def use_backend(ev, backend: Backend | None):
    """Have ``ev`` ask ``backend`` (None: a new emulation backend), refusing in one line an evaluation or
    option the backend cannot honour. Returns ``ev``."""
    engines = getattr(
        ev, "engines", None
    )  # an eval that measures an engine itself (serving) names the engines it runs on
    if engines is not None:
        engine = getattr(backend, "engine", "emulation")
        if engine not in engines:
            raise EvalkitError(
                f"--eval {ev.name} measures the {' or '.join(engines)} engine itself, not the {engine}: "
                f"run it with --engine {engines[0]} (in a grid: engine: {engines[0]})"
            )
    elif backend is not None:
        backend.check_eval(ev.name, ev.params, ev.request)
    ev.backend = emulation_backend() if backend is None else backend
    return ev


def stamp(rows: list, backend: Backend) -> list:
    """``rows`` with ``info["backend"]`` set to the backend that produced them (and ``info["noise_floor"]``
    in an engine's noise floor run: auto against a second realisation of auto)."""
    extra = {"noise_floor": True} if getattr(backend, "noise_floor", False) else {}
    return [dataclasses.replace(r, info={**r.info, "backend": backend.name, **extra}) for r in rows]
