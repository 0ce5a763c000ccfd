"""The conformance statistics (evalkit.evals.paired_stats) against plain computations and synthetic
cases whose verdict is known: a copy conforms, a shifted copy differs, a short noisy sample cannot tell."""

from __future__ import annotations

import math

import numpy as np

from evalkit.evals import paired_stats as ps


def test_block_ids_never_cross_a_window():
    ids = ps.block_ids([0, 5, 12], block=4)
    assert ids.tolist() == [0, 0, 0, 0, 1, 2, 2, 2, 2, 3, 3, 3]


def test_bootstrap_statistics_equal_a_plain_computation_on_each_resample():
    rng = np.random.default_rng(1)
    a, b = rng.normal(0.03, 0.1, 200), rng.normal(0.03, 0.1, 200)
    ids = ps.block_ids([0, 100, 200], block=10)
    boot = ps.BlockBootstrap(ids, resamples=5, seed=3)
    gaps, rs = boot.gap_r(a, b)
    for k in range(5):
        w = boot.counts[k][ids]  # each token weighted by how often its block was drawn
        ma, mb = np.average(a, weights=w), np.average(b, weights=w)
        assert math.isclose(gaps[k], 100 * (math.expm1(ma) - math.expm1(mb)), rel_tol=1e-9)
        cov = np.average((a - ma) * (b - mb), weights=w)
        ref = cov / math.sqrt(np.average((a - ma) ** 2, weights=w) * np.average((b - mb) ** 2, weights=w))
        assert math.isclose(rs[k], ref, rel_tol=1e-9)


def _runs(n, shift, noise, seeds=20, seed=0):
    rng = np.random.default_rng(seed)
    truth = rng.normal(0.03, 0.2, n)
    engine = truth + rng.normal(0, noise, n)
    emu = truth + rng.normal(0, noise, n) + shift
    noisy = np.stack([truth + rng.normal(0, noise, n) + shift for _ in range(seeds)])  # the emulation, re-rounded
    return engine, emu, noisy


def _verdict(engine, emu, noisy, block=16):
    q, qr, _, _ = ps.noise_quantiles(emu, noisy)
    boot = ps.BlockBootstrap(ps.block_ids([0, len(emu)], block), resamples=500)
    return ps.compare(emu, engine, q, qr, boot)


def test_a_float_copy_conforms_and_a_shifted_one_differs_at_large_n():
    engine, emu, noisy = _runs(40000, 0.0, 0.05)
    assert _verdict(engine, emu, noisy).verdict is ps.Verdict.CONFORMS
    engine, emu, noisy = _runs(40000, 0.01, 0.05)  # +1 pp on every token
    c = _verdict(engine, emu, noisy)
    assert c.verdict is ps.Verdict.DIFFERS and c.gap_low > c.noise_gap_pp


def test_an_uncorrelated_candidate_differs_by_r():
    engine, emu, noisy = _runs(4000, 0.0, 0.05)
    q, qr, _, _ = ps.noise_quantiles(emu, noisy)
    other = np.random.default_rng(9).permutation(engine)  # the engine's Δppl, no per-token agreement
    c = ps.compare(other, engine, q, qr, ps.BlockBootstrap(ps.block_ids([0, 4000], 16), resamples=500))
    assert abs(c.gap_pp) < 1e-9 and c.r_high < c.noise_r and c.verdict is ps.Verdict.DIFFERS


def test_a_short_noisy_sample_cannot_tell_and_says_the_n_it_needs():
    engine, emu, noisy = _runs(300, 0.002, 0.3)
    c = _verdict(engine, emu, noisy)
    assert c.verdict is ps.Verdict.CANNOT_TELL
    half = (c.gap_high - c.gap_low) / 2
    assert c.n_to_resolve == math.ceil(300 * (half / 0.125) ** 2) > 300


def test_the_rule_on_its_edges():
    v = ps.verdict
    assert v((-0.2, 0.2), 0.96, 0.1, 0.95) is ps.Verdict.CONFORMS  # inside the 0.25 pp tolerance
    assert v((-0.3, 0.3), 0.96, 0.35, 0.95) is ps.Verdict.CONFORMS  # inside the larger noise quantile
    assert v((0.12, 0.3), 0.96, 0.1, 0.95) is ps.Verdict.DIFFERS  # beyond noise, not inside the tolerance
    assert v((-0.1, 0.1), 0.90, 0.1, 0.95) is ps.Verdict.DIFFERS  # r below the noise r
    assert v((0.05, 0.3), 0.96, 0.1, 0.95) is ps.Verdict.CANNOT_TELL
