"""The interface every evaluation implements, and the row format they all emit.

An evaluation is configured once from a plain dict of parameters (from a sweep grid file or the
command line), prepares what is shared by every scheme on a loaded model (tokenized data, the
baseline pass, cached on disk), and then evaluates one scheme at a time::

    ev = get_eval("perplexity")(params)       # validates params: EvalkitError on bad input
    ev.prepare(lm, workdir)                  # once per model: data, baseline
    rows = ev.evaluate(lm, scheme, artifacts) # per scheme: list[MetricRow]

A :class:`MetricRow` is one number: ``metric``, ``value``, an optional 95 % interval, optional
``labels`` that locate it (a position bucket, a task, a context length and depth), and ``info``
(provenance: protocol, corpus hash, lm-eval version...). The sweep adds run id, model, scheme and
eval name to each row before writing it to the results store.
"""

from __future__ import annotations

import argparse
import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from evalkit.errors import EvalkitError


@dataclass(frozen=True)
class MetricRow:
    metric: str
    value: float
    ci_low: float | None = None
    ci_high: float | None = None
    labels: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("value", "ci_low", "ci_high"):
            v = d[key]
            if isinstance(v, float) and not math.isfinite(v):
                d[key] = None if math.isnan(v) else ("inf" if v > 0 else "-inf")
        return d


class Evaluation(ABC):
    """One kind of evaluation (perplexity, retrieval, lm-eval, decode)."""

    name: ClassVar[str]
    #: headline metrics for the one-row-per-scheme table printed by `evalkit run`
    summary_metrics: ClassVar[tuple[str, ...]] = ()

    def __init__(self, params: dict[str, Any] | None = None):
        self.params = self.validate(dict(params or {}))

    @classmethod
    @abstractmethod
    def validate(cls, params: dict[str, Any]) -> dict[str, Any]:
        """Fill defaults and check every parameter; raise EvalkitError naming the bad one."""

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add this evaluation's options to `evalkit run` (names must not clash with other evals)."""

    @classmethod
    def params_from_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        """Pick this evaluation's parameters out of parsed `evalkit run` arguments."""
        return {}

    def canonical_params(self) -> dict[str, Any]:
        """The parameters that decide the numbers (hashed into run ids)."""
        return dict(self.params)

    @abstractmethod
    def prepare(self, lm, workdir: Path) -> None:
        """Once per loaded model: build data and compute (or load) the baseline."""

    @abstractmethod
    def evaluate(self, lm, scheme, artifacts: Path | None = None) -> list[MetricRow]:
        """Evaluate one scheme on the prepared model; write plots or samples under ``artifacts``."""


_REGISTRY = {
    "perplexity": "evalkit.evals.perplexity.evaluation:PerplexityEval",
    "retrieval": "evalkit.evals.retrieval.evaluation:RetrievalEval",
    "lmeval": "evalkit.evals.lmeval.evaluation:LmEvalEval",
    "decode": "evalkit.evals.decode.evaluation:DecodeEval",
}


def eval_names() -> list[str]:
    return list(_REGISTRY)


def get_eval(name: str, registry: dict[str, str] | None = None) -> type[Evaluation]:
    """The evaluation class registered as ``name`` (in ``registry`` when given: a sweep passes the
    registry it started with to its workers, so evals registered at run time resolve the same way)."""
    import importlib

    registry = _REGISTRY if registry is None else registry
    if name not in registry:
        raise EvalkitError(f"unknown eval {name!r}: use one of {', '.join(registry)}")
    module, cls = registry[name].split(":")
    return getattr(importlib.import_module(module), cls)
