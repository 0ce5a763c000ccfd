"""The retrieval evaluation's parameters: its ``--retrieval-<field>`` flags, grid keys, defaults and checks
(:class:`RetrievalParams`). A module of its own that imports no torch, scipy or pandas, so that ``run --help``
lists the evaluation's flags without importing the evaluation (:func:`evalkit.evals.registry.flag_declarations`).
"""

from __future__ import annotations

from dataclasses import dataclass

from evalkit.errors import EvalkitError
from evalkit.evals.params import Params, param
from evalkit.evals.retrieval.tasks import DEFAULT_TASKS, load_task


def _as_list(value) -> list:
    if isinstance(value, str):
        return [v for v in (x.strip() for x in value.split(",")) if v]
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _tasks(value, flag: str) -> list:
    tasks = _as_list(value)
    if not tasks:
        raise EvalkitError(f"no retrieval task given: pass {flag} passkey,niah_single_number,...")
    names = [load_task(t).name for t in tasks]  # task names or paths of task files; EvalkitError if bad
    if len(set(names)) != len(names):
        raise EvalkitError(f"retrieval task given twice in {', '.join(tasks)}: list each task once")
    return tasks


def _lengths(value, flag: str) -> list | None:
    if value is None:
        return None
    from evalkit.evals.retrieval import grid as G  # here: the grid builds prompts with torch

    lengths = sorted({G.parse_length(v) for v in _as_list(value)})
    if not lengths:
        raise EvalkitError(f"retrieval needs at least one context length: fix {flag}")
    return lengths


def _depths(value, flag: str) -> list:
    from evalkit.evals.retrieval import grid as G  # here: the grid builds prompts with torch

    depths = sorted({G.parse_depth(v) for v in _as_list(value)})
    if not depths:
        raise EvalkitError(f"retrieval needs at least one needle depth: fix {flag}")
    return depths


def _default_depths() -> list:
    from evalkit.evals.retrieval.grid import DEFAULT_DEPTHS

    return list(DEFAULT_DEPTHS)


@dataclass(frozen=True)
class RetrievalParams(Params):
    """The retrieval evaluation's parameters: grid keys are the field names, CLI flags ``--retrieval-<field>``."""

    tasks: list = param(
        help=f"comma-separated tasks (default all: {','.join(DEFAULT_TASKS)}) or task .yaml paths",
        parse=_tasks,
        factory=lambda: list(DEFAULT_TASKS),
    )
    lengths: list | None = param(
        None,
        "context lengths in tokens incl. template, e.g. 1k,2k (default 1k,2k,4k,8k capped at the model's maximum)",
        parse=_lengths,
    )
    depths: list = param(
        help="needle depths in percent (default 0,25,50,75,100)", parse=_depths, factory=_default_depths
    )
    samples: int = param(10, "samples per (task, length, depth) cell (default 10)", low=1)
    haystack: str | None = param(
        None,
        "haystack for every task: 'filler' or a corpus spec (default: each task's own: filler "
        "for passkey, the embedded corpus for the others)",
    )
    corpus: str = param(
        "embedded", "corpus the tasks' haystacks are cut from where a task asks for one (default embedded)"
    )
    seed: int = param(0, "seed of needles, values and haystack windows (default 0)", low=0)
    batch_size: int = param(4, "prompts per generate() call (default 4)", low=1)
    chat: bool | None = param(None, "wrap prompts in the model's chat template (default: when the tokenizer has one)")
