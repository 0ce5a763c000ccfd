"""The generation evaluation's parameters (grid keys; CLI flags ``--generation-<field>``) and their checks.

The settings a server generates with are parameters here, so the numbers are those of the model as it
is served: its chat template (default on: a model without one is refused unless ``chat_template:
false``), an optional system prompt, few-shot examples as turns of the chat, the output budget
``max_gen_toks`` (default: each task's own), ``temperature`` and ``top_p``, and ``samples`` seeded
generations per item (sample j uses seed ``seed + j`` on every scheme, so a scheme and the baseline
draw from the same random numbers). Several samples need ``temperature > 0``: greedy samples repeat.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

from evalkit.data.resources import resource_dir
from evalkit.errors import EvalkitError
from evalkit.evals.params import Params, param

DEFAULT_TASKS = ("evalkit_arith",)
TRACE_BUDGET = 256  # traces' output budget when max_gen_toks is not set (lm-eval's default for tasks)


def tasks_dir() -> Path:
    """The shipped generate-until tasks (``tasks/generation``), indexed for this evaluation only."""
    return resource_dir("tasks") / "generation"


def _tasks(value, flag: str) -> list:
    if value in (None, "", "none"):
        return []
    tasks = value.split(",") if isinstance(value, str) else list(value)
    return list(dict.fromkeys(t.strip() for t in tasks if t and str(t).strip()))


def _include(value, flag: str) -> list:
    include = [value] if isinstance(value, str) else list(value or [])
    return [str(Path(p).resolve()) for p in include]


def _number(name: str, low: float, high: float | None = None, low_open: bool = False):
    def parse(value, flag: str):
        if value is None:
            return None
        try:
            if isinstance(value, bool):
                raise ValueError
            x = float(value)
        except (TypeError, ValueError):
            raise EvalkitError(f"generation {name} must be a number, got {value!r}: fix {flag}") from None
        if not math.isfinite(x) or x < low or (low_open and x == low) or (high is not None and x > high):
            span = f"{'above' if low_open else 'at least'} {low:g}" + (f" and at most {high:g}" if high else "")
            raise EvalkitError(f"generation {name} must be {span}, got {value!r}: fix {flag}")
        return x

    return parse


def _batch_size(value, flag: str):
    from evalkit.evals.lmeval.batching import parse_batch_size

    return parse_batch_size(value)


def resolve_traces(value) -> Path:
    """A traces file by path: as given (relative to the current folder), else among the shipped
    ``tasks/generation`` files (``traces: example_traces.jsonl`` works from any folder)."""
    path = Path(value).expanduser()
    if path.is_file() or path.is_absolute():
        return path.resolve()
    shipped = tasks_dir() / path
    return shipped.resolve() if shipped.is_file() else path.resolve()


def _traces(value, flag: str):
    if value in (None, "", "none"):
        return None
    if not isinstance(value, str):
        raise EvalkitError(f"generation traces must be the path of a JSONL file, got {value!r}: fix {flag}")
    from evalkit.evals.generation.traces import read_traces

    path = resolve_traces(value)
    read_traces(path)  # a bad file: one line naming its line, now rather than after the model loads
    return str(path)


@dataclass(frozen=True)
class GenerationParams(Params):
    """The generation evaluation's parameters (see the module docstring)."""

    tasks: list = param(
        help="comma-separated lm-eval generate_until tasks, e.g. gsm8k_cot_llama,minerva_math500,"
        f"gpqa_diamond_cot_zeroshot,aime25, or YAMLs in tasks/generation (default {','.join(DEFAULT_TASKS)}; "
        "none: traces only)",
        parse=_tasks,
        factory=lambda: list(DEFAULT_TASKS),
    )
    traces: str | None = param(
        None,
        "JSONL of prompts to generate from (each line: prompt or messages, optional reference)",
        parse=_traces,
        metavar="PATH",
    )
    chat_template: bool = param(
        True, "prompt through the model's chat template (default on; off for a base model without one)"
    )
    system_prompt: str | None = param(None, "system prompt (a system message under the chat template)")
    fewshot_as_multiturn: bool | None = param(
        None, "few-shot examples as chat turns (default: on with the chat template)"
    )
    num_fewshot: int | None = param(None, "few-shot examples (default: the task's own)", low=0)
    limit: int | None = param(None, "evaluate only the first N items of each task", low=1)
    max_gen_toks: int | None = param(
        None, "output budget in tokens, below the model's context (default: each task's own; traces 256)", low=1
    )
    temperature: float = param(0.0, "sampling temperature (default 0: greedy)", parse=_number("temperature", 0.0))
    top_p: float | None = param(
        None, "nucleus sampling top_p in (0, 1] (needs temperature > 0)", parse=_number("top_p", 0.0, 1.0, True)
    )
    samples: int = param(1, "generations per item, sample j seeded with seed + j (default 1)", low=1)
    seed: int = param(0, "seed of the first sample (default 0)", low=0)
    batch_size: int | str | None = param(
        None, "lm-eval batch size, a whole number or 'auto' (default: auto on CUDA, 8 on CPU)", parse=_batch_size
    )
    include: list = param(
        help="extra folder of lm-eval task YAMLs (repeatable)", parse=_include, action="append", factory=list
    )
    prefix_cache_hit: bool = param(
        False,
        "serve the requests with prefix caching, as vLLM does by default: a prompt reads the 16-token blocks it "
        "shares with an earlier prompt (chat template, system prompt, few-shot turns) from the quantized cache "
        "(default off: every prompt prefilled whole)",
    )

    def check(self) -> None:
        if self.prefix_cache_hit and self.traces is not None:
            raise EvalkitError(
                "--generation-prefix-cache-hit models prefix caching for the tasks, not the traces: drop one of them"
            )
        if not self.tasks and self.traces is None:
            raise EvalkitError(
                "generation needs tasks or traces: pass --generation-tasks gsm8k_cot_llama or --generation-traces FILE"
            )
        if self.temperature is None:
            self._set("temperature", 0.0)
        if self.samples > 1 and self.temperature == 0:
            raise EvalkitError(
                f"generation samples {self.samples} at temperature 0 repeat one greedy answer: "
                "set --generation-temperature above 0 (e.g. 0.6) or --generation-samples 1"
            )
        if self.top_p is not None and self.temperature == 0:
            raise EvalkitError("generation top_p applies to sampling only: set --generation-temperature above 0")
        if self.fewshot_as_multiturn and not self.chat_template:
            raise EvalkitError(
                "generation fewshot_as_multiturn needs the chat template: drop it or keep --generation-chat-template"
            )
        if self.fewshot_as_multiturn is None:
            self._set("fewshot_as_multiturn", self.chat_template)
        if self.tasks:
            from evalkit.evals.lmeval.adapter import resolve_tasks

            resolve_tasks(self.tasks, (str(tasks_dir()), *self.include))  # unknown names: one line, before any work


def gen_kwargs(p: dict) -> dict:
    """The sampling settings of validated parameters as lm-eval's ``gen_kwargs`` (they update each task's own)."""
    out: dict = {"do_sample": p["temperature"] > 0, "temperature": p["temperature"]}
    if p["top_p"] is not None:
        out["top_p"] = p["top_p"]
    if p["max_gen_toks"] is not None:
        out["max_gen_toks"] = p["max_gen_toks"]
    return out


def file_identity(path: str) -> dict:
    """A traces file as it enters the run id: its name and the SHA-256 of its bytes (not where it lies)."""
    data = Path(path).read_bytes()
    return {"name": Path(path).name, "sha256": hashlib.sha256(data).hexdigest()}
