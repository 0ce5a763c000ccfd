"""generation's accuracy by length under the null, simulated through evalkit's own rows.

The null is a scheme that changes nothing but the draw: the scheme's and the baseline's answers to an
item are two independent draws from the item's own accuracy (as a float-noise rerun is). Wrong answers
run long (150 tokens against 40). Bucketed by a length fixed before the scheme acts (the prompt's,
:func:`evalkit.evals.generation.rows.bucket_rows`), the scheme's accuracy equals the baseline's in every
bucket on average; bucketed by the baseline's own output length (as before), the same null shows the
scheme tens of points worse on short answers and better on long ones, the artefact this test exists
to keep out."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evalkit.evals.generation import paired as P
from evalkit.evals.generation.rows import bucket_rows

TRIALS = 300
ITEMS, SAMPLES = 40, 2


def _null_run(rng):
    prompt = rng.integers(10, 200, ITEMS)  # prompt tokens: buckets 0-31, 32-63, 64-127, 128-255
    p = np.clip(0.3 + 0.002 * prompt + rng.uniform(-0.2, 0.2, ITEMS), 0.05, 0.95)  # longer prompts, easier
    base = (rng.random((ITEMS, SAMPLES)) < p[:, None]).astype(float)
    scheme = (rng.random((ITEMS, SAMPLES)) < p[:, None]).astype(float)
    base_tokens = np.where(base == 1, 40, 150) + rng.integers(-8, 9, base.shape)  # wrong answers run long
    return prompt, base, scheme, base_tokens


def _by_baseline_output(base_tokens, base, scheme) -> dict[str, float]:
    """The old bucketing, written out: item-samples by the baseline's own output length."""
    out: dict[str, list] = {}
    for t, b, s in zip(base_tokens.ravel(), base.ravel(), scheme.ravel()):
        out.setdefault(P.bucket_label(P.length_bucket(int(t))), []).append(s - b)
    return {k: float(np.mean(v)) for k, v in out.items()}


@pytest.mark.slow
def test_by_length_rows_show_no_artefact_under_the_null():
    rng = np.random.default_rng(4)
    gaps: dict[str, list[float]] = {}
    old: dict[str, list[float]] = {}
    for _ in range(TRIALS):
        prompt, base, scheme, base_tokens = _null_run(rng)
        for row in bucket_rows(lambda stat: stat, prompt, base, scheme, {}, {}):
            assert row.info["bucketed_by"].startswith("the item's prompt length")
            gaps.setdefault(row.labels["bucket"], []).append(row.value - row.info["baseline_accuracy"])
        for label, gap in _by_baseline_output(base_tokens, base, scheme).items():
            old.setdefault(label, []).append(gap)
    assert set(gaps) == {"0-31", "32-63", "64-127", "128-255"}
    for label, values in gaps.items():  # every bucket: the mean gap is 0 within 3 standard errors, under 3 points
        mean, se = float(np.mean(values)), float(np.std(values, ddof=1) / math.sqrt(len(values)))
        assert abs(mean) <= max(3 * se, 1e-12) and abs(mean) < 0.03, f"bucket {label}: gap {mean:+.3f} (se {se:.3f})"
    short, long = float(np.mean(old["32-63"])), float(np.mean(old["128-255"]))
    assert short < -0.15 and long > 0.15, f"the old bucketing's artefact: {short:+.3f} / {long:+.3f}"
