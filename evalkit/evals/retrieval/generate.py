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


@torch.inference_mode()
def generate_batches(
    lm, scheme, batches: Sequence[tuple[list[list[int]], int]], progress=None, on_batch=None
) -> list[list[str]]:
    """``batches``: (equal-length prompt ids, max_new_tokens). Returns the decoded continuations;
    ``on_batch(k, texts)`` is called after batch ``k``."""
    model, tok = lm.model, lm.tokenizer
    device = lm.device
    out_text: list[list[str]] = []
    from evalkit.integration.install import quantized_kv

    with quantized_kv(model, scheme):
        for prompts, max_new in batches:
            x = torch.tensor(prompts, dtype=torch.long, device=device)
            am = torch.ones_like(x)
            out = model.generate(x, attention_mask=am, generation_config=generation_config(tok, max_new))
            new = out[:, x.shape[1] :]
            out_text.append(tok.batch_decode(new, skip_special_tokens=True))
            if on_batch is not None:
                on_batch(len(out_text) - 1, out_text[-1])
            if progress is not None:
                progress.update(len(prompts))
    return out_text
