"""What a paired comparison of two perplexity rows rests on, and rows that measured nothing.

* :func:`evalkit.evals.perplexity.float_spread.paired_difference` against a plain computation: the
  difference of two rows' Δppl per realisation, its mean, the interval over windows of the
  realisation-mean changes (a leave-one-window-out loop written here) widened by the realisations'
  spread; and the paired interval excludes 0 where the two rows' marginal intervals overlap.
* the eval's ``info["units"]``: per window and realisation, the NLL-change sums that give the row's value.
* a scheme whose engine attends a window's one forward from the raw K/V (vLLM TurboQuant): every
  perplexity row is "not measured by this protocol" (no value), never a measured 0.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from evalkit.data.corpus import load_corpus
from evalkit.evals.perplexity.evaluation import PerplexityEval
from evalkit.evals.perplexity.float_spread import paired_difference
from evalkit.kv.scheme import parse_scheme

SMALL = dict(window=96, max_windows=3, bootstrap_samples=200)


def _units(tokens, rows):
    return {"unit": "window", "tokens": list(tokens), "seeds": list(range(len(rows))), "d_sum": [list(r) for r in rows]}


def test_paired_difference_against_a_plain_computation():
    rng = np.random.default_rng(4)
    tokens = np.array([511.0, 511.0, 511.0, 511.0])
    shared = rng.normal(0.004, 0.003, size=4)  # what both rows feel on each window (the text's difficulty)
    a = [(shared + 0.0010 + rng.normal(0, 1e-4, 4)) * tokens for _ in range(4)]
    b = [(shared + rng.normal(0, 1e-4, 4)) * tokens for _ in range(4)]
    value, lo, hi, info = paired_difference(_units(tokens, a), _units(tokens, b))

    def delta(d):
        return math.expm1(np.sum(d) / tokens.sum())

    diffs = np.array([delta(x) - delta(y) for x, y in zip(a, b)])
    assert value == pytest.approx(diffs.mean(), rel=1e-12)
    # the interval: one two-way variance over windows x realisations (float spread counted once), held to a
    # loop-by-loop two-way ANOVA in tests/evals/test_paired_difference.py; here its shape and its reading
    assert lo < value < hi and info["realisations"] == 4 and "float realisations" in info["ci"]
    assert info["p"] < 0.05 and info["se"] == pytest.approx((hi - lo) / (2 * stats.t.ppf(0.975, info["df"])))
    # the rows' own intervals (per row: over windows) overlap; the paired one resolves the order
    for rows in (a, b):
        m = np.mean(rows, 0)
        row_loo = np.array([math.expm1(np.delete(m, i).sum() / np.delete(tokens, i).sum()) for i in range(4)])
        row_half = stats.t.ppf(0.975, 3) * math.sqrt(3 / 4 * ((row_loo - row_loo.mean()) ** 2).sum())
        assert row_half > abs(value)  # each marginal interval is wider than the gap between the rows
    assert lo > 0
    with pytest.raises(ValueError, match="same windows"):
        paired_difference(_units(tokens, a), _units(tokens[:3], [r[:3] for r in b]))


@pytest.fixture(scope="module")
def prose(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "prose.txt"
    path.write_text(load_corpus("embedded").text[:6000])
    return f"file:{path}"


def test_units_give_the_rows_value(tiny, tmp_path, prose):
    ev = PerplexityEval(dict(corpus=prose, float_noise_seeds=2, **SMALL))
    ev.prepare(tiny, tmp_path)
    rows = ev.evaluate(tiny, parse_scheme("int4/tensor/unit"))
    row = next(r for r in rows if r.metric == "ppl_delta_rel" and not r.labels)
    units = row.info["units"]
    assert units["seeds"] == [0, 1, 2] and len(units["tokens"]) == 3 and sum(units["tokens"]) > 0
    tokens = np.array(units["tokens"], float)
    per_realisation = [math.expm1(np.sum(d) / tokens.sum()) for d in units["d_sum"]]
    assert row.value == pytest.approx(np.mean(per_realisation), rel=1e-12)
    assert per_realisation[0] == pytest.approx(row.info["float_noise"]["unperturbed"], rel=1e-12)
    assert per_realisation[1:] == pytest.approx(row.info["float_noise"]["values"], rel=1e-12)
    same, lo, hi, _ = paired_difference(units, units)
    assert (same, lo, hi) == (0.0, 0.0, 0.0)  # a row against itself: exactly no difference


def test_a_scheme_reading_raw_kv_in_one_forward_is_not_measured(tiny, tmp_path, prose):
    ev = PerplexityEval(dict(corpus=prose, **SMALL))
    ev.prepare(tiny, tmp_path)
    rows = ev.evaluate(tiny, parse_scheme("vllm:turboquant_k8v4"))
    assert {r.metric for r in rows} >= {"ppl_delta_rel", "kl_mean", "top1_agreement", "dp_mean"}
    for r in rows:
        assert math.isnan(r.value) and r.ci_low is None and r.ci_high is None, r
        assert r.info["not_measured"].startswith("not measured by this protocol")
    # a scheme whose prefill reads its cache is measured as usual
    measured = ev.evaluate(tiny, parse_scheme("int4/tensor/unit"))
    assert all(not math.isnan(r.value) for r in measured if r.metric == "ppl_delta_rel")
