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
at 4 samples), clipped to [0, 1] where the scores lie. The difference from the baseline is paired over
the same prompts, the mean of per-sample differences:

- 0/1 scores (``exact``): Tango's score interval for paired proportions
  (:func:`evalkit.evals.paired_binary.paired_difference_ci`). When no prompt changes it is
  ``-/+ z**2 / (n + z**2)``, Wilson's width for 0 of n (-/+ 32.4 points at 8 prompts), never [0, 0]: a
  paired t over 0/1 differences is exactly [0, 0] then, and judged a scheme that loses 10 % of its
  answers "inside" a 2-point budget on 4 prompts 65 % of the time;
- other scores (``recall``): Student's t interval of the mean difference over samples (still [0, 0]
  when every sample's recall is unchanged: a fractional score has no score interval here).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from evalkit.evals.paired_binary import paired_difference_ci
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


def difference_method(scores: Sequence[float], baseline: Sequence[float]) -> str:
    """What :func:`difference_ci` gives for these scores, for a row's ``info["ci"]``."""
    binary = all(np.isin(np.asarray(x, dtype=np.float64), (0.0, 1.0)).all() for x in (scores, baseline))
    return "paired Tango score interval over samples (0/1 scores)" if binary else "paired t over samples"


def difference_ci(scores: Sequence[float], baseline: Sequence[float], seed: int = 0) -> tuple[float, float, float]:
    """(mean difference, low, high) of paired per-sample scores, scheme minus baseline."""
    a, b = np.asarray(scores, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError("scheme and baseline scores must cover the same samples")
    if a.size == 0:
        return (math.nan, math.nan, math.nan)
    if np.all(np.isin(a, (0.0, 1.0))) and np.all(np.isin(b, (0.0, 1.0))):
        right_to_wrong, wrong_to_right = int(((b == 1) & (a == 0)).sum()), int(((b == 0) & (a == 1)).sum())
        low, high = paired_difference_ci(right_to_wrong, wrong_to_right, a.size)
        return (float(a.mean() - b.mean()), low, high)
    low, high = unit_interval(lambda x, y: x.mean(-1) - y.mean(-1), [a, b], seed=seed)
    low, high = max(low, -1.0), min(high, 1.0)  # a difference of scores in [0, 1]
    return (float(a.mean() - b.mean()), low, high)
