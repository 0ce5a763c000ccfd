"""Per-item statistics of generated answers, and how a scheme's answers differ from the baseline's.

The unit of a pair is an *item-sample*: item i's sample j under the scheme against the baseline's
sample j of the same item, drawn with the same seed (greedy: the same answer but for the scheme). The
samples of one item are correlated (an easy item is right in most of them), so every interval and
test here takes the **item** as the independent unit (:mod:`evalkit.evals.paired_binary`):

* ``accuracy`` and the other shares of item-samples (flips, truncated answers, divergence): the share
  with the Wilson interval on design-effect-scaled counts (:func:`clustered_share`; with one sample
  per item exactly the Wilson interval, lm-eval's proportion and evalkit's lmeval interval);
* ``pass@k`` (k samples per item, n = k here): per item the unbiased estimator
  ``1 - C(n - c, k) / C(n, k)`` with c right samples (Chen et al. 2021), averaged over items, with a
  Student's t interval over items;
* ``accuracy_delta``: the scheme's accuracy minus the baseline's, with Tango's score interval for
  paired proportions on design-effect-scaled counts (:func:`accuracy_delta`): never zero-width, so
  "no item changed" in 4 items is [-49, +49] points (Wilson's 0-of-4 width), not a resolved zero;
* the test of "no change" (:func:`item_test`, the ``mcnemar_p`` row): with one sample per item McNemar's
  exact test (of the discordant pairs, b went right -> wrong and c wrong -> right; ``b ~ Binomial(b + c,
  1/2)``), with several the exact sign-flip test over items of ``c_i - b_i``, which is McNemar's when
  k = 1 and holds its level when item accuracies move both ways; ``flip_right_to_wrong`` = b / N,
  ``flip_wrong_to_right`` = c / N and ``flip_rate`` (the extracted answer changed, right or wrong);
* accuracy by length: item-samples bucketed by a length fixed before the scheme acts, the item's
  **prompt** length in tokens (:func:`length_bucket`, powers of two), the same for every scheme and
  independent of any answer. Not the baseline's output length: wrong answers run long, so bucketing by
  it sorts the baseline's outcomes into buckets and, with no effect at all, shows the scheme 15-27
  points worse on short answers and better on long ones;
* first divergence (:func:`first_divergence`): the index of the first generated token where the
  scheme's tokens differ from the baseline's, per item-sample; summarised by the share of
  item-samples that diverge (Wilson) and, over those, the median index (the lower median, with the
  exact order-statistic interval of :func:`evalkit.evals.decode.divergence.median_interval` from 6
  on). Under greedy decoding that index is the first token the scheme's argmax changed; under seeded
  sampling both draw from the same random numbers, so it is the first token the scheme's changed
  distribution moved the draw (within one lm-eval batch; a changed length can shift a later
  batch's random stream on the transformers backend).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.special import comb

from evalkit.evals.paired_binary import clustered_difference_ci, clustered_proportion, item_sign_test
from evalkit.evals.stats import binomial_ci, mcnemar_exact, skewed_mean_ci, unit_interval

BUCKET_START = 32  # the first bucket is 0-31 tokens, then 32-63, 64-127, ...
MCNEMAR_TEST = "exact McNemar (binomtest of the discordant pairs; one sample per item)"
ITEM_TEST = "exact sign-flip test over items of each item's wrong->right minus right->wrong samples"


def proportion(k: int, n: int) -> tuple[float, float, float]:
    """(k / n, Wilson 95 % low, high)."""
    low, high = binomial_ci(int(k), int(n))
    return (k / n if n else math.nan), low, high


def clustered_share(ones: np.ndarray) -> tuple[float, float, float, float]:
    """(share, low, high, design effect) of an items x samples 0/1 matrix: the item as the unit."""
    return clustered_proportion(np.asarray(ones, dtype=np.float64))


def mean_t(
    values: Sequence[float], low_bound: float = -math.inf, high_bound: float = math.inf
) -> tuple[float, float, float]:
    """(mean, Student's t 95 % low, high) over units, the interval held inside the values' own range
    [``low_bound``, ``high_bound``] (a share in [0, 1], a length at least 0); no interval below two units."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return math.nan, math.nan, math.nan
    low, high = unit_interval(lambda a: a.mean(-1), [x])
    if math.isfinite(low):
        low, high = max(low, low_bound), min(high, high_bound)
    return float(x.mean()), low, high


def mean_skewed(values: Sequence[float]) -> tuple[float, float, float, bool]:
    """(mean, low, high, skew-aware) of non-negative right-skewed per-unit values (KL) over units, by
    :func:`evalkit.evals.stats.skewed_mean_ci`; the low end held at 0."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return math.nan, math.nan, math.nan, False
    low, high, skewed = skewed_mean_ci(x, np.ones_like(x))
    return float(x.mean()), (max(low, 0.0) if math.isfinite(low) else low), high, skewed


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one item with n samples of which c are right: 1 - C(n-c, k) / C(n, k)."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - float(comb(n - c, k, exact=True)) / float(comb(n, k, exact=True))


def mean_pass_at_k(correct: np.ndarray, k: int) -> tuple[float, float, float]:
    """pass@k averaged over items (rows of the 0/1 matrix ``correct``, one column per sample), t interval."""
    n = correct.shape[1]
    return mean_t([pass_at_k(n, int(row.sum()), k) for row in correct], 0.0, 1.0)


def mcnemar(base: np.ndarray, other: np.ndarray) -> tuple[float, int, int]:
    """(exact two-sided McNemar p, b right -> wrong, c wrong -> right) over paired 0/1 outcomes, every
    item-sample one pair: right for one sample per item only (:func:`item_test` is the general test)."""
    base, other = np.asarray(base, dtype=bool).ravel(), np.asarray(other, dtype=bool).ravel()
    b, c = int((base & ~other).sum()), int((~base & other).sum())
    return mcnemar_exact(b, c), b, c


def item_test(base: np.ndarray, other: np.ndarray) -> tuple[float, int, int, str]:
    """(p, b right -> wrong, c wrong -> right, test) of items x samples 0/1 matrices: McNemar's exact
    test for one sample per item, else the exact sign-flip test over items (module docstring)."""
    base, other = np.atleast_2d(np.asarray(base, dtype=bool)), np.atleast_2d(np.asarray(other, dtype=bool))
    b, c = int((base & ~other).sum()), int((~base & other).sum())
    if base.shape[1] == 1:
        return mcnemar_exact(b, c), b, c, MCNEMAR_TEST
    changes = (~base & other).sum(1).astype(np.int64) - (base & ~other).sum(1).astype(np.int64)
    return item_sign_test(changes), b, c, ITEM_TEST


def accuracy_delta(base: np.ndarray, other: np.ndarray) -> tuple[float, float, float, float]:
    """(scheme minus baseline accuracy, low, high, design effect) of items x samples 0/1 matrices:
    Tango's score interval on the design-effect-scaled discordant counts."""
    return clustered_difference_ci(np.asarray(base, dtype=bool), np.asarray(other, dtype=bool))


def length_bucket(tokens: int) -> tuple[int, int]:
    """The (first, last) token count of the power-of-two bucket holding ``tokens``: 0-31, 32-63, 64-127, ..."""
    if tokens < BUCKET_START:
        return 0, BUCKET_START - 1
    low = 1 << (int(tokens).bit_length() - 1)
    return low, 2 * low - 1


def bucket_label(bucket: tuple[int, int]) -> str:
    return f"{bucket[0]}-{bucket[1]}"


def first_divergence(base: Sequence[int], other: Sequence[int]) -> int | None:
    """Index of the first token where two generations differ (the shorter one's length when one is a
    prefix of the other), None when they are identical."""
    for i, (a, b) in enumerate(zip(base, other)):
        if a != b:
            return i
    return None if len(base) == len(other) else min(len(base), len(other))


def divergence_summary(steps: Sequence[int | None]) -> dict:
    """Share of pairs that diverge (Wilson) and the median first-divergence index over those that do
    (lower median; exact order-statistic interval from 6 diverging pairs, none below)."""
    from evalkit.evals.decode.divergence import median_interval

    n = len(steps)
    diverged = np.sort(np.array([s for s in steps if s is not None], dtype=np.int64))
    out = {"n": n, "diverged": int(diverged.size), "share": proportion(int(diverged.size), n)}
    if diverged.size:
        median = float(diverged[math.ceil(diverged.size / 2) - 1])
        ranks = median_interval(int(diverged.size))
        low, high = (None, None) if ranks is None else (float(diverged[ranks[0] - 1]), float(diverged[ranks[1] - 1]))
        out["median"] = (median, low, high)
        out["coverage"] = None if ranks is None else round(ranks[2], 4)
    return out
