"""The longcontext evaluation's parameters: its ``--longcontext-<field>`` flags, grid keys, defaults and checks
(:class:`LongContextParams`). A module of its own that imports no torch, scipy or pandas, so that ``run --help``
lists the evaluation's flags without importing the evaluation (:func:`evalkit.evals.registry.flag_declarations`).

``chat_template`` and ``longbench2_max_len`` came after the first stores: at their defaults (unset; 120,000) they
leave a run's id as it was (:meth:`evalkit.evals.longcontext.evaluation.LongContextEval.canonical_params`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from evalkit.errors import EvalkitError
from evalkit.evals.longcontext.longbench2 import PUBLISHED_MAX_LEN
from evalkit.evals.longcontext.tasks import DEFAULT_TASKS
from evalkit.evals.params import Params, param


def _tasks(value, flag: str) -> list:
    names = value.split(",") if isinstance(value, str) else list(value or [])
    names = list(dict.fromkeys(n.strip() for n in names if n and str(n).strip()))
    if not names:
        raise EvalkitError(f"longcontext needs at least one task: {flag} ruler,longbench2 (or the offline stand-ins)")
    return names


def _lengths(value, flag: str) -> list | None:
    if value is None:
        return None
    from evalkit.evals.retrieval.grid import parse_length

    values = value.split(",") if isinstance(value, str) else list(value)
    lengths = sorted({parse_length(v) for v in values if str(v).strip()})
    if not lengths:
        raise EvalkitError(f"longcontext lengths ({flag}) is empty: give e.g. 4k,8k,16k")
    return lengths


def _limit(value, flag: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EvalkitError(f"longcontext limit ({flag}) must be a whole number >= 1, got {value!r}")
    return value


def _limits(value, flag: str) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise EvalkitError(f"longcontext limits ({flag}) is not valid JSON: {exc}") from None
    if not isinstance(value, dict) or not all(
        v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1) for v in value.values()
    ):
        raise EvalkitError(
            f"longcontext limits ({flag}) maps task names to a whole number >= 1 or null (all), "
            "e.g. '{\"longbench2\": null}'"
        )
    return {str(k): v for k, v in value.items()}


def _include(value, flag: str) -> list:
    include = [value] if isinstance(value, str) else list(value or [])
    return [str(Path(p).resolve()) for p in include]


def _batch_size(value, flag: str):
    from evalkit.evals.lmeval.batching import parse_batch_size

    return parse_batch_size(value)


@dataclass(frozen=True)
class LongContextParams(Params):
    """The longcontext evaluation's parameters: grid keys are the field names, CLI flags ``--longcontext-<field>``."""

    tasks: list = param(
        help="comma-separated lm-eval tasks or groups (ruler, niah_single_1, ..., longbench2, longbench2_*) "
        f"or the offline stand-ins in tasks/longcontext (default {','.join(DEFAULT_TASKS)})",
        parse=_tasks,
        factory=lambda: list(DEFAULT_TASKS),
    )
    lengths: list | None = param(
        None,
        "RULER context lengths in tokens, e.g. 4k,8k,16k,32k,64k,128k (lm-eval's max_seq_lengths; "
        "default: the task's own, 4096 for RULER, every length for the stand-ins)",
        parse=_lengths,
    )
    limit: int | None = param(None, "the first N items of each task at each length (default: all)", parse=_limit)
    limits: dict = param(
        help="per asked-for task or group, its own limit (JSON; null: all), e.g. '{\"longbench2\": null}'",
        parse=_limits,
        factory=dict,
    )
    batch_size: int | str | None = param(
        None, "HFLM batch size, a whole number or 'auto' (default: auto on CUDA, 8 on CPU)", parse=_batch_size
    )
    include: list = param(
        help="extra folder of lm-eval task YAMLs (repeatable)", parse=_include, action="append", factory=list
    )
    prefix_cache_hit: bool = param(
        False,
        "serve the generated items with prefix caching, as vLLM does by default: a prompt reads the 16-token blocks "
        "it shares with an earlier prompt (a RULER length's instructions and haystack up to where two items differ) "
        "from the quantized cache (default off; log-likelihood tasks keep one forward)",
    )
    chat_template: bool | None = param(
        None,
        "prompt every task through the model's chat template (lm-eval's apply_chat_template); --no-... for none; "
        "default: the published LongBench v2 tasks through it where the tokenizer has one, as served, the others "
        "without (their rows as before this option)",
    )
    longbench2_max_len: int = param(
        PUBLISHED_MAX_LEN,
        "published LongBench v2: cut each prompt in the middle to this many tokens (default 120000, as published; "
        "lower it for a model with a shorter context)",
        low=1,
    )

    def check(self) -> None:
        from evalkit.evals.longcontext.tasks import resolve

        unknown = sorted(set(self.limits) - set(self.tasks))
        if unknown:
            raise EvalkitError(f"longcontext limits names {', '.join(unknown)}, not among its tasks: fix limits")
        resolve(self.tasks, tuple(self.include))  # unknown names fail here, before any model work
