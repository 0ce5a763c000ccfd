"""The report's KL bound (evalkit.report.kl_bound, evalkit.evals.skew_bound): a stored perplexity or decode
KL row keeps Student's t and no units, so the report replaces its high end by ``mean + c(n) x SE``. Checked
against plain computations (numpy's mean and SD of the units, scipy's t, an independent simulation of
``c(n)``), at resolve's split level, and through a SYNTHETIC store: a row whose t interval reads "inside"
but whose units are too few and too spread for that under skew is no longer inside. Its coverage on
lognormal and gamma units is in tests/evals/test_interval_coverage.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from evalkit.evals.skew_bound import N_CAP, skew_factor
from evalkit.evals.stats import interval_text, unit_interval
from evalkit.planning.sequential import relevel
from evalkit.report import kl_bound
from evalkit.report import resolved as ledgers
from evalkit.report.budget import Budget, verdicts
from evalkit.report.recommend import recommend
from evalkit.report.results import load_store
from evalkit.report.tables import summary_frame
from evalkit.sweep.store import ResultStore, RunOutcome

from tests.report.synthetic import LAYOUT

UNITS = np.array([0.004, 0.006, 0.008, 0.016])  # per-sequence KL, CV 0.62 (the published decode rows: up to 0.84)


def stored(x, eval_name="decode", metric="kl_mean", labels=None) -> dict:
    """The row the evaluation stores for per-unit values ``x``: mean, Student's t interval, n."""
    lo, hi = unit_interval(lambda a: a.mean(-1), [np.asarray(x, np.float64)])
    units = "sequences" if eval_name == "decode" else "windows"
    info = {"ci": interval_text("t", units), f"n_{units}": len(x)}
    return {
        "eval": eval_name,
        "metric": metric,
        "value": float(np.mean(x)),
        "ci_low": lo,
        "ci_high": hi,
        "labels": labels or {},
        "info": info,
    }


def test_the_bound_is_the_mean_plus_c_times_the_units_standard_error():
    (got,) = kl_bound.apply([stored(UNITS)])
    se = UNITS.std(ddof=1) / math.sqrt(len(UNITS))  # plain numpy
    assert got["ci_high"] == pytest.approx(UNITS.mean() + skew_factor(4) * se, rel=1e-12)
    assert got["ci_low"] == stored(UNITS)["ci_low"]  # the low end stays Student's t
    assert got["ci_high"] > stored(UNITS)["ci_high"]
    assert kl_bound.MARK in got["info"]["ci"] and "c = 10.50 at n = 4" in got["info"]["ci"]
    (perplexity,) = kl_bound.apply([stored(UNITS, "perplexity", "free_kl_mean")])
    assert perplexity["ci_high"] == pytest.approx(got["ci_high"], rel=1e-12)


def test_c_is_an_independent_simulations_quantile_and_falls_towards_t():
    rng = np.random.default_rng(12345)  # another seed and a plain loop over the two shapes
    quantiles = []
    for draw, mu in ((lambda s: rng.lognormal(0.0, 1.0, s), math.exp(0.5)), (lambda s: rng.exponential(1.0, s), 1.0)):
        x = draw((100_000, 4))
        quantiles.append(np.quantile((mu - x.mean(1)) / (x.std(1, ddof=1) / 2), 0.975))
    assert skew_factor(4) == pytest.approx(max(quantiles), rel=0.04)
    ns = [2, 3, 4, 6, 8, 20, 50]
    cs = [skew_factor(n) for n in ns]
    assert all(c > stats.t.ppf(0.975, n - 1) for c, n in zip(cs, ns))  # wider than t at every n
    assert cs == sorted(cs, reverse=True)
    assert skew_factor(N_CAP + 100) == skew_factor(N_CAP)  # past the cap: the (larger) c at the cap
    assert math.isnan(skew_factor(1))


def test_a_float_spread_row_adds_the_spread_in_quadrature():
    """A perplexity row widened by the float spread: SE from its ``ci_sampling``, the float term t(R-1) x SD x
    sqrt(1 + 1/R) as stored, added in quadrature to c(n) x SE."""
    value, sampling, sd, seeds, n = 0.0103, (0.0087, 0.0119), 0.0003, [1, 2, 3], 4
    t = stats.t.ppf(0.975, n - 1)
    se = (sampling[1] - sampling[0]) / 2 / t
    hf = stats.t.ppf(0.975, len(seeds)) * sd * math.sqrt(1 + 1 / (len(seeds) + 1))
    half = math.hypot(t * se, hf)
    info = {
        "ci": interval_text("t", "windows") + ", widened by the float spread",
        "n_windows": n,
        "ci_sampling": list(sampling),
        "float_noise": {"sd": sd, "seeds": seeds},
    }
    row = {"eval": "perplexity", "metric": "kl_mean", "value": value, "ci_low": value - half, "ci_high": value + half}
    (got,) = kl_bound.apply([{**row, "info": info}])
    assert got["ci_high"] == pytest.approx(value + math.hypot(skew_factor(n) * se, hf), rel=1e-12)
    assert got["ci_low"] == value - half


def test_what_cannot_be_read_back_loses_its_interval_and_what_names_no_method_is_left():
    row = stored(UNITS)
    (moved,) = kl_bound.apply([{**row, "ci_high": row["ci_high"] + 1e-3}])  # not the t interval of its n
    assert moved["ci_high"] is None and "can read back: dropped" in moved["info"]["ci"]
    boot = {**row, "info": {**row["info"], "ci": interval_text("bootstrap", "sequences")}}
    assert kl_bound.apply([boot])[0]["ci_high"] is None
    bare = {**row, "info": {"n_sequences": 4}}  # a hand-written row: no method named
    assert kl_bound.apply([bare]) == [bare]
    other = {**row, "metric": "top1_agreement"}
    assert kl_bound.apply([other]) == [other]


def test_relevel_gives_the_same_bound_at_the_split_level():
    row = stored(UNITS)
    q = 0.9875
    lo, hi = relevel(row, q)
    se = UNITS.std(ddof=1) / 2
    assert hi == pytest.approx(UNITS.mean() + skew_factor(4, q) * se, rel=1e-12)
    assert lo == pytest.approx(UNITS.mean() - stats.t.ppf(1 - (1 - q) / 2, 3) * se, rel=1e-12)
    assert skew_factor(4, q) > skew_factor(4)


def test_resolve_reads_a_grown_kl_row_at_its_look_level(tmp_path):
    """A KL row of a run ``sweep --resolve`` grew (its ledger names it) is read at the look's level 98.75 %
    with the same bound, once: the 95 % pass leaves it alone."""
    grown = {**stored(UNITS), "run_id": "r1", "model": "tiny", "scheme": "fp8_e4m3/tensor/unit"}
    entry = {"scheme": grown["scheme"], "eval": "decode", "knob": "sequences"}
    ledger = {"alpha": 0.05, "stages": 3, "entries": [{**entry, "stages": [{"stage": 1, "n": 4, "run_id": "r1"}]}]}
    ledgers.write_ledger(tmp_path, ledger)
    rows, notes, _ = ledgers.apply([grown], {"r1"}, tmp_path)
    (got,) = kl_bound.apply(rows)  # left alone: already at its look's level
    assert got["ci_high"] == pytest.approx(relevel(grown, 0.9875)[1], rel=1e-12)
    assert "at 98.75 %" in got["info"]["ci"] and "re-derived at 98.75 %" in got["info"]["ci"]
    assert any("stage 1 of 3" in n for n in notes)


def _store(folder, decode_units):
    """SYNTHETIC: a baseline and one FP8 scheme, perplexity comfortably inside the budget, decode KL stored
    (Student's t, as the evaluation stores it) from ``decode_units``."""
    ppl = stored(np.full(4, 0.004) + np.array([0, 1e-4, 2e-4, 3e-4]), "perplexity")
    runs = [
        ("auto", "perplexity", [{**ppl, "metric": "ppl_delta_rel", "value": 0.0, "ci_low": 0.0, "ci_high": 0.0}]),
        (
            "fp8_e4m3/tensor/unit",
            "perplexity",
            [
                {**ppl, "metric": "ppl_delta_rel", "value": 0.001, "ci_low": -0.001, "ci_high": 0.003},
                ppl,
            ],
        ),
        ("fp8_e4m3/tensor/unit", "decode", [stored(decode_units, labels={"bucket": "0-63"})]),
    ]
    store = ResultStore(folder)
    for i, (scheme, ev, rows) in enumerate(runs):
        rows = [{k: v for k, v in r.items() if k != "eval"} for r in rows]
        spec = {"model": {"name": "tiny"}, "scheme": scheme, "eval": ev, "params": {"i": i}}
        store.append(RunOutcome(f"r{i}", spec, True, rows, info={"kv_layout": LAYOUT, "dtype": "bfloat16"}))
    return folder


def test_a_skewed_decode_kl_on_four_sequences_is_no_longer_inside(tmp_path):
    """Four sequences whose t interval (its high end 0.0169) reads "inside" a 0.02 KL budget: under skew that
    high end misses 12 % or more, and the report's bound (0.0361) straddles the limit: unresolved. With the
    same mean over tightly agreeing sequences the bound stays inside and the scheme is recommended."""
    assert stored(UNITS)["ci_high"] < 0.02
    budget = Budget(max_retrieval_drop=None, max_flip_rate=None, max_dp_drop=None)
    frame = summary_frame(load_store(_store(tmp_path / "wide", UNITS)))
    row = frame[frame["scheme"] == "fp8_e4m3/tensor/unit"].iloc[0].dropna().to_dict()
    v = next(v for v in verdicts(row, budget) if v.name == "decode KL")
    assert v.state == "unresolved" and row["decode_kl_last_hi"] == pytest.approx(
        UNITS.mean() + skew_factor(4) * UNITS.std(ddof=1) / 2
    )
    line = recommend(frame, budget, engine=None)["tiny"]
    assert "the data cannot tell" in line and "decode KL (last bucket) ≤ 0.02 nats unresolved" in line, line
    tight = UNITS.mean() + np.array([-3e-4, -1e-4, 1e-4, 3e-4])
    frame = summary_frame(load_store(_store(tmp_path / "tight", tight)))
    assert recommend(frame, budget, engine=None)["tiny"].startswith("tiny: use fp8_e4m3/tensor/unit"), frame
