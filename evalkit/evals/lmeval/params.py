"""The lmeval evaluation's parameters: its ``--lmeval-<field>`` flags, grid keys, defaults and checks
(:class:`LmEvalParams`). A module of its own that imports no torch, scipy or pandas, so that ``run --help``
lists the evaluation's flags without importing the evaluation (:func:`evalkit.evals.registry.flag_declarations`).

``chat_template`` came after the first stores: off (its default) it leaves a run's id as it was
(:meth:`evalkit.evals.lmeval.evaluation.LmEvalEval.canonical_params`). A served instruct model runs with it on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from evalkit.errors import EvalkitError
from evalkit.evals.params import Params, param

DEFAULT_TASKS = ("evalkit_mmlu4",)


def _positive_int(name: str, value, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            if isinstance(value, bool) or float(value) != int(float(value)):
                raise ValueError
            value = int(float(value))
        except (TypeError, ValueError):
            raise EvalkitError(f"lmeval {name} must be an integer, got {value!r}") from None
    if value < minimum:
        raise EvalkitError(f"lmeval {name} must be >= {minimum}, got {value}")
    return value


def _tasks(value, flag: str) -> list:
    tasks = value.split(",") if isinstance(value, str) else list(value)
    tasks = [t.strip() for t in tasks if t and t.strip()]
    if not tasks:
        raise EvalkitError(f"lmeval needs at least one task: {flag} evalkit_mmlu4,...")
    return list(dict.fromkeys(tasks))


def _include(value, flag: str) -> list:
    include = [value] if isinstance(value, str) else list(value or [])
    return [str(Path(p).resolve()) for p in include]


def _metadata(value, flag: str) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise EvalkitError(f"lmeval metadata ({flag}) is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise EvalkitError(f"lmeval metadata ({flag}) must be a JSON object, e.g. '{{\"max_seq_lengths\": [4096]}}'")
    return value


def _batch_size(value, flag: str):
    from evalkit.evals.lmeval.batching import parse_batch_size

    return parse_batch_size(value)


def _count(name: str, minimum: int):
    return lambda value, flag: _positive_int(f"{name} ({flag})", value, minimum)


@dataclass(frozen=True)
class LmEvalParams(Params):
    """The lmeval evaluation's parameters: grid keys are the field names, CLI flags ``--lmeval-<field>``."""

    tasks: list = param(
        help=f"comma-separated lm-eval tasks: built-in names or YAMLs in tasks/lmeval (default {','.join(DEFAULT_TASKS)})",
        parse=_tasks,
        factory=lambda: list(DEFAULT_TASKS),
    )
    num_fewshot: int | None = param(None, "few-shot examples (default: the task's own)", parse=_count("num_fewshot", 0))
    limit: int | None = param(None, "evaluate only the first N items of each task", parse=_count("limit", 1))
    batch_size: int | str | None = param(
        None,
        "HFLM batch size, a whole number or 'auto' (default: auto on CUDA, 8 on CPU); "
        "every batch size gives batch size 1's log-likelihoods (padding is masked)",
        parse=_batch_size,
        metavar="N|auto",
    )
    include: list = param(
        help="extra folder of lm-eval task YAMLs (repeatable)", parse=_include, action="append", factory=list
    )
    bootstrap_iters: int = param(
        100000,
        "lm-eval's bootstrap iterations for its standard errors (default 100000)",
        parse=_count("bootstrap_iters", 0),
    )
    metadata: dict = param(
        help="JSON object passed to the tasks as lm-eval's --metadata, e.g. '{\"max_seq_lengths\": [4096]}' for ruler",
        parse=_metadata,
        factory=dict,
    )
    chat_template: bool = param(
        False,
        "prompt through the model's chat template (lm-eval's apply_chat_template, few-shot examples as turns), as "
        "an instruct model is served; default off: the rows as before this option",
    )

    def check(self) -> None:
        from evalkit.evals.lmeval.adapter import resolve_tasks

        resolve_tasks(self.tasks, tuple(self.include))  # unknown names fail here, before any model work
