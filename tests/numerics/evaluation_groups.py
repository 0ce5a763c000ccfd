"""The evaluations' number functions on fixed inputs, one group per module of evalkit.evals.

Each group function returns the numbers (and rows) its functions give on exact inputs
(:func:`tests.numerics.exact.exact_normal` and friends); :mod:`tests.numerics.test_evaluation_fingerprint`
hashes each group's output rounded to 12 significant digits (reductions may sum in another order on
another processor; a change to the computation moves far more than that). Nothing here caches: a
monkeypatched evalkit function takes effect on the next call.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import torch

from tests.numerics.exact import exact_normal, exact_uniform, exact_values


def _row(r) -> dict:
    return dataclasses.asdict(r)


def stats_group() -> dict:
    """evalkit.evals.stats: the t (jackknife) and bootstrap intervals, the paired t test, Wilson and exact."""
    from evalkit.evals import stats

    out = {}
    for n in (2, 4, 8, 20):
        x = exact_normal((n,), seed=10 + n, scale=0.5) + 0.1
        c = 50 + np.floor(exact_uniform((n,), seed=20 + n) * 100)
        s = exact_normal((n,), seed=30 + n) * c / 10
        out[f"n{n}"] = {
            "mean_t": stats.unit_interval(lambda a: a.mean(-1), [x], method="t"),
            "ratio_t": stats.jackknife_t_ci(lambda a, b: a.sum(-1) / b.sum(-1), [s, c]),
            "ratio_t90": stats.jackknife_t_ci(lambda a, b: a.sum(-1) / b.sum(-1), [s, c], confidence=0.9),
            "ratio_bootstrap": stats.unit_interval(
                lambda a, b: a.sum(-1) / b.sum(-1), [s, c], method="bootstrap", n_resamples=300, seed=3
            ),
            "p": stats.paired_pvalue(x, x + exact_normal((n,), seed=40 + n, scale=0.2)),
        }
    zeros = np.zeros(6)
    out["identity"] = {
        "t": stats.unit_interval(lambda a: a.mean(-1), [zeros], method="t"),
        "bootstrap": stats.unit_interval(lambda a: a.mean(-1), [zeros], method="bootstrap", n_resamples=100),
        "p_equal": stats.paired_pvalue(zeros, zeros),
        "p_shift": stats.paired_pvalue(zeros, zeros + 1),
    }
    out["binomial"] = {
        f"{k}/{n} {method}": stats.binomial_ci(k, n, method=method)
        for k, n in ((0, 10), (3, 10), (10, 10), (17, 40), (1, 1))
        for method in ("wilson", "exact")
    }
    return out


def skewed_group() -> dict:
    """evalkit.evals.stats.skewed_mean_ci: the skew-aware interval of a mean of right-skewed non-negative units."""
    from evalkit.evals import stats

    out = {}
    for n in (2, 4, 20):  # right-skewed non-negative units (KL): positive values, and one of them 0
        v = np.exp(exact_normal((n,), seed=50 + n, scale=0.8))
        c = 50 + np.floor(exact_uniform((n,), seed=60 + n) * 100)
        out[f"skewed_n{n}"] = [stats.skewed_mean_ci(v * c, c), stats.skewed_mean_ci(np.r_[0.0, v[1:]] * c, c)]
    out["skewed_identity"] = stats.skewed_mean_ci(np.zeros(4), np.ones(4))
    return out


def paired_binary_group() -> dict:
    """evalkit.evals.paired_binary: Tango's interval, the clustered interval and share, the item test."""
    from evalkit.evals import paired_binary as pb

    base = exact_uniform((9, 4), seed=70) > 0.4
    other = np.where(exact_uniform((9, 4), seed=71) > 0.8, ~base, base)
    return {
        "tango": [pb.paired_difference_ci(b, c, n) for b, c, n in ((0, 0, 4), (0, 0, 8), (2, 12, 50), (3, 1, 20))],
        "tango_fractional": pb.paired_difference_ci(1.5, 0.25, 6.5),
        "clustered": [pb.clustered_difference_ci(base[:, :k], other[:, :k]) for k in (1, 2, 4)],
        "share": [pb.clustered_proportion(other[:, :k]) for k in (1, 2, 4)],
        "wilson": pb.wilson(2.5, 7.25),
        "item_test": [pb.item_sign_test(d) for d in ([1, -1, 0, 2, 3], [0, 0], [-1] * 5 + [1], [4, 3, -2, 1, 1, 2])],
    }


def paired_stats_group() -> dict:
    """evalkit.evals.paired_stats: blocks, Δppl, Pearson r, the block bootstrap, noise quantiles, verdicts."""
    from evalkit.evals import paired_stats as ps

    offsets = [0, 70, 150, 200]
    ids = ps.block_ids(offsets, block=16)
    d_ref = exact_normal((200,), seed=50, scale=0.05) + 0.01
    d_cand = d_ref + exact_normal((200,), seed=51, scale=0.01)
    noise = np.stack([d_cand + exact_normal((200,), seed=60 + s, scale=0.005) for s in range(4)])
    boot = ps.BlockBootstrap(ids, resamples=400, seed=2)
    gap, r = boot.gap_r(d_cand, d_ref)
    q_gap, q_r, gaps, rs = ps.noise_quantiles(d_cand, noise)
    comparison = ps.compare(d_cand, d_ref, q_gap, q_r, boot)
    return {
        "ids": ids,
        "dppl": ps.dppl_pct(d_ref),
        "pearson": ps.pearson(d_ref, d_cand),
        "gap_interval": boot.interval(gap),
        "r_interval": boot.interval(r),
        "noise": [q_gap, q_r, gaps, rs],
        "compare": comparison.as_dict(),
        "to_resolve": ps.tokens_to_resolve(1000, 0.3),
        "verdicts": [
            ps.verdict(ci, r_high, q, q_r_)
            for ci, r_high, q, q_r_ in (
                ((-0.1, 0.1), 0.99, 0.05, 0.9),
                ((0.5, 0.9), 0.99, 0.1, 0.9),
                ((-0.1, 0.4), 0.99, 0.05, 0.9),
                ((-0.1, 0.1), 0.5, 0.05, 0.9),
            )
        ],
    }


def float_noise_group() -> dict:
    """evalkit.evals.float_noise: ulps, and tensors and a small model moved by a few of them."""
    from evalkit.evals import float_noise as fn

    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = exact_values((256,), seed=70, low_exp=-8, high_exp=4).to(dtype)
        moved = x.clone()
        fn.perturb_(moved, torch.Generator().manual_seed(5), ulps=1.0)
        out[str(dtype)] = {
            "ulp": fn.ulp(x),
            "moved": moved,
            "steps": (moved.double() - x.double()) / fn.ulp(x).double(),
        }
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 3))
    with torch.no_grad():
        for i, (_, p) in enumerate(sorted(model.named_parameters())):
            p.copy_(exact_values(tuple(p.shape), seed=80 + i, low_exp=-6, high_exp=0))
    copy = fn.perturbed_model(model, seed=3, ulps=2.0)
    out["model"] = {name: p for name, p in sorted(copy.named_parameters())}
    return out


def float_spread_group() -> dict:
    """evalkit.evals.perplexity.float_spread: t quantiles, the combined interval, the units. (Its paired
    difference decides the report's order marks, no stored number: tests/evals/test_paired_difference.py.)"""
    from evalkit.evals.perplexity import float_spread as fs

    tokens = np.array([60.0, 64.0, 58.0, 64.0, 40.0])
    d_a = exact_normal((3, 5), seed=90, scale=2.0) + 1.0
    reruns = [(s, [tokens, d_a[s] + 100.0, np.full(5, 100.0)]) for s in (1, 2)]
    return {
        "t": [fs.t_quantile(n) for n in (2, 3, 4, 6, 11)],
        "combine": fs.combine(0.25, (0.2, 0.31), [0.27, 0.22, 0.26], [1, 2, 3], 1.0),
        "combine_no_ci": fs.combine(0.25, (None, None), [0.27, 0.22], [1, 2], 1.0),
        "units": fs.units_info(tokens, d_a[0], reruns),
        "ci_text": [fs.ci_text("t", 0), fs.ci_text("bootstrap", 3)],
    }


def kl_topk_group() -> dict:
    """evalkit.evals.kl_topk on fixed logits: the baseline summary, KL estimate, bound, variance, top-1, NLL."""
    from evalkit.evals import kl_topk

    out = {}
    for vocab in (400, 100):  # a tail beyond the top-160, and none
        logits = torch.from_numpy(exact_normal((12, vocab), seed=100 + vocab, scale=4.0))
        moved = logits + torch.from_numpy(exact_normal((12, vocab), seed=200 + vocab, scale=0.3))
        # float32 log-probs rounded from float64 ones: the same bits on every processor (a float32
        # log_softmax is not: its exp and sums differ in the last bit across SIMD widths)
        lp, lq = torch.log_softmax(logits, -1).float(), torch.log_softmax(moved, -1).float()
        summary = kl_topk.summarize(lp, torch.Generator().manual_seed(7))
        kl, lower, var = kl_topk.kl_from_summary(summary, lq)
        same_kl, same_lower, _ = kl_topk.kl_from_summary(summary, lp)
        targets = torch.arange(12) * 7 % vocab
        out[f"vocab{vocab}"] = {
            "summary": {k: (v.float() if k == "w" else v) for k, v in summary.items()},
            "kl": kl,
            "lower": lower,
            "var": var,
            "identity_kl": [same_kl, same_lower],
            "top1": lq.argmax(-1) == lp.argmax(-1),
            "nll": -lq.gather(1, targets[:, None])[:, 0],
            "tail": kl_topk.tail_logmass(lq, summary["head"].long()),
        }
    return out


def _token_scores(n: int, seed: int):
    from evalkit.evals.protocol import TokenScores

    base = torch.from_numpy(2.0 + exact_uniform((n,), seed=seed) * 3)
    nll = base + torch.from_numpy(exact_normal((n,), seed=seed + 1, scale=0.2))
    kl = torch.from_numpy(exact_uniform((n,), seed=seed + 2) * 0.02)
    return TokenScores(
        nll=nll,
        base_nll=base,
        agree=torch.from_numpy(exact_uniform((n,), seed=seed + 3) > 0.1),
        kl=kl,
        kl_lower=kl * 0.9,
        kl_var=kl * 1e-3,
        kl_tail_mass=torch.from_numpy(exact_uniform((n,), seed=seed + 4) * 0.1),
        info={"kl_method": "fixed"},
    )


def perplexity_group() -> dict:
    """The perplexity evaluation's rows from fixed per-token numbers: windows, buckets, every metric and
    interval (t and bootstrap), float-noise reruns, KL percentiles, and the window plan itself."""
    from evalkit.evals.perplexity.evaluation import PerplexityEval, plan_windows, position_bucket_edges

    out = {
        "plans": [plan_windows(1000, 200, s, bos, m) for s in (200, 150) for bos in (True, False) for m in (3, None)]
    }
    out["buckets"] = [position_bucket_edges(w) for w in (64, 200, 1024, 5000)]
    for interval in ("t", "bootstrap"):
        ev = PerplexityEval(dict(window=200, stride=150, interval=interval, bootstrap_samples=200))
        ev.plan = plan_windows(1000, 200, 150, True, 5)  # what prepare() sets, from a fixed corpus length
        ev.targets = [200 - t0 for _, t0 in ev.plan]
        ev.protocol, ev.corpus = {"fixed": True}, SimpleNamespace(name="fixed", sha256="0" * 64)
        n = sum(ev.targets)
        out[interval] = [_row(r) for r in ev._rows(_token_scores(n, seed=300))]
        noise = [(s, _token_scores(n, seed=300 + 10 * s)) for s in (1, 2)]
        out[f"{interval}_noise"] = [_row(r) for r in ev._rows(_token_scores(n, seed=300), noise)]
    return out


def decode_group() -> dict:
    """The decode evaluation's rows from fixed per-position numbers, and its divergence statistics."""
    from evalkit.evals.decode import divergence as dv
    from evalkit.evals.decode.evaluation import DecodeEval, DecodeParams

    n, t = 6, 12
    agree = exact_uniform((2 * n, t), seed=400) > 0.08
    agree[n + 1] = True  # one greedy row identical through the horizon
    pos = {
        "kl": exact_uniform((2 * n, t), seed=401) * 0.05,
        "kl_lower": exact_uniform((2 * n, t), seed=401) * 0.04,
        "kl_var": exact_uniform((2 * n, t), seed=402) * 1e-5,
        "tail_mass": exact_uniform((2 * n, t), seed=403) * 0.1,
        "agree": agree,
        "nll": 2.0 + exact_uniform((2 * n, t), seed=404),
        "base_nll": 2.0 + exact_uniform((2 * n, t), seed=405),
        "info": {"kl_method": "fixed"},
    }
    out = {}
    for interval in ("t", "bootstrap"):
        ev = DecodeEval(dict(prefill=8, decode=t, sequences=n, buckets=3, interval=interval, bootstrap_samples=200))
        ev.p = DecodeParams(**ev.params)  # what prepare() sets, without a model or corpus
        ev.protocol, ev.corpus, ev.starts = {"fixed": True}, SimpleNamespace(name="fixed", sha256="0" * 64), [0] * n
        out[interval] = [_row(r) for r in ev.rows(pos)]
        out[f"{interval}_bound_only"] = [_row(r) for r in ev.rows({**pos, "kl": None, "kl_var": None})]
    steps = dv.first_divergence(agree)
    out["divergence"] = {
        "steps": steps,
        "median": [dv.censored_median(steps[:k], t) for k in (1, 5, 6, 12)],
        "censored": dv.censored_median(np.full(7, t), t),
        "ranks": [dv.median_interval(k) for k in (5, 6, 10, 40)],
        "share": dv.identical_share(steps, t),
    }
    return out


def retrieval_group() -> dict:
    """evalkit.evals.retrieval.scoring: normalisation, exact and recall scores, cell intervals."""
    from evalkit.evals.retrieval import scoring as sc

    answers = [
        ("12345.", ["12345"], "exact"),
        (" 12345 is the key", ["12345"], "exact"),
        ("is 12345", ["12345"], "exact"),
        ("123456", ["12345"], "exact"),
        ('"a1b2-c3d4" and more', ["A1B2-C3D4"], "exact"),
        ("apple, pear and plum", ["pear", "plum", "fig"], "recall"),
        ("nothing", ["pear", "plum"], "recall"),
    ]
    binary = (exact_uniform((30,), seed=500) > 0.3).astype(float)
    recall = np.floor(exact_uniform((30,), seed=501) * 4) / 3
    base = (exact_uniform((30,), seed=502) > 0.2).astype(float)
    return {
        "scores": [sc.score(g, a, how) for g, a, how in answers],
        "words": [sc.words(g) for g, _, _ in answers],
        "binary": sc.accuracy_ci(binary),
        "recall": sc.accuracy_ci(recall),
        "all_correct": sc.accuracy_ci(np.ones(5)),
        "difference": sc.difference_ci(binary, base),
        "difference_same": sc.difference_ci(base, base),
        "recall_difference": sc.difference_ci(recall, base),
    }


def _sample(doc_id: int, output_type: str, rng_seed: int) -> dict:
    u = exact_uniform((6,), seed=rng_seed)
    base = {"doc_id": doc_id, "doc_hash": f"h{doc_id}", "filter": "none", "metrics": ["acc"]}
    if output_type == "multiple_choice":
        return {
            **base,
            "filtered_resps": [(-10 * v, False) for v in u[:4]],
            "target": doc_id % 4,
            "acc": float(u[4] > 0.5),
        }
    if output_type == "loglikelihood":
        return {**base, "filtered_resps": [(-5 * u[0], bool(u[1] > 0.5))], "target": 0, "acc": float(u[1] > 0.5)}
    if output_type == "loglikelihood_rolling":
        return {**base, "metrics": ["word_perplexity"], "filtered_resps": [-100 * u[0]], "word_perplexity": 3.5}
    return {
        **base,
        "metrics": ["exact_match"],
        "filtered_resps": [f"answer {int(u[0] * 3)}"],
        "exact_match": float(u[1] > 0.5),
    }


def lmeval_group() -> dict:
    """evalkit.evals.lmeval.items: per-item records of every output type and the flips against a baseline."""
    from evalkit.evals.lmeval import items as it

    out = {}
    for output_type in ("multiple_choice", "loglikelihood", "loglikelihood_rolling", "generate_until"):
        base = [it.item_from_sample(_sample(d, output_type, 600 + d), output_type) for d in range(12)]
        other = [
            it.item_from_sample(_sample(d, output_type, 600 + d + 3 * (d % 3 == 0)), output_type) for d in range(12)
        ]
        out[output_type] = {"items": other, "flips": it.compare_items(base, other)}
    out["mean_ci"] = [it.mean_ci(exact_uniform((k,), seed=700 + k)) for k in (1, 2, 9)]
    return out


def generation_group() -> dict:
    """evalkit.evals.generation: the paired statistics (proportion, pass@k, McNemar, the accuracy change, first
    divergence) and the rows a task gives from fixed per-item outcomes, lengths and divergence steps."""
    from evalkit.evals.generation import gates as gg
    from evalkit.evals.generation import mrcr as gm
    from evalkit.evals.generation import paired as gp
    from evalkit.evals.generation import rows as gr

    n, k = 10, 2
    base = exact_uniform((n, k), seed=800) > 0.4
    other = exact_uniform((n, k), seed=801) > 0.5
    tokens = np.floor(exact_uniform((n, k), seed=802) * 3000).astype(int) + 1
    truncated = exact_uniform((n, k), seed=803) > 0.8
    steps = [None if v > 0.7 else int(v * 40) for v in exact_uniform((n * k,), seed=804)]
    labels, info = {"task": "fixed", "filter": "none"}, {"fixed": True}
    # MRCR's graded scores in [0, 1] (items x samples) at lengths over four power-of-two buckets
    mrcr_tokens = [700, 900, 1500, 1900, 3000, 3500, 6000, 7000]
    mrcr_base = exact_uniform((8, k), seed=805)
    mrcr_other = mrcr_base * exact_uniform((8, k), seed=806)

    def name(stat: str) -> str:
        return gr.metric_name("fixed", stat)

    return {
        "proportion": [gp.proportion(c, m) for c, m in ((0, 8), (3, 8), (8, 8), (11, 20))],
        "pass_at_k": [gp.pass_at_k(8, c, kk) for c in (0, 1, 4, 8) for kk in (1, 2, 4)],
        "mean_pass_at_k": gp.mean_pass_at_k(other, 2),
        "mcnemar": gp.mcnemar(base.ravel(), other.ravel()),
        "accuracy_delta": gp.accuracy_delta(base, other),
        "divergence": gp.divergence_summary(steps),
        "outcome_rows": [_row(r) for r in gr.outcome_rows(name, base, other, labels, info)],
        "divergence_rows": [_row(r) for r in gr.divergence_rows(name, steps, labels, info)],
        "length_rows": [_row(r) for r in gr.length_rows(name, tokens, truncated, labels, info)],
        "bucket_rows": [_row(r) for r in gr.bucket_rows(name, tokens[:, 0], base, other, labels, info)],
        "gate_rows": [_row(r) for r in gr_gates(gg, name, labels, info)],
        "mrcr_rows": [_row(r) for r in gm.curve_rows("fixed", "none", mrcr_tokens, mrcr_base, mrcr_other, info)],
    }


def gr_gates(gg, name, labels: dict, info: dict) -> list:
    """The failure-gate rows of fixed generations: 12 items x 2 samples of random token ids over a small
    vocabulary (repeats, runs), some cut at the budget, some empty, some with U+FFFD."""
    n, k = 12, 2
    draws = exact_uniform((2, n, k, 4), seed=805)

    def output(d) -> gg.Output:
        length = int(d[0] * 40)
        vocab = 2 + int(d[1] * 6)
        ids = [(j * j + int(d[2] * 97)) % vocab for j in range(length)]
        if d[3] > 0.8:
            ids = ids + [ids[-1] if ids else 1] * 16
        return gg.Output(ids, "\ufffd" if d[3] < 0.1 else "text", truncated=d[1] > 0.75, split_tokens=int(d[3] > 0.9))

    base = [[output(draws[0, i, j]) for j in range(k)] for i in range(n)]
    other = [[output(draws[1, i, j]) for j in range(k)] for i in range(n)]
    prompt = [int(v * 300) for v in exact_uniform((n,), seed=806)]
    return gg.gate_rows(name, gg.fire(base, other), prompt, labels, info)


def longcontext_group() -> dict:
    """evalkit.evals.longcontext.paired: paired statistics of fixed yes/no and graded per-item scores."""
    from evalkit.evals.longcontext import paired as lp

    binary = [(exact_uniform((m,), seed=900 + m) > 0.3).astype(float) for m in (8, 25)]
    flipped = [np.where(exact_uniform(b.shape, seed=950 + len(b)) > 0.8, 1 - b, b) for b in binary]
    graded = np.floor(exact_uniform((25,), seed=990) * 5) / 4
    graded_other = np.clip(graded - np.floor(exact_uniform((25,), seed=991) * 2) / 4, 0, 1)
    out = {f"binary{len(b)}": dataclasses.asdict(lp.compare(f, b)) for b, f in zip(binary, flipped)}
    out["same"] = dataclasses.asdict(lp.compare(binary[0], binary[0]))
    out["graded"] = dataclasses.asdict(lp.compare(graded_other, graded))
    return out


def serving_group() -> dict:
    """The serving evaluation's arithmetic on fixed engine figures (evalkit.engines.vllm.serving_results):
    an allocation held against evalkit's count and the rows it gives, with and without an auto row."""
    from fractions import Fraction

    from evalkit.engines.vllm import serving_results as sr

    def measured(dtype: str, blocks: int, bpt: Fraction) -> sr.Measurement:
        alloc = sr.Allocation(dtype, 2 << 30, 2048, blocks, 16, blocks * 16 * int(bpt), 3.5, blocks - 1, 30)
        return sr.Measurement(alloc, sr.compare(alloc, bpt), f"scheme-{dtype}", {"fixed": True})

    auto, fp8 = measured("auto", 2912, Fraction(46080)), measured("fp8_e4m3", 5825, Fraction(23040))
    off = measured("fp8_e5m2", 5000, Fraction(23040))
    return {
        "rows": [_row(r) for r in sr.serving_rows([auto, fp8, off])],
        "alone": [_row(r) for r in sr.serving_rows([fp8])],
    }


GROUPS = {
    "stats": stats_group,
    "skewed": skewed_group,
    "paired_binary": paired_binary_group,
    "paired_stats": paired_stats_group,
    "float_noise": float_noise_group,
    "float_spread": float_spread_group,
    "kl_topk": kl_topk_group,
    "perplexity": perplexity_group,
    "decode": decode_group,
    "retrieval": retrieval_group,
    "lmeval": lmeval_group,
    "generation": generation_group,
    "longcontext": longcontext_group,
    "serving": serving_group,
}
SHARED = (
    "stats",
    "skewed",
    "paired_binary",
    "paired_stats",
    "float_noise",
    "float_spread",
    "kl_topk",
)  # every evaluation's; the rest: one each
