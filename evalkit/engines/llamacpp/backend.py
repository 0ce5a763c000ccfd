"""llama.cpp as an evaluation backend (:mod:`evalkit.evals.backend`'s interface).

Perplexity (request (a)): every window is decoded by llama.cpp twice, once with its f16 cache (the
engine's baseline, flash attention as for the scheme) and once with the scheme's cache types, each in
its own context; llama.cpp returns the full vocabulary's logits at every position
(:meth:`~evalkit.engines.llamacpp.context.LlamaCppContext.logits`), so NLL, top-1 agreement and
KL(baseline || scheme) are exact per token (``kl_method: exact``), not a top-k bound. Log-softmax and
KL are computed here in float64 from llama.cpp's float32 logits.

Decode (request (b)): the f16 baseline's greedy continuation of each prompt, then per scheme every row
through llama.cpp's decode path under the f16 cache and under the scheme (prefill, then one
``llama_decode`` per token): exact KL, NLL and top-1 per step, and the scheme's own greedy generation
against the baseline's on the free-running rows.

Retrieval (request (c), greedy texts): llama.cpp's greedy generation through the scheme's cache,
decoded with the evaluation's tokenizer (the GGUF's own vocabulary).

lm-eval (request (d)): lm-eval's loglikelihood, rolling loglikelihood and greedy ``generate_until`` through
llama.cpp in process (:mod:`evalkit.engines.llamacpp.lmeval`, an lm-eval ``TemplateLM`` with HFLM's text
rules), one request at a time; the baseline is the f16 cache's run, flip rates against it.

The model is a GGUF file: the embedded model's (``embedded_gguf``), a ``.gguf`` path, or a folder
holding exactly one (:func:`~evalkit.engines.llamacpp.gguf.gguf_path`). The evaluation's tokenizer and windows come from the
transformers model evalkit loads from the same file, so both see the same token ids.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np
import torch

from evalkit.engines.llamacpp.engine import BASELINE_TYPES, DEFAULTS, cache_types, check_types
from evalkit.engines.llamacpp.gguf import gguf_path
from evalkit.engines.llamacpp.log_probs import log_softmax64
from evalkit.errors import EvalkitError
from evalkit.evals.backend import Backend, Capabilities, DecodeRequest, LmevalRequest, LogprobsRequest, TokenScores

KL_METHOD = "exact: full-vocabulary log-softmax of llama.cpp's logits, float64"
SCHEMES = "llamacpp:<k>[/<v>] (llama.cpp's cache types) and the f16 baseline"


class LlamaCppBackend(Backend):
    """Perplexity and greedy generation through llama.cpp's own KV cache (see the module docstring)."""

    engine = "llamacpp"

    def __init__(self, n_threads: int = 2, n_ctx: int | None = None, n_batch: int = 512, flash_attn: bool = True):
        from evalkit.engines.llamacpp import runtime

        runtime.require()
        self.n_threads, self.n_ctx, self.n_batch, self.flash_attn = n_threads, n_ctx, n_batch, flash_attn
        self.capabilities = Capabilities(
            runtime.version(),
            kl="estimate",
            step_distributions=True,
            requests=frozenset({"logprobs", "decode", "generate", "lmeval"}),
            schemes=SCHEMES,
        )
        self._model = None
        self._path = None
        self._base_ctx = None  # the f16 baseline's context, kept open across the schemes of a prepared eval

    # -- the model and its contexts -------------------------------------------------------------------
    def open(self, name: str):
        """The llama.cpp model for evalkit model ``name`` (loaded once per backend)."""
        from evalkit.engines.llamacpp.model import LlamaCppModel

        path = gguf_path(name)
        if self._model is None or self._path != path:
            self.close()
            self._model, self._path = LlamaCppModel.open(path, n_threads=self.n_threads), path
        return self._model

    def close(self) -> None:
        if self._base_ctx is not None:
            self._base_ctx.close()
            self._base_ctx = None
        if self._model is not None:
            self._model.close()
            self._model = None

    def context(self, scheme, n_ctx: int):
        k, v = cache_types(scheme)
        check_types(k, v, self.flash_attn)
        return self._model.context(
            type_k=k,
            type_v=v,
            flash_attn=self.flash_attn,
            n_ctx=self.n_ctx or n_ctx,
            n_batch=self.n_batch,
            n_threads=self.n_threads,
        )

    def check_model(self, lm) -> None:
        gguf_path(lm.name)

    def check_eval(self, eval_name: str, params: dict, request: str | None) -> None:
        """The protocol's refusals, and an lm-eval batch size other than 1 (llama.cpp decodes one request
        at a time here, so a larger batch would be recorded but not run)."""
        super().check_eval(eval_name, params, request)
        batch = (params or {}).get("batch_size")
        if request == "lmeval" and batch not in (None, 1):
            raise EvalkitError(
                f"--eval {eval_name} with batch_size {batch}: llama.cpp runs lm-eval's requests one at a time "
                "(one sequence per context): drop --lmeval-batch-size (grid key batch_size) or give 1"
            )

    def settings(self, scheme) -> dict:
        k, v = cache_types(scheme)
        return {
            "engine": "llamacpp",
            "engine_version": self.name,
            "gguf": self._path.name if self._path else None,
            "type_k": k,
            "type_v": v,
            "flash_attn": self.flash_attn,
            "n_threads": self.n_threads,
            "n_batch": self.n_batch,
        }

    # -- (a) log-probs of given tokens ------------------------------------------------------------------
    def prepare(self, request: LogprobsRequest, lm, workdir: Path) -> None:
        """The request's windows (token ids, first scored target) and the model."""
        self.windows = [(ids.tolist(), int(t0)) for ids, t0 in request.windows()]
        if self._base_ctx is not None:  # sized for another evaluation's windows
            self._base_ctx.close()
            self._base_ctx = None
        self.open(lm.name)
        self.window_ctx = max(len(ids) for ids, _ in self.windows)

    def score(self, request: LogprobsRequest, lm, scheme) -> TokenScores:
        """Per scored token: NLL under the scheme and under the f16 baseline, top-1 agreement, exact KL."""
        start = time.perf_counter()
        nll, base_nll, agree, kl = [], [], [], []

        same = cache_types(scheme) == BASELINE_TYPES  # the baseline itself: one context, zero change
        if self._base_ctx is None:
            self._base_ctx = self.context("auto", self.window_ctx)
        base_ctx = self._base_ctx
        with self.context(scheme, self.window_ctx) as ctx:
            for ids, t0 in self.windows:
                targets = np.asarray(ids[t0:], np.int64)
                lp_b, p_b = log_softmax64(base_ctx.logits(ids, first=t0 - 1)[:-1])
                lp_q = lp_b if same else log_softmax64(ctx.logits(ids, first=t0 - 1)[:-1], probs=False)[0]
                rows = np.arange(len(targets))
                nll.append(-lp_q[rows, targets])
                base_nll.append(-lp_b[rows, targets])
                agree.append(lp_q.argmax(-1) == lp_b.argmax(-1))
                kl.append(np.maximum((p_b * (lp_b - lp_q)).sum(-1), 0.0))
            info = {**self.settings(scheme), **ctx.settings()}
        kl_t = torch.from_numpy(np.concatenate(kl))
        zeros = torch.zeros_like(kl_t)
        return TokenScores(
            nll=torch.from_numpy(np.concatenate(nll)),
            base_nll=torch.from_numpy(np.concatenate(base_nll)),
            agree=torch.from_numpy(np.concatenate(agree)),
            kl=kl_t,
            kl_lower=kl_t,
            kl_var=zeros,
            kl_tail_mass=zeros,
            info={**info, "kl_method": KL_METHOD, "engine_score_seconds": round(time.perf_counter() - start, 3)},
        )

    # -- (b) decode: greedy generation and teacher-forced steps, exact per-step KL ---------------------------
    def prepare_decode(self, request: DecodeRequest, lm, workdir: Path) -> torch.Tensor:
        """The f16 baseline's greedy continuation of the request's N prompts (T tokens each, EOS not
        stopping it, as the eval's loop generates exactly T); returns the rows with it in N..2N-1."""
        self.open(lm.name)
        self.decode_ctx = request.length + 1
        with self.context("auto", self.decode_ctx) as ctx:
            self.decode_generated = self._greedy(ctx, request)
        inputs = request.inputs.clone()
        inputs[request.sequences :, request.prefill :] = torch.from_numpy(self.decode_generated)
        return inputs

    @staticmethod
    def _greedy(ctx, request: DecodeRequest) -> np.ndarray:
        prompts = request.inputs[: request.sequences, : request.prefill].tolist()
        return np.array([ctx.generate(p, request.decode, eos_ids=()) for p in prompts], dtype=np.int64)

    def decode_positions(self, request: DecodeRequest, lm, scheme) -> dict:
        """Per row and decode position, through llama.cpp's decode path (one ``llama_decode`` per token
        after the prompt, :meth:`~evalkit.engines.llamacpp.context.LlamaCppContext.step_logits`) under the
        f16 baseline and under the scheme: exact KL, NLL of the row's token and top-1 agreement on the
        teacher-forced rows; on the free-running rows the scheme's own greedy tokens against the
        baseline's (the first divergence is the real generations')."""
        start = time.perf_counter()
        rows, steps = request.shape
        n, prefill = request.sequences, request.prefill
        out = {k: np.empty((rows, steps)) for k in ("kl", "nll", "base_nll")}
        agree = np.empty((rows, steps), dtype=bool)
        with self.context("auto", self.decode_ctx) as base_ctx, self.context(scheme, self.decode_ctx) as ctx:
            own = self._greedy(ctx, request)
            for r, row in enumerate(request.inputs.tolist()):
                prompt, teacher = row[:prefill], row[prefill:]
                lp_b, p_b = log_softmax64(base_ctx.step_logits(prompt, teacher))
                lp_q = log_softmax64(ctx.step_logits(prompt, teacher), probs=False)[0]
                cols = np.arange(steps)
                out["nll"][r], out["base_nll"][r] = -lp_q[cols, teacher], -lp_b[cols, teacher]
                out["kl"][r] = np.maximum((p_b * (lp_b - lp_q)).sum(-1), 0.0)
                agree[r] = lp_q.argmax(-1) == lp_b.argmax(-1)
            agree[n:] = own == self.decode_generated
            info = {**self.settings(scheme), **ctx.settings()}
        zeros = np.zeros((rows, steps))
        return {
            **out,
            "kl_lower": out["kl"],
            "kl_var": zeros,
            "tail_mass": zeros,
            "agree": agree,
            "info": {
                **info,
                "kl_method": KL_METHOD,
                "free_running": "llama.cpp's own greedy generation under the scheme against under the f16 cache",
                "teacher_forced": "llama.cpp's decode path, one llama_decode per token after the prompt",
                "engine_score_seconds": round(time.perf_counter() - start, 3),
            },
        }

    # -- (c) greedy generation --------------------------------------------------------------------------
    def generate(self, lm, scheme, batches, progress=None, on_batch=None) -> list[list[str]]:
        from evalkit.evals.retrieval.generate import texts_per_batch

        batches = list(batches)
        if not batches:
            return []
        self.open(lm.name)
        eos = [i for i in [getattr(lm.tokenizer, "eos_token_id", None)] if i is not None]
        longest = max(len(p) + max_new for prompts, max_new in batches for p in prompts)
        with self.context(scheme, longest + 1) as ctx:

            def generate(prompts, max_new):
                outs = [ctx.generate(list(p), max_new, eos) for p in prompts]
                return lm.tokenizer.batch_decode(outs, skip_special_tokens=True)

            return texts_per_batch(generate, batches, progress, on_batch)

    # -- (d) lm-eval -----------------------------------------------------------------------------------
    def prepare_lmeval(self, request: LmevalRequest, lm) -> None:
        self.open(lm.name)

    @contextlib.contextmanager
    def lmeval_model(self, request: LmevalRequest, lm, scheme):
        """lm-eval's LM over llama.cpp for ``scheme`` (None: the f16 baseline), HFLM's text rules on the
        evaluation's tokenizer (:mod:`evalkit.engines.llamacpp.lmeval`)."""
        from evalkit.engines.llamacpp.lmeval import llamacpp_lm_class

        self.open(lm.name)
        if scheme is not None:
            check_types(*cache_types(scheme), self.flash_attn)
        max_length = lm.max_length or self._model.n_ctx_train
        yield llamacpp_lm_class()(self, scheme, lm.tokenizer, max_length)


def from_options(options: dict) -> LlamaCppBackend:
    """The backend for a run's engine options (the engine declaration's ``backend`` hook)."""
    return LlamaCppBackend(**{**DEFAULTS, **options})
