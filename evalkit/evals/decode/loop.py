"""The prefill-then-decode loop of the decode evaluation: one batch of sequences, one token per step.

:func:`decode_logits` prefills the first ``prefill`` tokens of every row in one forward, then feeds
one token per forward, continuing the storage cache the prefill made (the engine's path: every
step attends to the codes stored so far and writes its own token's K/V). It yields the next-token
logits for positions ``prefill .. L-1`` of the (B, L) batch, one (B, vocab) float32 tensor at a
time: position ``prefill`` is predicted by the prefill (the first generated token), each later
position by one decode step. ``L - 1 - prefill`` decode forwards in all; the last token is only a
target, never fed.

Rows are teacher-forced on ``ids`` (so baseline and scheme see identical inputs), except the rows
marked ``free``: they feed back their own argmax (greedy decoding) and the loop writes it into
``ids`` before the caller sees the step, so after the loop ``ids`` holds the greedy continuation.
The argmax is taken on the float32 logits, as ``generate()`` does.

Padding is handled as in ``generate()``: a 2-D attention mask (left padding: the prefill's last
position must be real), position ids from its cumulative sum, and the mask given to the storage
cache so per-sequence scales and blocks start at each sequence's first real token.

Everything stays on the model's device; nothing is read back to the host per step (the caller's
scorer decides). Only the backbone runs in the loop; :class:`~evalkit.evals.output_head.OutputHead`
turns each step's last hidden state into logits, so no (positions x vocabulary) tensor is ever made,
even for a 32k-token prefill.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from evalkit.integration.hf_compat import cache_inputs
from evalkit.integration.static_decode import StaticDecoder, position_ids

__all__ = ["decode_logits", "position_ids"]


def decode_logits(
    model,
    head,
    session,
    ids: torch.Tensor,
    mask: torch.Tensor,
    prefill: int,
    free: torch.Tensor | None = None,
    path: str = "eager",
) -> Iterator[torch.Tensor]:
    """Yield logits (B, vocab) predicting positions ``prefill, ..., L-1`` of ``ids`` (B, L), in order.

    ``session``: the :class:`~evalkit.integration.install.KVSession` of the enclosing
    ``quantized_kv`` block. ``free`` (B,) bool marks rows decoded greedily (their ``ids`` after the
    prefill are overwritten). ``path``: ``eager`` (the dynamic storage cache), or ``static`` /
    ``compiled`` (a static cache of L - 1 tokens, the step compiled for the latter:
    :mod:`evalkit.integration.static_decode`). Call inside ``torch.inference_mode()``."""
    length = ids.shape[1]
    if not 0 < prefill < length:
        raise ValueError(f"prefill {prefill} must be in 1..{length - 1}")
    if path != "eager":
        yield from _static_logits(model, head, session, ids, mask, prefill, free, path == "compiled")
        return
    pos = position_ids(mask)
    backbone = model.base_model
    cache = session.new_cache(mask[:, :prefill])
    out = backbone(
        input_ids=ids[:, :prefill],
        attention_mask=mask[:, :prefill],
        position_ids=pos[:, :prefill],
        **cache_inputs(backbone, cache),
    )
    hidden = out.last_hidden_state[:, -1]
    del out
    for t in range(prefill, length):
        logits = head(hidden)
        if free is not None:
            ids[:, t] = torch.where(free, logits.argmax(-1), ids[:, t])
        yield logits
        if t + 1 < length:
            out = backbone(
                input_ids=ids[:, t : t + 1],
                attention_mask=mask[:, : t + 1],
                position_ids=pos[:, t : t + 1],
                **cache_inputs(backbone, cache),
            )
            hidden = out.last_hidden_state[:, -1]
            del out
    session.check_finite()


def _static_logits(model, head, session, ids, mask, prefill: int, free, compiled: bool) -> Iterator[torch.Tensor]:
    """:func:`decode_logits` through a :class:`~evalkit.integration.static_decode.StaticDecoder`."""
    length = ids.shape[1]
    pos = position_ids(mask)
    decoder = StaticDecoder(session, model.base_model, mask, prefill, length - 1, compiled)
    hidden = decoder.prefill(ids[:, :prefill], pos[:, :prefill])
    for t in range(prefill, length):
        logits = head(hidden)
        if free is not None:
            ids[:, t] = torch.where(free, logits.argmax(-1), ids[:, t])
        yield logits
        if t + 1 < length:
            hidden = decoder.step(ids[:, t : t + 1], pos[:, t : t + 1])
    session.check_finite()
