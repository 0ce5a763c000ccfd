"""gpu_check's sections within a budget: each section gets a share of the wall-time budget and is skipped,
with the reason, when the time left is below what it needs (:func:`run_sections`); a running section checks
the time it has left between items (:class:`Section`) and reports what it could not reach as skipped. Every
check goes to one :class:`Report` (name, status, figures, timing), printed as it comes.
Imported by benchmarks/gpu_check.py.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass


class Report:
    def __init__(self):
        self.checks: list[dict] = []
        self.sections: list[dict] = []

    def add(
        self,
        section: str,
        name: str,
        status: str,
        figures: dict | None = None,
        reason: str = "",
        seconds: float | None = None,
    ) -> None:
        entry = {"section": section, "name": name, "status": status, "figures": figures or {}}
        if reason:
            entry["reason"] = reason
        if seconds is not None:
            entry["seconds"] = round(seconds, 4)
        self.checks.append(entry)
        mark = {"pass": "PASS", "fail": "FAIL", "skipped": "SKIP"}[status]
        print(f"{mark}  {name}" + (f"  ({reason})" if reason else ""), flush=True)

    def count(self, status: str) -> int:
        return sum(c["status"] == status for c in self.checks)


class Section:
    """One section while it runs: its checks, and the time it may still take."""

    def __init__(self, report: Report, key: str, title: str, deadline: float, clock):
        self.report, self.key, self.title, self.deadline, self.clock = report, key, title, deadline, clock
        self.started = clock()

    def left(self) -> float:
        return self.deadline - self.clock()

    def fits(self, seconds: float) -> bool:
        return self.left() >= seconds

    def check(self, name: str, ok: bool, figures: dict | None = None, reason: str = "", seconds: float | None = None):
        self.report.add(self.key, name, "pass" if ok else "fail", figures, reason, seconds)
        return ok

    def skip(self, name: str, reason: str, figures: dict | None = None) -> None:
        self.report.add(self.key, name, "skipped", figures, reason)

    def cut(self, names, why: str = "") -> None:
        for name in names:
            self.skip(name, why or f"cut: section {self.title!r} reached the end of its share of the budget")


@dataclass
class Plan:
    key: str
    title: str
    run: object  # callable(Section)
    min_s: float
    share_s: float
    needs: object = None  # callable() -> reason to skip (str) or None


def run_sections(
    plans: list[Plan], report: Report, end: float, budget_s: float, clock=time.perf_counter, after=None
) -> None:
    """Run ``plans`` in order within the budget ending at ``end`` (a ``clock`` time).

    A section starts only when at least its ``min_s`` is left; it may run until its share is used or
    until only the minimums of the later sections that can still start are left, whichever comes
    first (never less than its own minimum), and checks ``Section.left()`` between items."""
    for i, plan in enumerate(plans):
        now = clock()
        left = end - now
        reserve = 0.0
        for later in plans[i + 1 :]:  # the later sections that would still start after this one's minimum
            if later.min_s <= left - plan.min_s - reserve:
                reserve += later.min_s
        entry = {"key": plan.key, "name": plan.title, "share_s": plan.share_s, "min_s": plan.min_s}
        print(f"\n== {plan.title}", flush=True)
        reason = plan.needs() if plan.needs else None
        if reason is None and left < plan.min_s:
            reason = (
                f"budget: {max(left, 0):.1f} s left of {budget_s:g} s, this section needs at least {plan.min_s:g} s"
            )
        if reason is not None:
            report.add(plan.key, plan.title, "skipped", reason=reason)
            report.sections.append({**entry, "status": "skipped", "reason": reason, "seconds": 0.0})
            if after:
                after()
            continue
        deadline = min(end, max(now + plan.min_s, min(now + plan.share_s, end - reserve)))
        section = Section(report, plan.key, plan.title, deadline, clock)
        first = len(report.checks)
        try:
            plan.run(section)
        except Exception as exc:  # noqa: BLE001 - one failing section must not hide the others
            traceback.print_exc()
            section.check(
                f"{plan.title}: runs",
                False,
                reason=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            )
        mine = report.checks[first:]
        status = (
            "fail"
            if any(c["status"] == "fail" for c in mine)
            else "pass"
            if any(c["status"] == "pass" for c in mine)
            else "skipped"
        )
        seconds = clock() - now
        over = " (over its share)" if seconds > plan.share_s else ""
        entry.update(
            status=status, seconds=round(seconds, 3), cut=any(c["status"] == "skipped" for c in mine), checks=len(mine)
        )
        if status == "skipped":
            entry["reason"] = "; ".join(dict.fromkeys(c.get("reason", "") for c in mine)) or "nothing to check"
        report.sections.append(entry)
        print(f"   {plan.title}: {status}, {seconds:.1f} s{over}", flush=True)
        if after:
            after()
