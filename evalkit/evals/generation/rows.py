"""The generation evaluation's metric rows per task and filter (statistics:
:mod:`evalkit.evals.generation.paired`).

Per task and lm-eval filter (metric ``<task>/<stat>``, ``[<filter>]`` appended unless the filter is
``none``; labels ``task`` and ``filter``):

* ``accuracy`` (Wilson with the item as the unit), ``pass@k`` for k = the samples per item (from 2
  samples; every k's value in its info), ``output_tokens`` (mean, t over items) and
  ``truncated_share`` (answers cut off at the output budget);
* against the baseline's answers to the same items and samples: ``accuracy_delta`` (Tango's paired
  score interval, item as the unit), ``mcnemar_p`` (McNemar's exact test with one sample per item,
  the sign-flip test over items with several: its info's ``test``), ``flip_right_to_wrong``,
  ``flip_wrong_to_right``, ``flip_rate`` (the extracted answer changed), ``divergence_share`` and
  ``first_divergence`` (its median over the item-samples that diverge; no row when none does);
* ``accuracy_by_length`` per bucket of the item's prompt length in tokens (label ``bucket``; fixed
  before the scheme acts, so a bucket holds the same items for every scheme and no outcome decides
  it), with the baseline's accuracy on the same item-samples and its interval in its info;
* per task (once: every filter holds the same generated text) the failure gates of
  :mod:`evalkit.evals.generation.gates`: ``fail_<gate>`` for repeated_token, repeated_ngram,
  first_token_eos, collapse, runaway and invalid_utf8, and ``fail_any``: the share of item-samples where
  the scheme's generation has the shape and the baseline's does not (Wilson, the item as the unit), and
  ``fail_<gate>_by_length`` per prompt-length bucket (label ``bucket``).

Every share of item-samples (accuracy, flips, truncated, diverged) has the Wilson interval on counts
divided by the design effect of its items (:func:`evalkit.evals.paired_binary.clustered_proportion`):
with one sample per item the plain Wilson interval; its info's ``design_effect`` says by how much.

A traces file's rows (the same comparisons under the task name ``traces``) are
:mod:`evalkit.evals.generation.trace_rows`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from evalkit.evals.generation import gates as G
from evalkit.evals.generation import paired as P
from evalkit.evals.rows import MetricRow

UNITS_CI = "95% Student's t over items"
WILSON_CI = "95% Wilson over item-samples, counts divided by the items' design effect (the item as the unit)"
DELTA_CI = "95% Tango score interval for paired proportions, counts divided by the items' design effect"
BUCKETED_BY = "the item's prompt length in tokens (fixed before the scheme acts)"


def metric_name(task: str, stat: str, filt: str = "none") -> str:
    return f"{task}/{stat}" if filt == "none" else f"{task}/{stat}[{filt}]"


def metric_row(name: str, value, low=None, high=None, labels=None, info=None) -> MetricRow:
    """One row with its interval (None where it has none); ``info`` copied."""
    clean = [None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x) for x in (low, high)]
    return MetricRow(name, float(value), clean[0], clean[1], labels=dict(labels or {}), info=dict(info or {}))


def sample_matrix(records: list[dict], key: str) -> np.ndarray:
    """``key`` of every record's samples, as an (items, samples) array."""
    return np.array([[float(s[key]) for s in r["samples"]] for r in records], dtype=np.float64)


def _token_ids(tokenizer):
    cache: dict[str, list[int]] = {}

    def ids(text: str) -> list[int]:
        if text not in cache:
            cache[text] = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        return cache[text]

    return ids


def outcome_rows(name, base_correct: np.ndarray, correct: np.ndarray, labels: dict, info: dict) -> list[MetricRow]:
    """accuracy, pass@k and the paired comparisons of two 0/1 matrices (items x samples)."""
    n_items, k = correct.shape
    trials = {**info, "n_items": n_items, "samples": k, "n_item_samples": int(correct.size)}
    acc, lo, hi, deff = P.clustered_share(correct)
    rows = [
        metric_row(
            name("accuracy"),
            acc,
            lo,
            hi,
            labels,
            {**trials, "n_correct": int(correct.sum()), "ci": WILSON_CI, "design_effect": deff},
        )
    ]
    if k >= 2:
        every = {str(j): P.mean_pass_at_k(correct, j)[0] for j in range(1, k + 1)}
        value, lo, hi = P.mean_pass_at_k(correct, k)
        rows.append(
            metric_row(
                name(f"pass@{k}"),
                value,
                lo,
                hi,
                labels,
                {**trials, "pass_at": every, "ci": UNITS_CI, "estimator": "1 - C(n-c,k)/C(n,k)"},
            )
        )
    delta, lo, hi, deff = P.accuracy_delta(base_correct, correct)
    rows.append(
        metric_row(name("accuracy_delta"), delta, lo, hi, labels, {**trials, "ci": DELTA_CI, "design_effect": deff})
    )
    p, b, c, test = P.item_test(base_correct, correct)
    rows.append(
        metric_row(
            name("mcnemar_p"),
            p,
            None,
            None,
            labels,
            {
                **trials,
                "right_to_wrong": b,
                "wrong_to_right": c,
                "test": test,
            },
        )
    )
    base_b, mine_b = base_correct.astype(bool), correct.astype(bool)
    for stat, flips in (("flip_right_to_wrong", base_b & ~mine_b), ("flip_wrong_to_right", ~base_b & mine_b)):
        value, lo, hi, deff = P.clustered_share(flips)
        count = int(flips.sum())
        rows.append(
            metric_row(
                name(stat),
                value,
                lo,
                hi,
                labels,
                {**trials, "n_flipped": count, "ci": WILSON_CI, "design_effect": deff},
            )
        )
    return rows


def divergence_rows(name, steps: list, labels: dict, info: dict, samples: int = 1) -> list[MetricRow]:
    """divergence_share (item as the unit: ``steps`` item-major, ``samples`` per item) and first_divergence."""
    summary = P.divergence_summary(steps)
    diverged = np.array([s is not None for s in steps], dtype=np.float64).reshape(-1, samples)
    value, lo, hi, deff = P.clustered_share(diverged)
    out = [
        metric_row(
            name("divergence_share"),
            value,
            lo,
            hi,
            labels,
            {
                **info,
                "n_item_samples": summary["n"],
                "n_diverged": summary["diverged"],
                "ci": WILSON_CI,
                "design_effect": deff,
            },
        )
    ]
    if "median" in summary:
        median, lo, hi = summary["median"]
        out.append(
            metric_row(
                name("first_divergence"),
                median,
                lo,
                hi,
                labels,
                {
                    **info,
                    "n_diverged": summary["diverged"],
                    "median": "lower median over the item-samples that diverge",
                    "ci": "exact order-statistic interval (none below 6 diverging)",
                    "coverage": summary["coverage"],
                    "steps": [s for s in steps if s is not None],
                },
            )
        )
    return out


def length_rows(name, tokens: np.ndarray, truncated: np.ndarray, labels: dict, info: dict) -> list[MetricRow]:
    mean, lo, hi = P.mean_t(tokens.mean(1), 0.0)
    k = int(truncated.sum())
    share, slo, shi, deff = P.clustered_share(truncated)
    cut = {**info, "n_truncated": k, "ci": WILSON_CI, "design_effect": deff}
    return [
        metric_row(name("output_tokens"), mean, lo, hi, labels, {**info, "max": int(tokens.max()), "ci": UNITS_CI}),
        metric_row(name("truncated_share"), share, slo, shi, labels, cut),
    ]


def bucket_rows(name, item_tokens, base_correct: np.ndarray, correct: np.ndarray, labels: dict, info: dict):
    """accuracy_by_length: the items of each bucket of ``item_tokens``, a length per item fixed before the
    scheme acts (its prompt's tokens), all of an item's samples in its bucket."""
    buckets = [P.length_bucket(int(t)) for t in item_tokens]
    out = []
    for bucket in sorted(set(buckets)):
        sel = np.array([b == bucket for b in buckets])
        value, lo, hi, deff = P.clustered_share(correct[sel])
        _, base_lo, base_hi, _ = P.clustered_share(base_correct[sel])
        out.append(
            metric_row(
                name("accuracy_by_length"),
                value,
                lo,
                hi,
                {**labels, "bucket": P.bucket_label(bucket)},
                {
                    **info,
                    "n_items": int(sel.sum()),
                    "n_item_samples": int(correct[sel].size),
                    "baseline_accuracy": float(base_correct[sel].mean()),
                    "baseline_ci": [float(base_lo), float(base_hi)],
                    "bucketed_by": BUCKETED_BY,
                    "ci": WILSON_CI,
                    "design_effect": deff,
                },
            )
        )
    return out


def task_rows(
    base: dict[str, list[dict]], items: dict[str, list[dict]], tokenizer, info: dict[str, Any]
) -> list[MetricRow]:
    """Every task's rows (see the module docstring); ``info`` per task, merged into its rows."""
    from evalkit.evals.generation.items import filters, paired

    rows = []
    ids = _token_ids(tokenizer)
    for task, records in items.items():
        pairs_all = paired(base[task], records, task)
        rows += _task_gate_rows(task, pairs_all, ids, dict(info.get(task, {})))
        for filt in filters(records):
            pairs = [(b, o) for b, o in pairs_all if o["filter"] == filt]
            b_recs, o_recs = [b for b, _ in pairs], [o for _, o in pairs]
            labels = {"task": task, "filter": filt}
            meta = dict(info.get(task, {}))
            name = lambda stat, f=filt, t=task: metric_name(t, stat, f)  # noqa: E731
            if all(s["correct"] is not None for r in b_recs + o_recs for s in r["samples"]):
                base_c, mine = sample_matrix(b_recs, "correct"), sample_matrix(o_recs, "correct")
                rows += outcome_rows(name, base_c, mine, labels, meta)
                if all(isinstance(b.get("prompt"), str) for b in b_recs):  # a prompt's length, fixed before
                    lengths = [len(ids(b["prompt"])) for b in b_recs]
                    rows += bucket_rows(name, lengths, base_c, mine, labels, meta)
            changed = np.array(
                [[bs["answer"] != os_["answer"] for bs, os_ in zip(b["samples"], o["samples"])] for b, o in pairs],
                dtype=np.float64,
            )
            value, lo, hi, deff = P.clustered_share(changed)
            flipped = int(changed.sum())
            rows.append(
                metric_row(
                    name("flip_rate"),
                    value,
                    lo,
                    hi,
                    labels,
                    {**meta, "n_flipped": flipped, "ci": WILSON_CI, "design_effect": deff},
                )
            )
            steps = [
                P.first_divergence(ids(bs["text"]), ids(os_["text"]))
                for b, o in pairs
                for bs, os_ in zip(b["samples"], o["samples"])
            ]
            rows += divergence_rows(
                name,
                steps,
                labels,
                {**meta, "tokens": "generated text re-encoded by the tokenizer"},
                changed.shape[1] if changed.size else 1,
            )
            rows += length_rows(name, sample_matrix(o_recs, "tokens"), sample_matrix(o_recs, "truncated"), labels, meta)
    return rows


def _task_gate_rows(task: str, pairs: list, ids, meta: dict) -> list[MetricRow]:
    """A task's failure gates (:mod:`evalkit.evals.generation.gates`), once per task: every filter of an
    item holds the same generated text (a filter only extracts the answer), so the first filter's items."""
    if not pairs:
        return []
    first = pairs[0][1]["filter"]
    pairs = [(b, o) for b, o in pairs if o["filter"] == first]

    def outputs(record: dict) -> list[G.Output]:
        return [G.Output(ids(s["text"]), s["text"], bool(s["truncated"])) for s in record["samples"]]

    fired = G.fire([outputs(b) for b, _ in pairs], [outputs(o) for _, o in pairs])
    lengths = (
        [len(ids(b["prompt"])) for b, _ in pairs] if all(isinstance(b.get("prompt"), str) for b, _ in pairs) else None
    )
    name = lambda stat: metric_name(task, stat)  # noqa: E731
    meta = {**meta, "tokens": "generated text re-encoded by the tokenizer"}
    return G.gate_rows(name, fired, lengths, {"task": task}, meta)
