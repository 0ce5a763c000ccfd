"""Greedy answers for retrieval prompts, through the storage cache (:func:`evalkit.quantized_kv`).

Inside ``quantized_kv`` the model's ``generate()`` gets a storage cache whose layers keep K/V as
codes plus scales; the prefill attention and every decode step read those stored values back, as a
serving engine with an FP8 KV cache does.

All prompts of one (task, length) have exactly the same number of tokens, so a batch needs no
padding: the attention mask is all ones and batched greedy decoding equals one-by-one decoding
up to floating-point reduction order. Decoding stops at EOS or ``max_new_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import GenerationConfig


def generation_config(tokenizer, max_new_tokens: int) -> GenerationConfig:
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        eos_token_id=eos,
        pad_token_id=pad,
        temperature=None,
        top_p=None,
        top_k=None,
    )


def texts_per_batch(generate, batches, progress=None, on_batch=None) -> list[list[str]]:
    """``generate(prompts, max_new_tokens) -> texts`` over ``batches`` of (equal-length prompt ids,
    max_new_tokens): the texts per batch, ``on_batch(k, texts)`` after batch ``k`` and ``progress``
    advanced by its prompts. Every backend's retrieval generation runs through this loop."""
    texts: list[list[str]] = []
    for prompts, max_new in batches:
        texts.append(generate(prompts, max_new))
        if on_batch is not None:
            on_batch(len(texts) - 1, texts[-1])
        if progress is not None:
            progress.update(len(prompts))
    return texts


@torch.inference_mode()
def generate_batches(
    lm, scheme, batches: Sequence[tuple[list[list[int]], int]], progress=None, on_batch=None
) -> list[list[str]]:
    """``batches``: (equal-length prompt ids, max_new_tokens). Returns the decoded continuations;
    ``on_batch(k, texts)`` is called after batch ``k``."""
    from evalkit.integration.install import quantized_kv

    model, tok = lm.model, lm.tokenizer
    path = getattr(lm, "decode_path", "eager")

    def generate(prompts, max_new):
        x = torch.tensor(prompts, dtype=torch.long, device=lm.device)
        config = generation_config(tok, max_new)
        if path != "eager":  # the static cache, its steps compiled on the compiled path
            new = static_greedy(session, model, x, config, path == "compiled")
        else:
            new = model.generate(x, attention_mask=torch.ones_like(x), generation_config=config)[:, x.shape[1] :]
        return tok.batch_decode(new, skip_special_tokens=True)

    with quantized_kv(model, scheme) as session:
        return texts_per_batch(generate, batches, progress, on_batch)


def static_greedy(session, model, ids: torch.Tensor, config: GenerationConfig, compiled: bool, mask=None):
    """``generate()``'s greedy tokens for ``ids`` (B, P) under ``config`` (EOS ids, pad id, max_new_tokens),
    through the static storage cache (:func:`evalkit.integration.static_decode.greedy_generate`)."""
    from evalkit.integration.static_decode import greedy_generate

    eos = config.eos_token_id
    eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    mask = torch.ones_like(ids) if mask is None else mask
    tokens = greedy_generate(session, model, ids, mask, config.max_new_tokens, eos, config.pad_token_id, compiled)
    return tokens
