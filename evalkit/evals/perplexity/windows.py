"""How the perplexity evaluation cuts a corpus into windows (:func:`plan_windows`: every token scored
exactly once, by the window giving it the most context) and buckets scored positions
(:func:`position_bucket_edges`); shared by the evaluation and its ``--dry-run`` sizing."""

from __future__ import annotations

from evalkit.errors import EvalkitError


def position_bucket_edges(window: int) -> list[int]:
    """Edges 0, 128, 512, 2048, ... (powers of 4 from 128) up to the window's last target index."""
    edges, e = [0], 128
    while e < window:
        edges.append(e)
        e *= 4
    return edges + [window]


def plan_windows(n_tokens: int, window: int, stride: int, bos: bool, max_windows: int | None) -> list[tuple[int, int]]:
    """``(start, first_target)`` per window: the corpus index of its first content token and the
    input index of its first scored target (targets run from there to the window's end)."""
    c = window - int(bos)
    if n_tokens < c:
        raise EvalkitError(
            f"the corpus has {n_tokens} tokens, fewer than one window needs ({c}): use a longer corpus or a smaller --perplexity-window"
        )
    step, plan, scored_to, start = min(stride, c), [], (0 if bos else 1), 0
    while scored_to < n_tokens and (max_windows is None or len(plan) < max_windows):
        start = min(start, n_tokens - c)
        plan.append((start, max(scored_to - start + int(bos), 1)))  # input 0 is never a target
        scored_to, start = start + c, start + step
    return plan
