"""The row format every evaluation emits: :class:`MetricRow`, one number with its interval, labels and provenance.

A :class:`MetricRow` is one number: ``metric``, ``value``, an optional 95 % interval, optional
``labels`` that locate it (a position bucket, a task, a context length and depth), and ``info``
(provenance: protocol, corpus hash, lm-eval version...). The sweep adds run id, model, scheme and
eval name to each row before writing it to the results store.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


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
