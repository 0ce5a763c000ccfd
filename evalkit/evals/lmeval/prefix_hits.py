"""Prefix-cache hits for lm-eval's generations: a request whose prompt begins with blocks an earlier
request already stored reads those blocks quantized, as a serving engine with prefix caching serves it.

vLLM keeps prefix caching on by default and hands a request the full cached blocks of its longest
cached prefix (16-token blocks, never its last token); the rest of its prompt is a continuation chunk
over those blocks (:mod:`evalkit.integration.chunked` cites the source). Under a scheme whose first-chunk
prefill reads raw K/V (TurboQuant, UltraQuant) that is where the quantized prefix enters the prompt's
own attention, and where hit-only failures come from (a 4-bit TurboQuant NIAH that fails only with the
prefix cached).

The model here: the requests of one lm-eval run are served in lm-eval's order into a cache that evicts
nothing. Each prompt's hit is its longest common prefix with any prompt served before it, in whole
blocks, at most its length - 1 (:func:`evalkit.integration.chunked.prefix_hit_length`). What the
items of an evaluation share is what they really share as token prefixes: a generation task's chat
template, system prompt and few-shot turns; a RULER length's instructions and the haystack before the
first place two items differ. The first request of each shared prefix computes it (a miss, its own
first-chunk prefill). A hit is run as: the shared blocks prefilled into the request's own cache (the same
codes the earlier request stored, for every per-token codec; a dynamic per-tensor or per-head scale is
then taken from the shared blocks), then ``generate`` continues from that cache, so the rest of the prompt
is one continuation chunk. The baseline runs the same two steps on the plain model (a ``DynamicCache``),
so an identity scheme reproduces it bit for bit. Rows are generated one at a time in this mode (each
prompt without padding); a batch of several requests is not interleaved as an engine's scheduler would.
"""

from __future__ import annotations

import torch

from evalkit.integration.chunked import PREFIX_BLOCK, common_prefix, prefix_hit_length


class PrefixHits:
    """The prompts served so far in one lm-eval run and where a hit's cache comes from: ``session`` (a
    ``quantized_kv`` session: a storage cache), or None for the plain model (a ``DynamicCache``)."""

    def __init__(self, model, session=None, block: int = PREFIX_BLOCK):
        self.model, self.session, self.block = model, session, block
        self.seen: list[list[int]] = []
        self.hits: list[int] = []  # per request served, the tokens it read from the prefix cache

    def hit(self, prompt: list[int]) -> int:
        """The tokens of ``prompt`` read from the prefix cache; ``prompt`` is then served (cached)."""
        shared = max((common_prefix(prompt, s) for s in self.seen), default=0)
        self.seen.append(prompt)
        n = prefix_hit_length(shared, len(prompt), self.block)
        self.hits.append(n)
        return n

    def prefilled(self, ids: torch.Tensor):
        """A new cache holding ``ids`` (1, n): the shared blocks, stored as the scheme stores them."""
        from transformers import DynamicCache

        from evalkit.integration.hf_compat import cache_inputs

        cache = DynamicCache(config=self.model.config) if self.session is None else self.session.new_cache()
        backbone = self.model.base_model
        with torch.no_grad():
            backbone(input_ids=ids, **cache_inputs(backbone, cache))
        return cache


def hits_note(hits: list[int]) -> str:
    """What a row served with prefix-cache hits says of its path."""
    n = sum(1 for h in hits if h)
    mean = sum(hits) / n if n else 0.0
    return f"prefix-cache hits: {n} of {len(hits)} requests read a cached prefix (mean {mean:.0f} tokens)"


def generate_with_hits(hits: PrefixHits, generate, context, max_length: int, stop, pad_id: int, **kwargs):
    """``generate`` (HFLM's ``_model_generate``) row by row, each row's cached prefix prefilled first:
    the (B, L + new) tensor lm-eval expects, each row its left-padded context then its tokens, right-padded."""
    from evalkit.integration.hf_compat import cache_keyword

    mask = kwargs.pop("attention_mask", None)
    new = max_length - context.shape[1]
    outs = []
    for i in range(context.shape[0]):
        row = context[i : i + 1] if mask is None else context[i : i + 1, mask[i].bool()]
        n = hits.hit(row[0].tolist())
        extra = {} if n == 0 else {cache_keyword(hits.model): hits.prefilled(row[:, :n])}
        out = generate(row, row.shape[1] + new, stop, attention_mask=torch.ones_like(row), **extra, **kwargs)
        outs.append(out[0, row.shape[1] :])
    width = max(len(o) for o in outs)
    tail = torch.full((len(outs), width), pad_id, dtype=context.dtype, device=context.device)
    for i, o in enumerate(outs):
        tail[i, : len(o)] = o
    return torch.cat([context, tail], dim=1)
