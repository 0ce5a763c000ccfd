"""MRCR scored as the long-context studies score it: pass@1 per length bucket, an AUC across lengths and
the % recovery against the baseline, for every generation task whose samples carry ``mrcr_score``
(``mrcr_standin``, ``mrcr_2needle``, ``mrcr_4needle`` in ``tasks/generation``).

Per sample the score is openai/mrcr's grade (``tasks/generation/mrcr.py``: 0 without the random prefix,
else difflib's SequenceMatcher ratio to the answer). Rows, per task and filter (metric
``<task>/mrcr_<stat>``):

* ``mrcr_pass@1_by_length`` (label ``bucket``): the mean score over the bucket's items and their k
  samples ("pass@1 over k repetitions"), with Student's t interval over the items' own means. Buckets
  are openai/mrcr's: powers of two, (4096, 8192], (8192, 16384], ..., here in the served model's tokens
  of the prompt as sent (chat template applied), extended below 4k for the stand-in; a bucket is named
  and placed by its upper edge ("4k-8k" at x = 8192).
* ``mrcr_auc``: the trapezoid area under pass@1 against the bucket's upper edge in tokens, on a
  **linear** length axis, divided by the span from the first to the last edge present:

      AUC = sum_j (x[j+1] - x[j]) * (y[j] + y[j+1]) / 2  /  (x[-1] - x[0])

  so it is a score in [0, 1], weighted toward the long buckets (with buckets 8k..128k, the 64k-128k
  interval carries 64/120 of the weight). With one bucket it is that bucket's pass@1. The same area on a
  log2 length axis (equal weight per doubling) is in the row's info as ``auc_log2``.
* ``mrcr_auc_delta`` (scheme minus baseline, paired by item) and ``mrcr_recovery``: 100 x AUC(scheme) /
  AUC(baseline), "% recovery" (no recovery row when the baseline's AUC is 0).

Where the definition comes from. vLLM's FP8 KV-cache and TurboQuant posts (vllm.ai, 2026-04-22 and
2026-05-11) report MRCR as an AUC over lengths and a % recovery; the text of theirs available here does
not spell the AUC out. The public MRCR leaderboard that reports "AUC @128k" (contextarena.ai) does not
either, but its table pins it: its per-bin scores reproduce its AUC @128k with this linear trapezoid
normalised by the span (Gemini 2.5 Pro preview 99.5/97.1/94.4/93.9/84.3 % at 8k-128k: 91.9 %, as
published; the 03-25 preview: 88.5 %; GPT-4.1: 61.6 %; and AUC @1M 72.5 % over 8k-1M), and not with
the log2 one (94.3 %) or the plain mean (93.8 %). ``tests/evals/test_mrcr.py`` checks those figures. A
study's AUC set beside evalkit's must cover the same buckets: report the range (info ``buckets``).

Intervals: the AUC is linear in the buckets' means, a weight w_b per bucket, and buckets hold distinct
items, so var(AUC) = sum_b w_b^2 s_b^2 / n_b (s_b: the standard deviation of the items' mean scores);
the delta uses the items' paired differences, and the recovery the delta method (item terms s_i - R b_i,
divided by the baseline's AUC). Student's t with sum_b (n_b - 1) degrees of freedom; no interval where a
bucket has a single item.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from evalkit.evals.rows import MetricRow

SCORE = "mrcr_score"
BUCKET_BY = "the prompt's tokens as sent (chat template applied), openai/mrcr's power-of-two buckets"
AUC_DEFINITION = (
    "trapezoid area under pass@1 against each bucket's upper edge in tokens (linear axis), divided by the "
    "span from the first to the last edge (contextarena.ai's AUC @128k, reproduced from its table)"
)


def bucket_edge(tokens: int) -> int:
    """The upper edge of openai/mrcr's power-of-two bucket holding ``tokens``: (4096, 8192] -> 8192."""
    return 1 << max(int(tokens) - 1, 1).bit_length()


def edge_label(edge: int) -> str:
    def short(n: int) -> str:
        return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)

    return f"{short(edge // 2)}-{short(edge)}"


def trapezoid_weights(x: list[float]) -> np.ndarray:
    """w with AUC = w @ y: the normalised trapezoid rule on the points ``x`` (sorted, distinct)."""
    x = np.asarray(x, dtype=np.float64)
    if len(x) == 1:
        return np.ones(1)
    w = np.zeros(len(x))
    gaps = np.diff(x)
    w[:-1] += gaps / 2
    w[1:] += gaps / 2
    return w / (x[-1] - x[0])


def auc(x: list[float], y: list[float]) -> float:
    """The normalised linear-axis trapezoid area of the points (x, y) (see the module docstring)."""
    return float(trapezoid_weights(x) @ np.asarray(y, dtype=np.float64))


def auc_log2(x: list[float], y: list[float]) -> float:
    """The same area on a log2 length axis (equal weight per doubling)."""
    return auc([math.log2(v) for v in x], y)


def _interval(value: float, w: np.ndarray, groups: list[np.ndarray], scale: float = 1.0):
    """value -+ t * sqrt(sum_b w_b^2 var_b / n_b) * scale, or (None, None) where a bucket has one item."""
    if any(len(g) < 2 for g in groups):
        return None, None
    var = sum(wb**2 * float(np.var(g, ddof=1)) / len(g) for wb, g in zip(w, groups))
    dof = sum(len(g) - 1 for g in groups)
    half = float(stats.t.ppf(0.975, dof)) * math.sqrt(var) * scale
    return value - half, value + half


def _row(name: str, value, low, high, labels: dict, info: dict) -> MetricRow:
    return MetricRow(name, float(value), low, high, labels=dict(labels), info=dict(info))


def curve_rows(task: str, filt: str, tokens: list[int], base: np.ndarray, mine: np.ndarray, info: dict):
    """The rows of one task and filter: ``tokens`` per item, ``base`` / ``mine`` scores (items x samples)."""
    name = (lambda s: f"{task}/{s}") if filt == "none" else (lambda s: f"{task}/{s}[{filt}]")
    labels = {"task": task, "filter": filt}
    edges = np.array([bucket_edge(t) for t in tokens])
    x = sorted(set(edges.tolist()))
    b_items, m_items = base.mean(1), mine.mean(1)
    groups_m = [m_items[edges == e] for e in x]
    groups_b = [b_items[edges == e] for e in x]
    y_m = [float(g.mean()) for g in groups_m]
    y_b = [float(g.mean()) for g in groups_b]
    trials = {**info, "samples": int(mine.shape[1]), "score": "openai/mrcr grade (prefix, SequenceMatcher ratio)"}
    rows = []
    for e, g, yb in zip(x, groups_m, y_b):
        lo = hi = None
        if len(g) >= 2:
            half = float(stats.t.ppf(0.975, len(g) - 1)) * float(np.std(g, ddof=1)) / math.sqrt(len(g))
            lo, hi = float(g.mean()) - half, float(g.mean()) + half
        rows.append(
            _row(
                name("mrcr_pass@1_by_length"),
                g.mean(),
                lo,
                hi,
                {**labels, "bucket": edge_label(e)},
                {
                    **trials,
                    "n_items": int(len(g)),
                    "x_tokens": int(e),
                    "baseline_pass@1": yb,
                    "bucketed_by": BUCKET_BY,
                    "ci": "95% Student's t over the items' mean scores",
                },
            )
        )
    w = trapezoid_weights(x)
    a_m, a_b = float(w @ np.array(y_m)), float(w @ np.array(y_b))
    curve = {
        **trials,
        "buckets": [edge_label(e) for e in x],
        "x_tokens": [int(e) for e in x],
        "n_items": int(len(tokens)),
        "definition": AUC_DEFINITION,
        "ci": "95% Student's t, var = sum_b w_b^2 s_b^2 / n_b over the buckets' items (none with a 1-item bucket)",
    }
    lo, hi = _interval(a_m, w, groups_m)
    rows.append(
        _row(
            name("mrcr_auc"),
            a_m,
            lo,
            hi,
            labels,
            {**curve, "pass@1": y_m, "auc_log2": auc_log2(x, y_m), "baseline_auc": a_b, "baseline_pass@1": y_b},
        )
    )
    diffs = [m - b for m, b in zip(groups_m, groups_b)]
    lo, hi = _interval(a_m - a_b, w, diffs)
    rows.append(_row(name("mrcr_auc_delta"), a_m - a_b, lo, hi, labels, {**curve, "paired": "by item"}))
    if a_b > 0:
        r = a_m / a_b
        terms = [m - r * b for m, b in zip(groups_m, groups_b)]
        lo, hi = _interval(100 * r, w, terms, 100 / a_b)
        rows.append(
            _row(
                name("mrcr_recovery"),
                100 * r,
                lo,
                hi,
                labels,
                {**curve, "unit": "% of the baseline's AUC", "ci": curve["ci"] + "; delta method for the ratio"},
            )
        )
    return rows


def mrcr_rows(base: dict[str, list[dict]], items: dict[str, list[dict]], tokenizer, info: dict) -> list[MetricRow]:
    """The MRCR rows of every task whose samples carry ``mrcr_score`` (others: none)."""
    from evalkit.evals.generation.items import filters, paired

    rows = []
    for task, records in items.items():
        if not records or any(SCORE not in s.get("scores", {}) for r in records for s in r["samples"]):
            continue
        pairs_all = paired(base[task], records, task)
        for filt in filters(records):
            pairs = [(b, o) for b, o in pairs_all if o["filter"] == filt]
            tokens = [len(tokenizer(b["prompt"], add_special_tokens=False)["input_ids"]) for b, _ in pairs]
            base_s = np.array([[s["scores"][SCORE] for s in b["samples"]] for b, _ in pairs], dtype=np.float64)
            mine = np.array([[s["scores"][SCORE] for s in o["samples"]] for _, o in pairs], dtype=np.float64)
            rows += curve_rows(task, filt, tokens, base_s, mine, dict(info.get(task, {})))
    return rows
