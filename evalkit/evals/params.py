"""The parameter framework of evaluations: one frozen :class:`Params` dataclass per evaluation, whose
fields (declared with :func:`param`) are the grid keys, the ``--<eval>-<field>`` flags with their help,
type and bound, the defaults and checks, and (``baseline=True``) the protocol that keys a cached baseline.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

from evalkit.errors import EvalkitError


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
    def flag_dests(cls) -> dict[str, str]:
        """Each field's ``run`` flag destination (``<eval>_<field>``; no clash with other evals) -> the field."""
        return {f"{cls.eval_name}_{name}": name for name in cls.names()}

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per field, in a group named for the evaluation; every default None (= the field's)."""
        g = parser.add_argument_group(f"{cls.eval_name} (--eval {cls.eval_name})")
        hints = typing.get_type_hints(cls)
        dests = {field: dest for dest, field in cls.flag_dests().items()}
        for f in fields(cls):
            kind, _ = _type_of(hints[f.name])
            kwargs: dict[str, Any] = dict(dest=dests[f.name], default=None, help=f.metadata.get("help") or None)
            if f.metadata.get("action"):
                kwargs["action"] = f.metadata["action"]
            elif kind is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            elif kind in (int, float):
                kwargs["type"] = kind
            if f.metadata.get("metavar"):
                kwargs["metavar"] = f.metadata["metavar"]
            elif "action" not in kwargs:  # named for the flag, not the dest (--decode-tokens: not DECODE_DECODE)
                kwargs["metavar"] = cls.flag(f.name).lstrip("-").replace("-", "_").upper()
            g.add_argument(cls.flag(f.name), **kwargs)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        """This evaluation's parameters out of parsed arguments (None where a flag was not given)."""
        return {name: getattr(args, dest, None) for dest, name in cls.flag_dests().items()}
