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
import importlib
import math
import os
import re
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields
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


# ---- parameters --------------------------------------------------------------------------------
def param(
    default: Any = MISSING,
    help: str = "",
    *,
    low: int | float | None = None,
    flag: str | None = None,
    baseline: bool = False,
    parse: Callable[[Any, str], Any] | None = None,
    action: str | None = None,
    metavar: str | None = None,
    factory: Callable[[], Any] | None = None,
):
    """One evaluation parameter: a dataclass field whose metadata drives its flag and its check.

    ``low``: the smallest value an integer may take; ``flag``: the CLI flag when it is not
    ``--<eval>-<field>`` (it must still start with ``--<eval>-``); ``baseline``: the field decides
    the cached baseline's numbers (it is part of :meth:`Params.protocol`); ``parse(value, flag)``:
    turns a grid or flag value into the stored one (raising EvalkitError naming ``flag``) where
    the field's type alone does not say how; ``action``/``metavar``: passed to argparse;
    ``factory``: a default built per instance (lists, dicts)."""
    meta = dict(help=help, low=low, flag=flag, baseline=baseline, parse=parse, action=action, metavar=metavar)
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _type_of(hint) -> tuple[Any, bool]:
    """(the one non-None type of a field's annotation or None when there are several, whether None is allowed)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return (args[0] if len(args) == 1 else None), len(args) < len(typing.get_args(hint))
    return hint, False


@dataclass(frozen=True)
class Params:
    """An evaluation's parameters: one frozen dataclass, subclassed per evaluation.

    Field names are the grid keys and the keys of ``Evaluation.params``; every field's flag, type,
    bound, default and help text come from its :func:`param`. Construction checks every field
    (integers, booleans or unset, non-empty strings, ``low``, ``parse``), then :meth:`check`
    (rules across fields, derived defaults). ``eval_name`` is set by :func:`register_eval`."""

    eval_name: ClassVar[str] = "eval"

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for f in fields(self):
            value = self._checked(f, hints[f.name], getattr(self, f.name))
            object.__setattr__(self, f.name, value)
        self.check()

    def check(self) -> None:
        """Rules across fields and derived defaults (set with :meth:`_set`); raise EvalkitError."""

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _checked(self, f, hint, value):
        flag, where = self.flag(f.name), f"{self.eval_name} {f.name}"
        if f.metadata.get("parse") is not None:
            return f.metadata["parse"](value, flag)
        kind, optional = _type_of(hint)
        if value is None and optional:
            return None
        if kind is bool:
            if not isinstance(value, bool):
                raise EvalkitError(
                    f"{where} must be true, false or unset (auto), got {value!r}: pass {flag} or --no-{flag[2:]}"
                )
        elif kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise EvalkitError(f"{where} must be an integer, got {value!r}: fix {flag}")
            low = f.metadata.get("low")
            if low is not None and value < low:
                raise EvalkitError(
                    f"{self.eval_name} parameter {f.name} = {value} is too small: use {flag} {low} or more"
                )
        elif kind is str:
            if not isinstance(value, str) or not value.strip():
                raise EvalkitError(
                    f"{self.eval_name} needs a {f.name.replace('_', ' ')}: pass {flag} "
                    f"({f.metadata.get('help') or 'a non-empty string'}), got {value!r}"
                )
        return value

    # -- dict and CLI ---------------------------------------------------------------------------
    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_dict(cls, params: dict[str, Any]) -> Params:
        """Validated parameters from a grid or flag dict: None means the default; unknown keys are refused."""
        unknown = set(params) - set(cls.names())
        if unknown:
            raise EvalkitError(
                f"unknown {cls.eval_name} parameter(s) {', '.join(sorted(unknown))}: use {', '.join(cls.names())}"
            )
        return cls(**{k: v for k, v in params.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        """The parameters as plain JSON values (``Evaluation.params``; hashed into run ids)."""
        return {f.name: (list(v) if isinstance(v, tuple) else v) for f in fields(self) for v in [getattr(self, f.name)]}

    def protocol(self) -> dict[str, Any]:
        """The fields marked ``baseline=True``: what decides the cached baseline's numbers (its cache key)."""
        return {
            k: v
            for k, v in self.to_dict().items()
            if next(f for f in fields(self) if f.name == k).metadata.get("baseline")
        }

    @classmethod
    def flag(cls, name: str) -> str:
        f = next(f for f in fields(cls) if f.name == name)
        return f.metadata.get("flag") or f"--{cls.eval_name}-{name}".replace("_", "-")

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per field, in a group named for the evaluation; every default None (= the field's)."""
        g = parser.add_argument_group(f"{cls.eval_name} (--eval {cls.eval_name})")
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            kind, _ = _type_of(hints[f.name])
            kwargs: dict[str, Any] = dict(
                dest=f"{cls.eval_name}_{f.name}", default=None, help=f.metadata.get("help") or None
            )
            if f.metadata.get("action"):
                kwargs["action"] = f.metadata["action"]
            elif kind is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            elif kind in (int, float):
                kwargs["type"] = kind
            if f.metadata.get("metavar"):
                kwargs["metavar"] = f.metadata["metavar"]
            g.add_argument(cls.flag(f.name), **kwargs)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        """This evaluation's parameters out of parsed arguments (None where a flag was not given)."""
        return {name: getattr(args, f"{cls.eval_name}_{name}", None) for name in cls.names()}


# ---- what the report shows -------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    """One summary-table column of an evaluation: its ``metric`` row (value and 95 % interval) per
    model x scheme, kept in the summary frame as ``key`` (default: the metric).

    ``labels="none"`` takes the unlabelled row; ``labels="last:bucket"`` the row whose ``bucket``
    label starts latest (the frame also keeps that label as ``<key>_bucket``). With a ``heading``
    the column is shown: the value times ``scale`` in ``fmt`` with ``unit``, its interval with
    ``interval``; ``baseline`` is what the baseline row shows instead (None: its value). It is shown
    when the frame has the column ``when`` (default: its own), and, with a ``group``, only when the
    report is asked for that group (``report --columns GROUP``)."""

    metric: str
    key: str = ""
    heading: str = ""
    fmt: str = ".3g"
    scale: float = 1.0
    unit: str = ""
    interval: bool = False
    baseline: str | None = None
    labels: str = "none"
    when: str = ""
    group: str = ""

    @property
    def column(self) -> str:
        return self.key or self.metric


@dataclass(frozen=True)
class Criterion:
    """One quality-budget criterion of ``evalkit report``'s recommendation, on a summary column.

    ``column`` may be ``*/<suffix>``: one criterion per column ending so, named with ``{task}``
    (the part before the suffix). The value compared is the column, its ``abs`` or its negation
    (``transform``), against the :class:`evalkit.report.recommend.Budget` field ``budget``. A
    ``required`` criterion is listed (unmeasured) even when the column is missing, and a scheme is
    recommended only when every required criterion is measured."""

    name: str
    column: str
    budget: str
    lower_is_better: bool
    text: str
    unit: str = "%"
    digits: int = 2
    transform: str = ""  # "", "abs" or "neg"
    signed: bool = False  # show the column's own signed value rather than the compared one
    required: bool = False


@dataclass(frozen=True)
class ReportSpec:
    """What ``evalkit report`` shows of an evaluation, iterated over by the report (never by name).

    ``columns``: summary-table columns (:class:`Column`); ``frames`` / ``displays`` / ``notes`` /
    ``plots``: ``"module:function"`` strings resolved by the report, for what a plain column cannot
    say: ``frame(rows, slot)`` adds summary-frame columns from this eval's rows (``slot(model,
    scheme)`` is that row's dict), ``display(row, is_baseline)`` returns ``{heading: text}``,
    ``note(frame)`` returns lines printed under the table, ``plot(results, style=..., bands=...)``
    draws from a view of the store holding this eval's rows only and returns ``{name: figure}``
    (the report saves each as PNG and SVG; it passes only the options the function accepts). ``criteria``: budget criteria (:class:`Criterion`).
    ``order``: where the eval's columns, notes and plots sit among the others (lowest first)."""

    columns: tuple[Column, ...] = ()
    frames: tuple[str, ...] = ()
    displays: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    plots: tuple[str, ...] = ()
    criteria: tuple[Criterion, ...] = ()
    order: int = 100


def resolve(path: str) -> Any:
    """The object a ``"module:name"`` string names (EvalkitError naming it when it cannot be imported)."""
    module, _, name = path.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in name.split(".") if name else ():
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise EvalkitError(f"{path!r} cannot be resolved ({type(exc).__name__}: {exc}): fix the declaration") from None
    return obj


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


# ---- registry ----------------------------------------------------------------------------------
PLUGINS_ENV = "EVALKIT_EVALS"  # comma-separated modules that register evaluations
ENTRY_POINTS = "evalkit.evals"  # entry-point group of installed packages' evaluation modules
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

#: name -> "module:Class" of every evaluation registered in this process (tests may add entries)
_REGISTRY: dict[str, str] = {}
_loaded_plugins: set[str] = set()


def register_eval(name: str):
    """Class decorator: make an :class:`Evaluation` subclass the evaluation ``name`` (its flags are
    ``--<name>-<field>``). Registering the same class again is a no-op; another class under a
    taken name is refused."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise EvalkitError(f"eval name {name!r} must be lower-case letters, digits and _ (starting with a letter)")

    def decorate(cls):
        path = f"{cls.__module__}:{cls.__qualname__}"
        if _REGISTRY.get(name, path) != path:
            raise EvalkitError(f"eval {name!r} is registered twice ({_REGISTRY[name]} and {path}): rename one")
        params = cls.__dict__.get("Params") or getattr(cls, "Params", None)
        if params is not None:
            bound = params.__dict__.get("eval_name")
            if bound not in (None, name):
                raise EvalkitError(f"{params.__name__} already belongs to eval {bound!r}: give {name!r} its own Params")
            params.eval_name = name
        cls.name = name
        _REGISTRY[name] = path
        return cls

    return decorate


def _builtin() -> dict[str, str]:
    """name -> module of the built-in evaluations: the subpackages of evalkit.evals with an evaluation module."""
    here = Path(__file__).resolve().parent
    return {
        d.name: f"evalkit.evals.{d.name}.evaluation"
        for d in sorted(here.iterdir())
        if d.is_dir() and (d / "evaluation.py").is_file() and _NAME.match(d.name)
    }


def _load_plugins() -> None:
    """Import the modules named in EVALKIT_EVALS and the ``evalkit.evals`` entry points (each once)."""
    names = [m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]
    try:
        from importlib.metadata import entry_points

        names += [ep.value.partition(":")[0] for ep in entry_points(group=ENTRY_POINTS)]
    except Exception:  # noqa: BLE001  (a broken installed distribution's metadata: no entry-point plugins)
        pass
    for module in names:
        if module in _loaded_plugins:
            continue
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise EvalkitError(
                f"evaluation module {module!r} (from {PLUGINS_ENV} or the {ENTRY_POINTS} entry points) "
                f"cannot be imported ({type(exc).__name__}: {exc}): fix the name or install it"
            ) from None
        _loaded_plugins.add(module)


def registry() -> dict[str, str]:
    """name -> "module" (a built-in not imported yet) or "module:Class", for every evaluation known here:
    built-ins first (in folder order), then those registered by plugins or at run time."""
    _load_plugins()
    out = _builtin()
    out.update(_REGISTRY)
    return out


def eval_names() -> list[str]:
    return list(registry())


def get_eval(name: str, registry: dict[str, str] | None = None) -> type[Evaluation]:
    """The evaluation class registered as ``name`` (in ``registry`` when given: a sweep passes the
    registry it started with to its workers, so evals registered at run time resolve the same way)."""
    known = globals()["registry"]() if registry is None else registry
    if name not in known:
        raise EvalkitError(f"unknown eval {name!r}: use one of {', '.join(known)}")
    path = known[name]
    if ":" in path:
        module, cls = path.split(":", 1)
        obj = importlib.import_module(module)
        for part in cls.split("."):
            obj = getattr(obj, part)
        return obj
    importlib.import_module(path)  # registers its evaluation
    if name not in _REGISTRY:
        raise EvalkitError(
            f"module {path} registers no eval {name!r}: decorate its class with @register_eval({name!r})"
        )
    return get_eval(name, {name: _REGISTRY[name]})
