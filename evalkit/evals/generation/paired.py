"""Per-item statistics of generated answers, and how a scheme's answers differ from the baseline's.

The unit of a paired comparison is an *item-sample*: item i's sample j under the scheme against the
baseline's sample j of the same item, drawn with the same seed (greedy: the same answer but for the
scheme). Intervals over items treat the item as the independent unit (its samples are correlated).

* ``accuracy``: the share of item-samples answered right, with the 95 % Wilson interval over the
  item-samples (with one sample per item exactly lm-eval's proportion and evalkit's lmeval interval;
  with several, samples of one item count as separate trials);
* ``pass@k`` (k samples per item, n = k here): per item the unbiased estimator
  ``1 - C(n - c, k) / C(n, k)`` with c right samples (Chen et al. 2021), averaged over items, with a
  Student's t interval over items;
* ``accuracy_delta``: the scheme's accuracy minus the baseline's, paired: per item the difference of
  its accuracies, Student's t interval over items (exactly [0, 0] when every item agrees, as
  retrieval's ``accuracy_diff``);
* McNemar's exact test: of the discordant item-samples, b went right -> wrong and c wrong -> right;
  under "no change" b ~ Binomial(b + c, 1/2): the two-sided p of ``scipy.stats.binomtest`` (1 with no
  discordant pair). ``flip_right_to_wrong`` = b / N, ``flip_wrong_to_right`` = c / N and
  ``flip_rate`` (the extracted answer changed, right or wrong), with Wilson intervals;
* accuracy by output length: item-samples bucketed by the *baseline's* output length for the same
  item and sample (:func:`length_bucket`, powers of two), so a bucket holds the same item-samples for
  every scheme and its accuracies compare pairwise: does the scheme lose the long answers?
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

from evalkit.evals.stats import binomial_ci, mcnemar_exact, unit_interval

BUCKET_START = 32  # the first bucket is 0-31 tokens, then 32-63, 64-127, ...


def proportion(k: int, n: int) -> tuple[float, float, float]:
    """(k / n, Wilson 95 % low, high)."""
    low, high = binomial_ci(int(k), int(n))
    return (k / n if n else math.nan), low, high


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
    """(exact two-sided McNemar p, b right -> wrong, c wrong -> right) over paired 0/1 outcomes."""
    base, other = np.asarray(base, dtype=bool).ravel(), np.asarray(other, dtype=bool).ravel()
    b, c = int((base & ~other).sum()), int((~base & other).sum())
    return mcnemar_exact(b, c), b, c


def accuracy_delta(base: np.ndarray, other: np.ndarray) -> tuple[float, float, float]:
    """Scheme minus baseline accuracy, paired over items (rows), Student's t interval over items."""
    d = np.asarray(other, dtype=np.float64).mean(1) - np.asarray(base, dtype=np.float64).mean(1)
    return mean_t(d, -1.0, 1.0)


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
