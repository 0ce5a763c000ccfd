"""Per-item view of lm-eval's logged samples, and how a scheme's items differ from the baseline's.

lm-eval's aggregate metrics (accuracy and its standard error) say little when a small model scores
near chance: a quantized KV cache can change many answers while accuracy stays put. So from the
samples lm-eval logs (``log_samples=True``) we keep, per item and filter:

* ``prediction``: the model's answer: the argmax choice (multiple_choice; first maximum, as
  lm-eval's ``acc``), whether the continuation is greedy (loglikelihood), the filtered generation
  (generate_until); none for loglikelihood_rolling.
* ``correct``: the item's first 0/1 metric (``acc``, ``exact_match``...), when there is one.
* ``gold_loglik``: log-likelihood of the gold choice (multiple_choice), of the continuation
  (loglikelihood), or of the whole document (loglikelihood_rolling).

Against the baseline's items (matched by doc id, filter and document hash):

* ``flip_rate``: fraction of items whose prediction changed; ``flip_right_to_wrong`` and
  ``flip_wrong_to_right``: fractions of all items that went from correct to wrong and back;
  ``flip_wrong_to_wrong``: fraction whose wrong answer changed into another wrong one. The three
  add up to ``flip_rate`` (save for a right answer changed into another right one, possible only
  where several answers count as right). 95 % Wilson intervals.
* ``gold_loglik_abs_delta``: mean |gold_loglik - baseline gold_loglik| (nats), 95 % t interval.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from evalkit.errors import EvalkitError
from evalkit.evals.stats import binomial_ci


def _first_binary_metric(sample: dict) -> float | None:
    for name in sample.get("metrics", []):
        value = sample.get(name)
        if isinstance(value, (bool, int, float, np.number)) and float(value) in (0.0, 1.0):
            return float(value)
    return None


def item_from_sample(sample: dict, output_type: str) -> dict[str, Any]:
    """One compact JSON-able record of a logged lm-eval sample."""
    resps = sample["filtered_resps"]
    prediction: Any = None
    gold_loglik: float | None = None
    if output_type == "multiple_choice":
        lls = [float(r[0]) for r in resps]
        prediction = int(np.argmax(lls))
        target = sample["target"]
        if isinstance(target, (int, np.integer)) and 0 <= int(target) < len(lls):
            gold_loglik = lls[int(target)]
    elif output_type == "loglikelihood":
        ll, greedy = resps[0]
        prediction, gold_loglik = bool(greedy), float(ll)
    elif output_type == "loglikelihood_rolling":
        value = resps[0]
        gold_loglik = float(value[0] if isinstance(value, (tuple, list)) else value)
    else:  # generate_until
        prediction = resps[0] if isinstance(resps, list) else resps
        prediction = str(prediction)
    return {
        "doc_id": int(sample["doc_id"]),
        "filter": sample.get("filter", "none"),
        "doc_hash": sample.get("doc_hash"),
        "prediction": prediction,
        "correct": _first_binary_metric(sample),
        "gold_loglik": gold_loglik,
    }


def items_from_results(results: dict) -> dict[str, list[dict]]:
    """{task: [item, ...]} for every leaf task in an lm-eval results dict."""
    out = {}
    for task, samples in results.get("samples", {}).items():
        output_type = results["configs"][task]["output_type"]
        out[task] = [item_from_sample(s, output_type) for s in samples]
    return out


def mean_ci(values: np.ndarray) -> tuple[float, float, float]:
    from scipy import stats

    mean = float(values.mean())
    if len(values) < 2:
        return mean, math.nan, math.nan
    sem = float(stats.sem(values))
    if sem == 0.0:
        return mean, mean, mean
    low, high = stats.t.interval(0.95, len(values) - 1, loc=mean, scale=sem)
    return mean, float(low), float(high)


def compare_items(base: list[dict], other: list[dict]) -> dict[str, dict[str, Any]]:
    """Flip statistics per filter: {filter: {stat: (value, ci_low, ci_high, info)}}."""
    index = {(b["doc_id"], b["filter"]): b for b in base}
    if len(index) != len(other) or any((o["doc_id"], o["filter"]) not in index for o in other):
        raise EvalkitError(
            "lm-eval items differ from the baseline's (another --limit, few-shot or task version?): "
            "rerun prepare for these parameters"
        )
    by_filter: dict[str, list[tuple[dict, dict]]] = {}
    for o in other:
        b = index[(o["doc_id"], o["filter"])]
        if b["doc_hash"] != o["doc_hash"]:
            raise EvalkitError(
                f"item {o['doc_id']} is a different document than in the baseline: the task data changed"
            )
        by_filter.setdefault(o["filter"], []).append((b, o))
    stats: dict[str, dict[str, Any]] = {}
    for filt, pairs in by_filter.items():
        n = len(pairs)
        out: dict[str, Any] = {}
        if all(b["prediction"] is not None for b, _ in pairs):
            flips = sum(b["prediction"] != o["prediction"] for b, o in pairs)
            out["flip_rate"] = (flips / n, *binomial_ci(flips, n), {"n_items": n, "n_flipped": flips})
        if all(b["correct"] is not None and o["correct"] is not None for b, o in pairs):
            r2w = sum(b["correct"] == 1.0 and o["correct"] == 0.0 for b, o in pairs)
            w2r = sum(b["correct"] == 0.0 and o["correct"] == 1.0 for b, o in pairs)
            out["flip_right_to_wrong"] = (r2w / n, *binomial_ci(r2w, n), {"n_items": n, "n_flipped": r2w})
            out["flip_wrong_to_right"] = (w2r / n, *binomial_ci(w2r, n), {"n_items": n, "n_flipped": w2r})
            if "flip_rate" in out:  # the rest of flip_rate: a wrong answer changed into another wrong one
                w2w = sum(
                    b["correct"] == 0.0 and o["correct"] == 0.0 and b["prediction"] != o["prediction"] for b, o in pairs
                )
                out["flip_wrong_to_wrong"] = (w2w / n, *binomial_ci(w2w, n), {"n_items": n, "n_flipped": w2w})
        if all(b["gold_loglik"] is not None and o["gold_loglik"] is not None for b, o in pairs):
            delta = np.array([o["gold_loglik"] - b["gold_loglik"] for b, o in pairs], dtype=np.float64)
            mean, low, high = mean_ci(np.abs(delta))
            out["gold_loglik_abs_delta"] = (
                mean,
                low,
                high,
                {
                    "n_items": n,
                    "mean_signed_delta": float(delta.mean()),
                    "max_abs_delta": float(np.abs(delta).max()),
                    "n_changed": int((delta != 0).sum()),
                },
            )
        stats[filt] = out
    return stats
