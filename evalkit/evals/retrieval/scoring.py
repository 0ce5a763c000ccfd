"""Scoring retrieval answers, and per-cell accuracy with confidence intervals.

The prompt ends with the answer prefix ("... mentioned in the provided text is"), so the model's
continuation starts with the answer. Both continuation and expected answers are normalized:
lower-cased and split into *words*, maximal runs of letters, digits and hyphens (so a UUID is one
word, and surrounding punctuation, quotes and whitespace are dropped).

- ``exact`` (single-answer tasks): score 1 when the continuation's first word equals the expected
  answer's normalized form, else 0. "12345." and " 12345 is the key" score 1; "is 12345",
  "123456" and "the pass key" score 0, so listing many numbers, or a longer number, does not pass.
- ``recall`` (multi-value, multi-query): the fraction of expected answers that occur among the
  continuation's words.

A cell's accuracy is the mean score of its samples. Its 95 % interval is the binomial (Wilson)
interval when every score is 0 or 1, and otherwise (recall tasks) Student's t interval of the
mean over samples (:func:`evalkit.evals.stats.unit_interval`; a percentile bootstrap covers about 80 %
at 4 samples), clipped to [0, 1] where the scores lie. The difference from the baseline is paired over the same prompts: the mean of
per-sample differences with Student's t interval (exactly [0, 0] when all agree).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from evalkit.evals.stats import binomial_ci, unit_interval

_WORD = re.compile(r"[0-9a-z]+(?:-[0-9a-z]+)*")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def normalize(answer: str) -> str:
    return " ".join(words(answer))


def score(generated: str, answers: Sequence[str], scoring: str) -> float:
    """The score of one continuation against the expected answers (see the module docstring)."""
    got = words(generated)
    expected = [normalize(a) for a in answers]
    if scoring == "exact":
        if len(expected) != 1:
            raise ValueError("exact scoring takes exactly one expected answer")
        return float(bool(got) and got[0] == expected[0])
    if scoring == "recall":
        have = set(got)
        return sum(e in have for e in expected) / len(expected)
    raise ValueError(f"unknown scoring {scoring!r}")


def accuracy_ci(scores: Sequence[float], seed: int = 0) -> tuple[float, float, float, str]:
    """(mean, low, high, method) of one cell's sample scores."""
    s = np.asarray(scores, dtype=np.float64)
    if s.size == 0:
        return (math.nan, math.nan, math.nan, "none")
    mean = float(s.mean())
    if np.all((s == 0) | (s == 1)):
        low, high = binomial_ci(int(s.sum()), int(s.size))
        return (mean, low, high, "wilson")
    low, high = unit_interval(lambda x: x.mean(-1), [s], seed=seed)
    return (mean, max(low, 0.0), min(high, 1.0), "t")  # scores lie in [0, 1]: so does their mean


def difference_ci(scores: Sequence[float], baseline: Sequence[float], seed: int = 0) -> tuple[float, float, float]:
    """(mean difference, low, high) of paired per-sample scores, scheme minus baseline."""
    a, b = np.asarray(scores, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError("scheme and baseline scores must cover the same samples")
    if a.size == 0:
        return (math.nan, math.nan, math.nan)
    low, high = unit_interval(lambda x, y: x.mean(-1) - y.mean(-1), [a, b], seed=seed)
    low, high = max(low, -1.0), min(high, 1.0)  # a difference of scores in [0, 1]
    return (float(a.mean() - b.mean()), low, high)
