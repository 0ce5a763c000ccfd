"""Log-probabilities of llama.cpp's float32 logits, computed in float64: the one reading the llama.cpp backend's
perplexity and decode rows and its lm-eval answers share (a module of its own so neither imports the other)."""

from __future__ import annotations

import numpy as np


def log_softmax64(logits: np.ndarray, probs: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Row-wise log-softmax in float64 of float32 logits, and the probabilities (computed in place: two
    [rows, vocab] float64 arrays in all); ``probs=False`` skips normalising them (None), the same
    log-probs bit for bit."""
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    p = np.exp(x)
    total = p.sum(axis=-1, keepdims=True)
    x -= np.log(total)
    if not probs:
        return x, None
    p /= total
    return x, p
