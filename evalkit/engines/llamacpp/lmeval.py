"""lm-eval's requests through llama.cpp, in process: an lm-eval ``TemplateLM`` over one llama.cpp context.

lm-eval's own llama.cpp model (``lm_eval.models.gguf``) talks HTTP to a llama.cpp server; evalkit runs
the requests in its own process through llama-cpp-python, as its perplexity and retrieval do
(:mod:`evalkit.engines.llamacpp.context`), with the scheme's cache types (``type_k``/``type_v``, the
``--cache-type-k/-v`` of llama.cpp's tools) and flash attention as the backend sets them.

The class (:func:`llamacpp_lm_class`) subclasses lm-eval's ``TemplateLM`` and takes HFLM's own text rules
(its ``tok_encode``, ``tok_decode``, ``prefix_token_id``, ``eot_token_id``, ``max_gen_toks``; nothing copied),
so the evaluation's tokenizer turns every request into the token ids the emulation's HFLM scores:

* ``loglikelihood``: lm-eval splits (context, continuation) (``TemplateLM.loglikelihood``); each request's
  input is HFLM's, ``(context + continuation)[-(max_length + 1):][:-1]``, decoded from an empty cache, and
  the continuation's log-likelihood is the sum over its tokens of the float64 log-softmax of llama.cpp's
  full-vocabulary logits at the positions that predict them; ``is_greedy``: each of those argmaxes is the
  continuation's token. Requests with the same input (one-token answer choices after one question) share
  one decode, as HFLM shares one forward.
* ``loglikelihood_rolling``: lm-eval's rolling windows (``get_rolling_token_windows`` and
  ``make_disjoint_window``, context length 1, as HFLM), each scored as above.
* ``generate_until``: greedy (argmax per step through the cache, llama.cpp's decode path), the context
  left-truncated to ``max_length - max_gen_toks`` as HFLM does; it stops at the tokenizer's EOS token, at
  ``max_gen_toks`` (lm-eval's ``normalize_gen_kwargs``: the task's value, else 256) or once the decoded
  continuation holds one of the until-strings (lm-eval's ``handle_stop_sequences``, the EOS text added),
  and the text is cut at the first of them (lm-eval's ``postprocess_generated_text``). Sampling
  (``do_sample: true``) is refused in one line: the engine's baseline is one greedy run.

One request is decoded at a time (one sequence per context), so lm-eval's batch size is 1.
"""

from __future__ import annotations

import os
from functools import cache

import numpy as np

from evalkit.errors import EvalkitError


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    from evalkit.engines.llamacpp.log_probs import log_softmax64

    return log_softmax64(logits, probs=False)[0]


@cache
def llamacpp_lm_class():
    """lm-eval's ``TemplateLM`` over llama.cpp (see the module docstring), built once per process."""
    from lm_eval.api.model import TemplateLM
    from lm_eval.models.huggingface import HFLM
    from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
    from tqdm import tqdm

    class LlamaCppLM(TemplateLM):
        """lm-eval requests through a llama.cpp backend under one scheme (None: its f16 baseline)."""

        # HFLM's text rules, taken as they are: the same token ids as the emulation's HFLM
        tok_encode = HFLM.tok_encode
        tok_decode = HFLM.tok_decode
        prefix_token_id = HFLM.prefix_token_id
        eot_token_id = HFLM.eot_token_id
        max_gen_toks = HFLM.max_gen_toks
        add_bos_token = None  # HFLM's default: the tokenizer's own rule
        custom_prefix_token_id = None

        def __init__(self, engine, scheme, tokenizer, max_length: int):
            super().__init__()
            self.engine, self.scheme, self.tokenizer = engine, scheme, tokenizer
            self.max_length = int(max_length)
            self.batch_size = 1
            self.quiet = os.environ.get("EVALKIT_PROGRESS") == "0"

        def _bar(self, n: int, what: str, disable: bool):
            return tqdm(total=n, desc=f"llama.cpp {what}", disable=disable or self.quiet)

        def _context(self, longest: int):
            return self.engine.context("auto" if self.scheme is None else self.scheme, longest)

        # -- log-likelihoods -------------------------------------------------------------------------
        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
            groups: dict[tuple[int, ...], list[int]] = {}  # one decode per distinct input
            for i, (_, context, continuation) in enumerate(requests):
                if not continuation:
                    raise EvalkitError(
                        "an lm-eval loglikelihood request with an empty continuation: llama.cpp has nothing to "
                        "score (check the task's doc_to_target and target_delimiter)"
                    )
                if len(continuation) > self.max_length:
                    raise EvalkitError(
                        f"an lm-eval continuation of {len(continuation)} tokens exceeds the model's length "
                        f"{self.max_length}: shorten the task's targets"
                    )
                inp = (list(context) + list(continuation))[-(self.max_length + 1) :][:-1]
                groups.setdefault(tuple(inp), []).append(i)
            out: list[tuple[float, bool] | None] = [None] * len(requests)
            if not requests:
                return []
            bar = self._bar(len(requests), "loglikelihood", disable_tqdm)
            with self._context(max(len(k) for k in groups)) as ctx:
                for inp, idx in groups.items():
                    first = len(inp) - max(len(requests[i][2]) for i in idx)
                    lp = _log_softmax(ctx.logits(list(inp), first=first))
                    for i in idx:
                        cont = np.asarray(requests[i][2], np.int64)
                        rows = lp[len(lp) - len(cont) :]
                        picked = rows[np.arange(len(cont)), cont]
                        out[i] = (float(picked.sum()), bool((rows.argmax(-1) == cont).all()))
                        self.cache_hook.add_partial("loglikelihood", requests[i][0], out[i])
                    bar.update(len(idx))
            bar.close()
            return out

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
            windows, owner = [], []
            for r, (string,) in enumerate(req.args for req in requests):
                for ctx_ids, pred in map(
                    make_disjoint_window,
                    get_rolling_token_windows(
                        token_list=self.tok_encode(string),
                        prefix_token=self.prefix_token_id,
                        max_seq_len=self.max_length,
                        context_len=1,
                    ),
                ):
                    windows.append((None, ctx_ids, pred))
                    owner.append(r)
            scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
            totals = [0.0] * len(requests)
            for r, (value, _) in zip(owner, scores, strict=True):
                totals[r] += value
            for req, total in zip(requests, totals, strict=True):
                self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
            return totals

        # -- greedy generation ------------------------------------------------------------------------
        def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
            if not requests:
                return []
            eos_text = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
            eos_ids = [] if self.eot_token_id is None else [int(self.eot_token_id)]
            jobs = []
            for req in requests:
                context, gen_kwargs = req.args
                kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
                until = handle_stop_sequences(kwargs.pop("until", None), eos=eos_text)
                max_gen = int(kwargs.pop("max_gen_toks"))
                if kwargs.get("do_sample"):
                    raise EvalkitError(
                        f"lm-eval asks llama.cpp to sample (generation_kwargs {gen_kwargs}): evalkit's llama.cpp "
                        "path generates greedily only; set do_sample: false in the task or use --engine emulation"
                    )
                if max_gen >= self.max_length:
                    raise EvalkitError(
                        f"max_gen_toks {max_gen} leaves no room for a prompt in the model's length {self.max_length}: "
                        "lower the task's max_gen_toks"
                    )
                ids = self.tok_encode(context, left_truncate_len=self.max_length - max_gen)
                jobs.append((ids, max_gen, until))
            res = []
            bar = self._bar(len(jobs), "generate_until", disable_tqdm)
            with self._context(max(len(ids) + max_gen for ids, max_gen, _ in jobs)) as ctx:
                for req, (ids, max_gen, until) in zip(requests, jobs, strict=True):
                    stops = [s for s in until if s]

                    def stop(tokens, stops=stops):
                        text = self.tok_decode(tokens, skip_special_tokens=False)
                        return any(s in text for s in stops)

                    tokens = ctx.generate(ids, max_gen, eos_ids, stop=stop)
                    text = postprocess_generated_text(self.tok_decode(tokens), until, None)
                    res.append(text)
                    self.cache_hook.add_partial("generate_until", req.args, text)
                    bar.update(1)
            bar.close()
            return res

    return LlamaCppLM
