"""The interface every evaluation implements, and the row format they all emit.

An evaluation is configured once from a plain dict of parameters (from a sweep grid file or the
command line), prepares what is shared by every scheme on a loaded model (tokenized data, the
baseline pass, cached on disk), and then evaluates one scheme at a time::

    ev = get_eval("perplexity")(params)       # validates params: EvalkitError on bad input
    ev.prepare(lm, workdir)                  # once per model: data, baseline
    rows = ev.evaluate(lm, scheme, artifacts) # per scheme: list[MetricRow]

An evaluation is one self-describing unit, a class registered with :func:`register_eval`:

* its parameters are ONE frozen dataclass (a :class:`Params` subclass, the class's ``Params``):
  the field names are the grid keys, the CLI flags are ``--<eval>-<field>`` (help text, type and
  bound from the field), defaults and validation come from the fields (plus the class's
  :meth:`Params.check` for rules across fields), and the fields marked ``baseline=True`` are the
  protocol that keys its cached baseline (:meth:`Params.protocol`);
* its ``--dry-run`` size is its :meth:`Evaluation.workload` (a :class:`evalkit.evals.sizing.Work`);
* what the report shows of it is its :class:`ReportSpec`: the summary columns, the plots (as
  ``"module:function"`` strings, so an evaluation never imports the report) and its budget criteria.

Registry. The built-in evaluations are the subpackages of :mod:`evalkit.evals` that hold an
``evaluation`` module, named by their folder and imported only when asked for (an optional
dependency missing breaks that one eval only). Others register themselves: a module named in the
``EVALKIT_EVALS`` environment variable (comma-separated module names), or in the ``evalkit.evals``
entry-point group of an installed package, is imported by the registry and its
``@register_eval("name")`` class becomes available to ``run``, grids, ``sweep --dry-run`` and
``report`` alike. :func:`registry` gives name -> ``"module"`` or ``"module:Class"`` for every known
eval; a sweep passes it to its workers, so evals registered at run time resolve the same way there.

A :class:`MetricRow` is one number: ``metric``, ``value``, an optional 95 % interval, optional
``labels`` that locate it (a position bucket, a task, a context length and depth), and ``info``
(provenance: protocol, corpus hash, lm-eval version...). The sweep adds run id, model, scheme and
eval name to each row before writing it to the results store.
"""

from __future__ import annotations

import argparse
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from evalkit.errors import EvalkitError
from evalkit.evals.params import Params, param  # noqa: F401 (re-exported: an evaluation's building blocks)
from evalkit.evals.registry import (  # noqa: F401 (re-exported)
    _REGISTRY,
    ENTRY_POINTS,
    PLUGINS_ENV,
    _builtin,
    eval_names,
    get_eval,
    register_eval,
    registry,
)
from evalkit.evals.report_spec import Column, Criterion, ReportSpec, resolve  # noqa: F401 (re-exported)
from evalkit.evals.rows import MetricRow  # noqa: F401 (re-exported)


# ---- the evaluation ----------------------------------------------------------------------------
class Evaluation(ABC):
    """One kind of evaluation (perplexity, retrieval, lm-eval, decode), registered with :func:`register_eval`."""

    name: ClassVar[str]
    #: the parameters dataclass (flags, grid keys, defaults, validation, baseline protocol)
    Params: ClassVar[type[Params] | None] = None
    #: headline metrics for the one-row-per-scheme table printed by `evalkit run`
    summary_metrics: ClassVar[tuple[str, ...]] = ()
    #: what `evalkit report` shows of it
    report: ClassVar[ReportSpec] = ReportSpec()
    # bumped by hand when a commit means to change this evaluation's numbers (as lm-eval keeps a version per
    # task): re-keys only its runs (evalkit.sweep.code_identity.components); its fingerprint groups are
    # pinned under the new version (tests/numerics)
    numerics_version: ClassVar[int] = 0
    # the kind of request it asks a backend for (evalkit.evals.protocol.REQUESTS: "logprobs", "decode",
    # "generate", "lmeval"); None: it computes on the emulation itself, so no engine can give its numbers.
    # A backend's refusal reads this (Backend.check_eval), never a list of evaluation names.
    request: ClassVar[str | None] = None
    # the parameter that counts its units (windows, sequences, samples, items): what ``sweep --resolve`` doubles
    # to grow the evidence of a criterion that straddles its limit (evalkit.cli.resolve); None: not grown
    grows: ClassVar[str | None] = None

    def __init__(self, params: dict[str, Any] | None = None):
        self.params = self.validate(dict(params or {}))

    @classmethod
    def validate(cls, params: dict[str, Any]) -> dict[str, Any]:
        """Fill defaults and check every parameter; raise EvalkitError naming the bad one."""
        if cls.Params is None:
            raise TypeError(f"{cls.__name__} declares no Params dataclass: give it one or override validate()")
        return cls.Params.from_dict(params).to_dict()

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add this evaluation's options to `evalkit run` (``--<eval>-<field>``: no clash with other evals)."""
        if cls.Params is not None:
            cls.Params.add_arguments(parser)

    @classmethod
    def flag_dests(cls) -> dict[str, str]:
        """Where `evalkit run` puts this evaluation's flags: destination -> parameter (:meth:`Params.flag_dests`)."""
        return {} if cls.Params is None else cls.Params.flag_dests()

    @classmethod
    def params_from_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        """Pick this evaluation's parameters out of parsed `evalkit run` arguments."""
        return {} if cls.Params is None else cls.Params.from_args(args)

    @classmethod
    def workload(cls, params: dict[str, Any], facts, device: str = "cpu"):
        """What one run with these (validated) parameters processes, for ``sweep --dry-run``: a
        :class:`evalkit.evals.sizing.Work`, or None when this evaluation cannot be sized."""
        return None

    def canonical_params(self) -> dict[str, Any]:
        """The parameters that decide the numbers (hashed into run ids)."""
        return dict(self.params)

    def require_prepared(self, ready: bool) -> None:
        """EvalkitError unless ``ready``: evaluate() on a model needs prepare() on it first."""
        if not ready:
            raise EvalkitError(f"{self.name}: evaluate() needs prepare() on this loaded model first")

    @abstractmethod
    def prepare(self, lm, workdir: Path) -> None:
        """Once per loaded model: build data and compute (or load) the baseline."""

    @abstractmethod
    def evaluate(self, lm, scheme, artifacts: Path | None = None) -> list[MetricRow]:
        """Evaluate one scheme on the prepared model; write plots or samples under ``artifacts``."""
