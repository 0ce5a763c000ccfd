"""A test-only stand-in for the ``generation`` evaluation, for this branch's gpu preset tests only.

sweeps/gpu.yaml names its reasoning tasks under the grid key ``generation`` (tasks, limit, samples,
max_gen_toks, apply_chat_template), the evaluation built on another branch. Until the two meet, the
tests that read the preset register this stand-in (``generation_standin`` fixture, tests/sweep/conftest.py;
only when no real ``generation`` evaluation is registered), or a command line names it:

    EVALKIT_EVALS=tests.sweep.generation_standin python -m evalkit sweep gpu --dry-run --assume-device h200

It declares the parameters and sizes a run as greedy batched generation of each task's items
(:mod:`evalkit.planning.decision_tasks`); it evaluates nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from evalkit.errors import EvalkitError
from evalkit.evals.base import Evaluation, Params, param, register_eval
from evalkit.evals.registry import _builtin


def _tasks(value, flag):
    tasks = value.split(",") if isinstance(value, str) else list(value or [])
    if not tasks:
        raise EvalkitError(f"generation needs tasks: {flag}")
    return tasks


@dataclass(frozen=True)
class GenerationParams(Params):
    tasks: list = param(help="lm-eval generation tasks", parse=_tasks, factory=list)
    limit: int | None = param(None, "items per task")
    samples: int = param(1, "generations per item", low=1)
    max_gen_toks: int | None = param(None, "generation budget")
    apply_chat_template: bool = param(True, "chat template")


class GenerationStandin(Evaluation):
    Params = GenerationParams
    summary_metrics: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def workload(cls, params, facts, device="cpu"):
        from evalkit.evals.sizing import Work
        from evalkit.planning.decision_sizing import AUTO_BATCH, item_forwards
        from evalkit.planning.decision_tasks import generation_plans

        fw, tokens = [], 0
        for p in generation_plans(params):
            if p.facts is not None:
                fw += item_forwards(p.planned, p.facts.prompt_tokens, p.gen_tokens, p.samples, AUTO_BATCH)
                tokens += p.planned * p.samples * (p.facts.prompt_tokens + p.gen_tokens)
        return Work("generation", tokens, tuple(fw), baseline=tuple(fw), approximate="test stand-in: documented sizes")

    def prepare(self, lm, workdir):
        raise EvalkitError("the generation stand-in only sizes a grid: merge the generation evaluation to run it")

    def evaluate(self, lm, scheme, artifacts=None):
        raise EvalkitError("the generation stand-in only sizes a grid")


STANDIN_PATH = "tests.sweep.generation_standin:GenerationStandin"

if "generation" not in _builtin():  # the real evaluation, once merged, takes the name
    register_eval("generation")(GenerationStandin)
