"""The emulation's work on a traces file: each prompt's generations under a scheme, and the decode KL
along the baseline's own continuation.

Generation. Every prompt is generated alone (batch 1: no padding, so a scheme's tokens differ from the
baseline's only through its KV cache) on the model's decode path (``--decode-path``): on ``eager``
with ``generate()`` inside :func:`evalkit.quantized_kv` (the baseline: the plain model); on ``static``
and ``compiled`` through the static storage cache
(:func:`evalkit.integration.static_decode.greedy_generate`, transformers' own sampling warpers, the
same random stream as ``generate()``; the baseline through the identity scheme, bit for bit the plain
model's static-cache decoding), or refused in one line where that path cannot serve the model or the
settings. ``max_new_tokens`` is the output budget, stopping at the end-of-sequence token; sample j
of every prompt is seeded with ``seed + j`` right before its generation, so a scheme and the
baseline draw the same random numbers for the same prompt and sample. The generated ids are kept
exactly (with the end-of-sequence token when one ends the generation).

Decode KL. The baseline's first sample of each prompt is teacher-forced through the decode loop of the
decode evaluation (:func:`evalkit.evals.decode.loop.decode_logits`: one prefill of the prompt, then one
token per step through the storage cache): under the identity scheme once (the baseline), keeping per
generated token the 2 KB summary of its next-token distribution (:func:`evalkit.evals.kl_topk.summarize`),
then under each scheme, scoring each step's distribution against it (:func:`evalkit.evals.kl_topk.kl_from_summary`:
KL(baseline || scheme), its proven lower bound) and whether the argmax agrees with the baseline's. The
identity scheme gives KL exactly 0: the same computation on the same numbers. Summaries are held in
memory, :data:`SUMMARY_LIMIT` bytes at most.
"""

from __future__ import annotations

import numpy as np
import torch

from evalkit.errors import EvalkitError
from evalkit.units import format_bytes

SUMMARY_LIMIT = 2 * 2**30  # bytes of baseline summaries held in memory (2008 B per generated token)
SAMPLE_SEED = 0  # the tail samples' stratified offsets of kl_topk (per prompt)


def _config(tokenizer, budget: int, gen_kwargs: dict):
    from transformers import GenerationConfig

    eos = tokenizer.eos_token_id
    sampled = bool(gen_kwargs.get("do_sample"))
    return GenerationConfig(
        max_new_tokens=budget,
        do_sample=sampled,
        temperature=gen_kwargs.get("temperature") if sampled else None,
        top_p=gen_kwargs.get("top_p") if sampled else None,
        top_k=0 if sampled else None,  # only temperature and top_p shape the draw, as in a server's request
        num_beams=1,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos,
    )


@torch.inference_mode()
def generate(
    lm, scheme, prompts: list[list[int]], budget: int, gen_kwargs: dict, seeds: list[int]
) -> list[list[list[int]]]:
    """Per prompt, per sample: the generated token ids under ``scheme`` (None: the plain model), on
    the model's decode path (``lm.decode_path``)."""
    import contextlib

    from evalkit.integration.install import quantized_kv

    config = _config(lm.tokenizer, budget, gen_kwargs)
    eos = config.eos_token_id
    eos = set([eos] if isinstance(eos, int) else (eos or []))
    path = getattr(lm, "decode_path", "eager")
    if path == "eager":
        block = contextlib.nullcontext() if scheme is None else quantized_kv(lm.model, scheme)
    else:  # the baseline through the identity storage cache, as every scheme through its own
        block = quantized_kv(lm.model, "auto" if scheme is None else scheme)
    out = []
    with block as session:
        decode = _static_decoder(lm, session, config, path == "compiled") if path != "eager" else None
        for ids in prompts:
            x = torch.tensor([ids], dtype=torch.long, device=lm.device)
            samples = []
            for seed in seeds:
                torch.manual_seed(seed)
                if decode is None:
                    new = lm.model.generate(x, attention_mask=torch.ones_like(x), generation_config=config)[0]
                    new = new[x.shape[1] :]
                else:
                    new = decode(x)[0]
                tokens = new.tolist()
                end = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
                samples.append(tokens[:end])  # through the first end-of-sequence token (no padding after it)
            out.append(samples)
    return out


def _static_decoder(lm, session, config, compiled: bool):
    """``x`` (1, P) -> its new tokens (1, <= budget) through the static storage cache, drawing as
    ``generate(generation_config=config)`` draws; settings the static path cannot reproduce are
    refused in one line (:func:`~evalkit.integration.static_decode.sampling_warpers`)."""
    from evalkit.integration.static_decode import greedy_generate, sampling_warpers

    settings = {"do_sample": bool(config.do_sample)}
    if config.do_sample:
        settings.update(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k)
    warpers = sampling_warpers(lm.model, **settings)
    eos = config.eos_token_id
    eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    pad = config.pad_token_id if config.pad_token_id is not None else (eos or [0])[0]

    def decode(x: torch.Tensor) -> torch.Tensor:
        mask = torch.ones_like(x)
        return greedy_generate(session, lm.model, x, mask, config.max_new_tokens, eos, pad, compiled, warpers=warpers)

    return decode


def output_length(tokens: list[int], eos: set[int]) -> int:
    """Generated tokens without the end-of-sequence token that closed the generation."""
    return len(tokens) - (1 if tokens and tokens[-1] in eos else 0)


def check_memory(continuations: list[list[int]]) -> None:
    from evalkit.evals.kl_topk import BYTES_PER_POSITION

    need = sum(len(c) for c in continuations) * BYTES_PER_POSITION
    if need > SUMMARY_LIMIT:
        raise EvalkitError(
            f"the traces' baseline summaries need {format_bytes(need)} of memory (2008 B per generated token), over "
            f"{format_bytes(SUMMARY_LIMIT)}: lower --generation-max-gen-toks or split the traces file"
        )


@torch.inference_mode()
def teacher_forced(lm, head, scheme, prompts: list[list[int]], continuations: list[list[int]], baseline=None):
    """Run each prompt + continuation through the decode loop under ``scheme``.

    Without ``baseline``: the baseline pass, returning per prompt its summaries (tensors with one row per
    generated token) and argmax. With it: per prompt a dict of numpy arrays ``kl``, ``kl_lower`` and
    ``agree`` (one value per generated token)."""
    from evalkit.evals.decode.loop import decode_logits
    from evalkit.evals.kl_topk import kl_from_summary, summarize
    from evalkit.integration.install import quantized_kv

    out = []
    path = getattr(lm, "decode_path", "eager")
    with quantized_kv(lm.model, scheme) as session:
        for k, (prompt, cont) in enumerate(zip(prompts, continuations)):
            ids = torch.tensor([prompt + cont], dtype=torch.long, device=lm.device)
            steps = decode_logits(lm.model, head, session, ids, torch.ones_like(ids), len(prompt), None, path)
            if baseline is None:
                generator = torch.Generator().manual_seed(SAMPLE_SEED)
                rows = [(summarize(torch.log_softmax(lg, -1), generator), lg.argmax(-1)) for lg in steps]
                summary = {name: torch.cat([r[0][name] for r in rows]) for name in rows[0][0]}
                out.append({"summary": summary, "argmax": torch.cat([r[1] for r in rows])})
                continue
            base = baseline[k]
            kl, lower, agree = [], [], []
            for j, lg in enumerate(steps):
                step = {name: v[j : j + 1] for name, v in base["summary"].items()}
                value, low, _ = kl_from_summary(step, torch.log_softmax(lg, -1))
                kl.append(float(value[0]))
                lower.append(float(low[0]))
                agree.append(bool(lg.argmax(-1)[0] == base["argmax"][j]))
            out.append({"kl": np.array(kl), "kl_lower": np.array(lower), "agree": np.array(agree)})
    return out
