"""The runs a command is about to make, the checks made on them before any model loads, and one report.

``run``, ``sweep`` and ``sweep --dry-run`` describe what they will run as :class:`PlannedRun` values
(a model, a scheme, the engine, its options and profile) and hand them to every check of a list: a
check is a callable ``(runs) -> list[Problem]`` that reads files and configs only (never weights,
never the network) and returns every problem it finds, not the first. The command prints them all
(:func:`print_problems`), one line each, before the grid's ``FILE:LINE: KEY:`` where a grid gives them,
and exits 2; a dry run prints its estimate first. A problem marked ``note`` is printed as a note and
stops nothing (a check that could not run here, e.g. a hub model whose config is not on this machine).

The checks, one module each: the scale files schemes name (:mod:`.scale_files`), the model's
architecture (:mod:`.model_fit`), the engine profile and the engine (:mod:`.engines`); which of them
each command makes, and its planned runs, are in :mod:`.commands`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from evalkit.sweep.spec import ModelSpec


@dataclass(frozen=True)
class PlannedRun:
    """One (model, scheme, engine) a command will run; evaluations and seeds do not change what is checked."""

    model: ModelSpec
    scheme: str  # canonical scheme string; before ``engine_profile`` is applied unless ``profile_applied``
    engine: str = "emulation"
    engine_options: str = "{}"  # canonical JSON of the engine options it sets
    engine_profile: str | None = None
    profile_applied: bool = True  # the scheme is already the profile's (a grid's engine_profile: key)
    gpu: str | None = None  # the GPU it is planned for (sweep --dry-run --assume-device); None: where it runs
    here: bool = True  # it runs on this machine (False: a dry run, or Ray workers): engine installs are notes
    scheme_key: tuple = ("schemes",)  # the grid key that gives the scheme (its FILE:LINE)
    model_key: tuple = ("models",)  # the grid key that gives the model
    command: str = "sweep"  # the command that plans it (sweep, run): the fixes name its options
    longest: int = 0  # tokens of its evaluation's longest request, prompt + output (0: not sized; engine runs only)
    longest_what: str = ""  # that request in words (the evaluation)
    eval_key: tuple = ("evals",)  # the grid key of its evaluation
    eval_name: str = ""  # its evaluation ("": not planned with one)
    eval_params: str = "{}"  # canonical JSON of the evaluation's parameters

    @property
    def options(self) -> dict:
        return json.loads(self.engine_options)


@dataclass(frozen=True)
class Problem:
    """One line of the report: ``key`` is the grid key path it belongs to (``("schemes", 2)``), ``note``
    a problem that stops nothing."""

    key: tuple
    message: str
    note: bool = False


Check = Callable[[Sequence[PlannedRun]], list[Problem]]


def find_problems(runs: Sequence[PlannedRun], checks: Sequence[Check]) -> list[Problem]:
    """Every problem every check finds, in the checks' order, each once."""
    found: list[Problem] = []
    for check in checks:
        found += check(runs)
    return list(dict.fromkeys(found))


def distinct(runs: Sequence[PlannedRun], *fields: str) -> list[PlannedRun]:
    """The first run of each distinct value of ``fields`` (e.g. one run per scheme)."""
    seen: dict[tuple, PlannedRun] = {}
    for run in runs:
        seen.setdefault(tuple(_field(run, f) for f in fields), run)
    return list(seen.values())


def _field(run: PlannedRun, name: str):
    return run.model.name if name == "model" else getattr(run, name)


def print_problems(problems: Sequence[Problem], locate: Callable[[Problem], str] | None = None) -> int:
    """Print each problem on its own line on stderr (``evalkit: error:`` or ``evalkit: note:``), placed by
    ``locate`` (default: the message alone); 2 when any is an error, else 0."""
    locate = locate or (lambda p: p.message)
    for p in problems:
        print(f"evalkit: {'note' if p.note else 'error'}: {locate(p)}", file=sys.stderr, flush=True)
    return 2 if any(not p.note for p in problems) else 0


def grid_locator(doc) -> Callable[[Problem], str]:
    """``FILE:LINE: KEY: message`` from a grid's :class:`~evalkit.sweep.located_yaml.Located` lines; the
    message alone for a problem the file does not give (a command-line flag's, the disk's)."""

    def locate(p: Problem) -> str:
        return str(doc.error(p.key, p.message)) if p.key[:1] and p.key[:1] in doc.lines else p.message

    return locate
