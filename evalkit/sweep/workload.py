"""What one run of a sweep will process, computed from its parameters without running it.

``evalkit sweep --dry-run`` sizes a grid before any model work (:mod:`evalkit.sweep.estimate`).
Each evaluation sizes itself: :func:`workload` asks the run's evaluation class for its
:meth:`~evalkit.evals.base.Evaluation.workload`, a :class:`~evalkit.evals.sizing.Work` (the forward
calls one scheme's pass makes, the tokens they process, the baseline pass, the disk its caches and
results take; its own module documents how it counts: e.g. :mod:`evalkit.evals.perplexity.workload`).
An evaluation that cannot size itself is counted as 0 with a note saying so.
"""

from __future__ import annotations

from evalkit.evals.base import get_eval
from evalkit.evals.sizing import Forwards, Work

__all__ = ["Forwards", "Work", "workload"]


def workload(eval_name: str, params: dict, facts, device: str = "cpu", registry: dict[str, str] | None = None) -> Work:
    """The :class:`Work` of one run of ``eval_name`` with these (validated) parameters on a model of
    these ``facts``; a :class:`Work` with no forwards, and a note, for an evaluation that cannot size itself."""
    work = get_eval(eval_name, registry).workload(params, facts, device)
    if work is None:
        return Work(eval_name, 0, (), approximate=f"evalkit cannot size eval {eval_name!r}: counted as 0")
    return work
