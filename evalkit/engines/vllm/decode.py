"""The decode and retrieval evaluations' requests through vLLM: greedy generation and per-position log-probs.

Decode (:func:`decode_run`, :func:`decode_positions`). With the decode eval's N prompts of P tokens
and T generated tokens (:mod:`evalkit.evals.decode.evaluation`), an engine started for one
configuration answers two requests:

* **free-running**: vLLM's own greedy generation of T tokens per prompt (``temperature=0``, EOS
  ignored, as the eval's loop generates exactly T); under the scheme and under the engine baseline
  (``kv_cache_dtype="auto"``, the model's dtype). The first step where the two token sequences
  differ and the share identical through T are :mod:`evalkit.evals.decode.divergence`'s, computed on
  the real generations (the emulation gets the same quantity from one teacher-forced pass);
* **teacher-forced**: the prompt log-probs over the P + T tokens of each corpus row (rows 0..N-1) and
  of each prompt continued by the *baseline's* greedy tokens (rows N..2N-1), the engine's top-k per
  position. KL(baseline || scheme) per decode position is kl_topk's proven lower bound over the
  tokens both top-k lists hold (:func:`evalkit.engines.vllm.backend.kl_lower_bound`, as perplexity's
  engine path), top-1 agreement compares the rank-1 tokens, NLL is the corpus token's.

The engine computes the teacher-forced positions in one prefill, not one decode step at a time: its
KL rows measure the stored cache's effect at those positions, the free-running rows the decode path.

Retrieval (:func:`generate_texts`): greedy generation of each prompt, stopping at the tokenizer's
EOS (``ignore_eos`` with EOS as the one stop token: the rule of the emulation's ``generate()``, not
vLLM's extra stops from ``generation_config.json``), decoded with the model's tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from evalkit.engines.vllm.topk import EngineRun, kl_lower_bound

PROMPTS_PER_CALL = 16  # prompts handed to LLM.generate at once


def greedy_tokens(
    runner, prompts: list[list[int]], max_tokens: int, stop: int | None = None, progress: bool = True
) -> list[list[int]]:
    """vLLM's greedy continuation of each prompt (token ids), at most ``max_tokens``; EOS ignored
    unless ``stop`` names the one token that ends a continuation. With ``progress`` a bar on stderr
    counts the tokens the engine computes (:meth:`~evalkit.engines.vllm.runner.VllmRunner.run_requests`)."""
    from contextlib import nullcontext

    from vllm import SamplingParams

    from evalkit.engines.vllm.startup import progress_bar

    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0,
        ignore_eos=True,
        detokenize=False,
        stop_token_ids=[] if stop is None else [int(stop)],
    )
    out = []
    total = sum(len(p) + max_tokens for p in prompts)
    bar = progress_bar(f"vLLM {runner.kv_cache_dtype}: greedy decoding", total) if progress else nullcontext()
    with bar:
        for lo in range(0, len(prompts), PROMPTS_PER_CALL):
            chunk = prompts[lo : lo + PROMPTS_PER_CALL]
            results = runner.run_requests(chunk, params, bar if progress else None)
            out += [list(r.outputs[0].token_ids) for r in results]
    return out


def generate_texts(runner, tokenizer, batches, progress=None, on_batch=None) -> list[list[str]]:
    """Retrieval's request: per batch of ``(prompt ids, max_new_tokens)``, the decoded greedy texts."""
    from evalkit.evals.retrieval.generate import texts_per_batch

    def generate(prompts, max_new):
        gens = greedy_tokens(runner, prompts, max_new, stop=tokenizer.eos_token_id, progress=False)  # retrieval's bar
        return tokenizer.batch_decode(gens, skip_special_tokens=True)

    return texts_per_batch(generate, batches, progress, on_batch)


@dataclass
class DecodeRun:
    """One engine configuration's answers for the decode eval: the greedy generation and the
    teacher-forced log-probs of every row's decode positions (flattened row-major, 2N x T)."""

    generated: np.ndarray  # (N, T) int64
    scores: object  # vllm_backend.EngineRun over the 2N x T decode positions


def decode_run(runner, rows: torch.Tensor, prefill: int, decode: int, generated: np.ndarray | None = None) -> DecodeRun:
    """Generate under ``runner`` from the prompts ``rows[:N, :prefill]``, then score the teacher-forced
    rows: ``rows`` (2N, P + T) with the greedy rows' continuation taken from ``generated`` (the
    baseline's; None: this run's own, for the baseline itself)."""
    n = rows.shape[0] // 2
    prompts = rows[:n, :prefill].tolist()
    own = np.array(greedy_tokens(runner, prompts, decode), dtype=np.int64).reshape(n, decode)
    cont = own if generated is None else generated
    full = rows.clone()
    full[n:, prefill:] = torch.from_numpy(cont)
    outs = runner.prompt_logprobs(full.tolist())
    sl = slice(prefill - 1, None)  # prompt row j-1 predicts input j: the decode positions P..P+T-1
    scores = EngineRun(
        nll=-torch.from_numpy(np.concatenate([o.target[sl] for o in outs])),
        ids=torch.from_numpy(np.concatenate([o.ids[sl] for o in outs])),
        lps=torch.from_numpy(np.concatenate([o.lps[sl] for o in outs])),
        target=full[:, prefill:].reshape(-1).long(),
    )
    return DecodeRun(own, scores)


def decode_positions(base: DecodeRun, run: DecodeRun, shape: tuple[int, int], info: dict) -> dict:
    """The decode eval's per-position arrays (2N x T) of ``run`` against the engine baseline ``base``:
    ``kl`` None (a bound only), ``kl_lower``, ``tail_mass``, ``agree`` (teacher-forced rows: rank-1 tokens
    equal; free-running rows: the scheme's own generated token equals the baseline's), ``nll``, ``base_nll``."""
    rows, steps = shape
    n = rows // 2
    _, lower, tail = kl_lower_bound(base.scores, run.scores)
    agree = (run.scores.ids[:, 0] == base.scores.ids[:, 0]).numpy().reshape(rows, steps)
    agree[n:] = run.generated == base.generated
    return {
        "kl": None,
        "kl_var": None,
        "kl_lower": lower.numpy().reshape(rows, steps),
        "tail_mass": tail.numpy().reshape(rows, steps),
        "agree": agree,
        "nll": run.scores.nll.numpy().reshape(rows, steps),
        "base_nll": base.scores.nll.numpy().reshape(rows, steps),
        "info": info,
    }
