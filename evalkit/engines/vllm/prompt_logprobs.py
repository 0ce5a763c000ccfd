"""vLLM's prompt log-probs of one prompt as arrays: the log-prob of each actual next token and the engine's
top-k ids and log-probs at each position (:class:`PromptLogprobs`), read from vLLM 0.32's flat layout
without building per-token objects (or from its ``{token_id: Logprob}`` dicts).

Apart from :mod:`evalkit.engines.vllm.runner`, which asks vLLM for them: this is the reading of vLLM's
answer, checked against its layout, and testable without vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evalkit.errors import EvalkitError


@dataclass
class PromptLogprobs:
    """One prompt's scored positions 1..n-1: ``target[i]`` is log P(token i+1 | tokens 0..i), ``ids``/``lps``
    the engine's top-k at that position (k columns, by rank)."""

    target: np.ndarray  # (n - 1,) float64
    ids: np.ndarray  # (n - 1, k) int64
    lps: np.ndarray  # (n - 1, k) float64


def read_prompt_logprobs(flat, tokens: list[int], k: int) -> PromptLogprobs:
    """vLLM's prompt log-probs of one prompt -> arrays (flat form: vllm.logprobs.FlatLogprobs; a list
    of ``{token_id: Logprob}`` dicts is read too)."""
    n = len(tokens)
    if flat is None or len(flat) != n:
        raise EvalkitError(f"vLLM returned {0 if flat is None else len(flat)} prompt positions for a {n}-token prompt")
    if hasattr(flat, "start_indices"):
        starts = np.asarray(flat.start_indices[1:], dtype=np.int64)
        widths = np.asarray(flat.end_indices[1:], dtype=np.int64) - starts
        if n > 1 and starts[0] == 0 and (widths == k + 1).all():
            lps = np.asarray(flat.logprobs, dtype=np.float64).reshape(n - 1, k + 1)
            ids = np.asarray(flat.token_ids, dtype=np.int64).reshape(n - 1, k + 1)
            if (ids[:, 0] == np.asarray(tokens[1:])).all():
                return PromptLogprobs(lps[:, 0].copy(), ids[:, 1:].copy(), lps[:, 1:].copy())
        raise EvalkitError(
            "vLLM's flat prompt log-probs are not the actual token plus the top-k at each position: "
            f"this evalkit reads vLLM 0.32's layout (widths {sorted(set(widths.tolist()))[:4]}, k={k})"
        )
    target = np.empty(n - 1)
    ids, lps = np.empty((n - 1, k), dtype=np.int64), np.empty((n - 1, k))
    for i, d in enumerate(flat[1:]):
        target[i] = d[tokens[i + 1]].logprob
        top = sorted(((lp.rank, t, lp.logprob) for t, lp in d.items() if lp.rank is not None and lp.rank <= k))
        if len(top) != k:
            raise EvalkitError(f"vLLM returned {len(top)} top tokens at prompt position {i + 1}, not {k}")
        ids[i], lps[i] = [t for _, t, _ in top], [lp for _, _, lp in top]
    return PromptLogprobs(target, ids, lps)
