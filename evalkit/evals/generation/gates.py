"""Failure gates: the shapes in which a quantized KV cache is reported to break a generation silently,
counted per item-sample against the baseline's same item-sample.

Public reports since mid-2026 share a pattern: the output does not get a little worse, it breaks in a
recognisable shape that accuracy, flips and perplexity on short windows do not single out. Each shape
below is a yes/no of one generation, with the threshold that defines it taken from the reports:

* ``repeated_token``: at least :data:`REPEAT_TOKEN_SHARE` (25 %) of the generated tokens repeat the
  token just before them (from :data:`MIN_TOKENS` = 8 generated tokens). intel/llm-scaler#721 (FP8 KV):
  every second token doubled, a third of the tokens repeating their predecessor; ordinary prose has
  almost none (a tokenizer merges repeated characters);
* ``repeated_ngram``: at least :data:`REPEAT_NGRAM_SHARE` (50 %) of the output's :data:`NGRAM`-grams
  (4 tokens) already occurred earlier in it (from 8 tokens): an output looping over a phrase or a
  sentence, as the loops above end in;
* ``first_token_eos``: nothing generated: the first token ended the answer (an end-of-sequence token,
  or for lm-eval tasks, whose text is all there is, a stop sequence). mlx-vlm#2162 (8-bit TurboQuant,
  ~92k tokens of context: the first token is EOS);
* ``collapse``: the output ends in a run of at least :data:`COLLAPSE_RUN` (16) copies of one token.
  vllm#49818 (NVFP4: 5 of 5 outputs are ``!``, token 0, until the length cap), vllm#45540 (FP8 on XPU:
  every reply turns into ``!!!!``);
* ``runaway``: the output reaches the output budget (``truncated``): no end-of-sequence token.
  llama-cpp-turboquant#311 (no EOS past 12k tokens, its rate growing with prompt and output length);
* ``invalid_utf8``: the decoded text holds U+FFFD (bytes that are not valid UTF-8: a multi-byte
  character split or garbled), or, where the token ids are kept (a traces file), a generated token
  that is not valid UTF-8 on its own (decodes alone to U+FFFD). llama-cpp-turboquant#311 (split tokens
  past 12k).

Paired. A gate *fires* on an item-sample when the scheme's generation has the shape and the baseline's
generation of the same item and sample does not: a failure the scheme brought. So ``runaway`` is
exactly "hits the budget where the baseline stopped", and a byte-level tokenizer's legitimate split of
a CJK character, which the baseline makes too, is not counted. The identity scheme fires no gate.
``any`` fires when at least one gate does; the budget's ``--max-failure-rate`` reads it.

Each gate's rate is the share of item-samples on which it fires, with the Wilson interval on counts
divided by the items' design effect (:func:`evalkit.evals.paired_binary.clustered_proportion`: the
item as the unit where samples repeat; one sample per item: the plain Wilson interval), so a clean run
shows 0 with its width (0 of 20: [0, 16 %]). The same rates per bucket of the item's prompt length
(fixed before the scheme acts, as accuracy by length is): the reported failures grow with context.

lm-eval tasks return text only: their shapes are read on the text re-encoded by the model's tokenizer
(as their first divergence is), and ``invalid_utf8`` on the text alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

NGRAM = 4  # tokens per n-gram of repeated_ngram
REPEAT_TOKEN_SHARE = 0.25  # repeated_token: share of tokens equal to the one before, at least
REPEAT_NGRAM_SHARE = 0.5  # repeated_ngram: share of n-grams seen earlier in the output, at least
COLLAPSE_RUN = 16  # collapse: the output ends in at least this many copies of one token
MIN_TOKENS = 8  # the repeat shares are judged on outputs of at least this many tokens
REPLACEMENT = "\ufffd"  # what a decoder writes for bytes that are not valid UTF-8

GATES = ("repeated_token", "repeated_ngram", "first_token_eos", "collapse", "runaway", "invalid_utf8")
ANY = "any"
DEFINITIONS = {
    "repeated_token": f">= {REPEAT_TOKEN_SHARE:.0%} of tokens repeat the one before (from {MIN_TOKENS} tokens)",
    "repeated_ngram": f">= {REPEAT_NGRAM_SHARE:.0%} of {NGRAM}-grams seen earlier in the output (from {MIN_TOKENS} tokens)",
    "first_token_eos": "nothing generated: the first token ended the answer",
    "collapse": f"the output ends in >= {COLLAPSE_RUN} copies of one token",
    "runaway": "the output reaches the output budget (no end-of-sequence token)",
    "invalid_utf8": "decoded text holds U+FFFD, or a generated token is not valid UTF-8 on its own",
    ANY: "at least one gate fires",
}
PAIRED = "fires where the scheme's generation has the shape and the baseline's same item-sample does not"


@dataclass(frozen=True)
class Output:
    """One generation as the gates read it: its token ids (without the end-of-sequence token that closed
    it), its decoded text, whether it reached the output budget, and how many of its tokens are not
    valid UTF-8 on their own (None: the ids are re-encoded text, so none can be)."""

    ids: Sequence[int]
    text: str
    truncated: bool
    split_tokens: int | None = None


def repeated_token_share(ids: Sequence[int]) -> float:
    """Share of tokens 1.. equal to the token before them (0 for fewer than two tokens)."""
    if len(ids) < 2:
        return 0.0
    return sum(a == b for a, b in zip(ids, ids[1:])) / (len(ids) - 1)


def repeated_ngram_share(ids: Sequence[int], n: int = NGRAM) -> float:
    """Share of the output's n-grams (every start) that already occurred at an earlier start (0 when it
    has none)."""
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    if not grams:
        return 0.0
    seen: set[tuple] = set()
    repeats = 0
    for g in grams:
        repeats += g in seen
        seen.add(g)
    return repeats / len(grams)


def tail_run(ids: Sequence[int]) -> int:
    """Length of the run of one token the output ends in (0 for an empty output)."""
    run = 0
    for t in reversed(ids):
        if t != ids[-1]:
            break
        run += 1
    return run


def shapes(out: Output) -> dict[str, bool]:
    """Which failure shapes one generation has (see the module docstring)."""
    n = len(out.ids)
    return {
        "repeated_token": n >= MIN_TOKENS and repeated_token_share(out.ids) >= REPEAT_TOKEN_SHARE,
        "repeated_ngram": n >= MIN_TOKENS and repeated_ngram_share(out.ids) >= REPEAT_NGRAM_SHARE,
        "first_token_eos": n == 0 and not out.truncated,
        "collapse": tail_run(out.ids) >= COLLAPSE_RUN,
        "runaway": bool(out.truncated),
        "invalid_utf8": REPLACEMENT in out.text or bool(out.split_tokens),
    }


def split_tokens(tokenizer, ids: Sequence[int]) -> int:
    """How many of ``ids`` are not valid UTF-8 on their own (each decoded alone holds U+FFFD)."""
    return sum(REPLACEMENT in tokenizer.decode([int(t)]) for t in ids)


@dataclass(frozen=True)
class Fired:
    """Per gate (and ``any``): items x samples 0/1 matrices of where it fires, of where the scheme's and
    the baseline's generations have the shape; and the repeat shares, items x samples."""

    fired: dict[str, np.ndarray]
    scheme: dict[str, np.ndarray]
    baseline: dict[str, np.ndarray]
    shares: dict[str, tuple[np.ndarray, np.ndarray]]  # name -> (scheme, baseline)


def fire(base: Sequence[Sequence[Output]], other: Sequence[Sequence[Output]]) -> Fired:
    """Every gate over items x samples of paired generations (``base[i][j]`` the baseline's sample j of
    item i, ``other[i][j]`` the scheme's)."""
    n, k = len(other), (len(other[0]) if other else 0)
    mine = [[shapes(o) for o in row] for row in other]
    theirs = [[shapes(b) for b in row] for row in base]

    def matrix(table, gate) -> np.ndarray:
        return np.array([[float(s[gate]) for s in row] for row in table], dtype=np.float64).reshape(n, k)

    scheme = {g: matrix(mine, g) for g in GATES}
    baseline = {g: matrix(theirs, g) for g in GATES}
    fired = {g: scheme[g] * (1.0 - baseline[g]) for g in GATES}
    fired[ANY] = np.clip(sum(fired[g] for g in GATES), 0.0, 1.0) if GATES else np.zeros((n, k))
    scheme[ANY] = np.clip(sum(scheme[g] for g in GATES), 0.0, 1.0)
    baseline[ANY] = np.clip(sum(baseline[g] for g in GATES), 0.0, 1.0)

    def share(rows, f) -> np.ndarray:
        return np.array([[f(o.ids) for o in row] for row in rows], dtype=np.float64).reshape(n, k)

    shares = {
        "repeated_token": (share(other, repeated_token_share), share(base, repeated_token_share)),
        "repeated_ngram": (share(other, repeated_ngram_share), share(base, repeated_ngram_share)),
    }
    return Fired(fired, scheme, baseline, shares)


GATE_CI = "95% Wilson over item-samples, counts divided by the items' design effect (the item as the unit)"
BUCKETED_BY = "the item's prompt length in tokens (fixed before the scheme acts)"


def _rate_row(metric: str, ones: np.ndarray, labels: dict, info: dict):
    from evalkit.evals.generation.paired import clustered_share
    from evalkit.evals.rows import MetricRow

    value, low, high, deff = clustered_share(ones)
    return MetricRow(
        metric,
        float(value),
        None if np.isnan(low) else float(low),
        None if np.isnan(high) else float(high),
        labels=dict(labels),
        info={**info, "n_fired": int(ones.sum()), "ci": GATE_CI, "design_effect": float(deff)},
    )


def gate_rows(name, fired: Fired, item_tokens, labels: dict, info: dict) -> list:
    """``fail_<gate>`` per gate and ``fail_any`` (the share of item-samples where it fires, see the module
    docstring), each with the scheme's and the baseline's own counts of the shape in its info; with
    ``item_tokens`` (one length per item, fixed before the scheme acts: its prompt's tokens) the same per
    bucket of it as ``fail_<gate>_by_length`` (label ``bucket``)."""
    from evalkit.evals.generation.paired import bucket_label, length_bucket

    n, k = fired.fired[ANY].shape
    trials = {**info, "n_items": n, "samples": k, "n_item_samples": n * k, "paired": PAIRED}
    rows = []
    for gate in (*GATES, ANY):
        extra = {"shape": DEFINITIONS[gate], "scheme_count": int(fired.scheme[gate].sum())}
        extra["baseline_count"] = int(fired.baseline[gate].sum())
        if gate in fired.shares:
            mine, theirs = fired.shares[gate]
            extra["mean_share"] = float(mine.mean()) if mine.size else 0.0
            extra["baseline_mean_share"] = float(theirs.mean()) if theirs.size else 0.0
        rows.append(_rate_row(name(f"fail_{gate}"), fired.fired[gate], labels, {**trials, **extra}))
    if item_tokens is None or n == 0:
        return rows
    buckets = [length_bucket(int(t)) for t in item_tokens]
    for bucket in sorted(set(buckets)):
        sel = np.array([b == bucket for b in buckets])
        for gate in (*GATES, ANY):
            extra = {"shape": DEFINITIONS[gate], "bucketed_by": BUCKETED_BY, "n_items": int(sel.sum())}
            extra["n_item_samples"] = int(sel.sum()) * k
            extra["baseline_count"] = int(fired.baseline[gate][sel].sum())
            extra["scheme_count"] = int(fired.scheme[gate][sel].sum())
            rows.append(
                _rate_row(
                    name(f"fail_{gate}_by_length"),
                    fired.fired[gate][sel],
                    {**labels, "bucket": bucket_label(bucket)},
                    {**info, "samples": k, "paired": PAIRED, **extra},
                )
            )
    return rows
