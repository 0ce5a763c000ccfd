"""llama.cpp as an evaluation backend (:mod:`evalkit.evals.backend`'s interface).

Perplexity (request (a)): every window is decoded by llama.cpp twice, once with its f16 cache (the
engine's baseline, flash attention as for the scheme) and once with the scheme's cache types, each in
its own context; llama.cpp returns the full vocabulary's logits at every position
(:meth:`~evalkit.engines.llamacpp.runtime.LlamaCppContext.logits`), so NLL, top-1 agreement and
KL(baseline || scheme) are exact per token (``kl_method: exact``), not a top-k bound. Log-softmax and
KL are computed here in float64 from llama.cpp's float32 logits.

Retrieval (request (b), greedy texts): llama.cpp's greedy generation through the scheme's cache,
decoded with the evaluation's tokenizer (the GGUF's own vocabulary). The teacher-forced decode
evaluation and lm-eval are not served (refused in one line: use the emulation or vLLM for them).

The model is a GGUF file: the embedded model's (``embedded_gguf``), a ``.gguf`` path, or a folder
holding exactly one (:func:`gguf_path`). The evaluation's tokenizer and windows come from the
transformers model evalkit loads from the same file, so both see the same token ids.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from evalkit.errors import EvalkitError
from evalkit.evals.backend import Backend, Capabilities, TokenScores

KL_METHOD = "exact: full-vocabulary log-softmax of llama.cpp's logits, float64"
SCHEMES = "llamacpp:<k>[/<v>] (llama.cpp's cache types) and the f16 baseline"


def gguf_path(name: str) -> Path:
    """The GGUF file llama.cpp loads for model ``name``: the embedded model's, a ``.gguf`` file, or the
    one ``.gguf`` in a folder; EvalkitError (one line) otherwise."""
    from evalkit.models.loading import embedded_gguf, embedded_name

    embedded = embedded_name(name)
    if embedded:
        return embedded_gguf(embedded)
    p = Path(name).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return p
    found = sorted(p.glob("*.gguf")) if p.is_dir() else []
    if len(found) == 1:
        return found[0]
    what = f"{len(found)} .gguf files" if found else "no .gguf file"
    raise EvalkitError(
        f"engine llamacpp loads a GGUF file and {name} has {what}: give the embedded model, a .gguf path "
        "or a folder holding exactly one"
    )


def log_softmax64(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise log-softmax in float64 of float32 logits, and the probabilities (computed in place: two
    [rows, vocab] float64 arrays in all)."""
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    p = np.exp(x)
    total = p.sum(axis=-1, keepdims=True)
    x -= np.log(total)
    p /= total
    return x, p


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
            step_distributions=False,
            requests=frozenset({"logprobs", "generate"}),
            schemes=SCHEMES,
        )
        self._model = None
        self._path = None
        self._base_ctx = None  # the f16 baseline's context, kept open across the schemes of a prepared eval

    # -- the model and its contexts -------------------------------------------------------------------
    def open(self, name: str):
        """The llama.cpp model for evalkit model ``name`` (loaded once per backend)."""
        from evalkit.engines.llamacpp.runtime import LlamaCppModel

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
        from evalkit.engines.llamacpp.engine import cache_types, check_types

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

    def settings(self, scheme) -> dict:
        from evalkit.engines.llamacpp.engine import cache_types

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
    def prepare(self, ev, lm, workdir: Path) -> None:
        """The windows' token ids (the evaluation's public ``window_inputs``) and the model."""
        self.windows = [(ids.tolist(), int(t0)) for ids, t0 in ev.window_inputs()]
        if self._base_ctx is not None:  # sized for another evaluation's windows
            self._base_ctx.close()
            self._base_ctx = None
        self.open(lm.name)
        self.window_ctx = max(len(ids) for ids, _ in self.windows)

    def score(self, ev, lm, scheme) -> TokenScores:
        """Per scored token: NLL under the scheme and under the f16 baseline, top-1 agreement, exact KL."""
        start = time.perf_counter()
        nll, base_nll, agree, kl = [], [], [], []
        from evalkit.engines.llamacpp.engine import BASELINE_TYPES, cache_types

        same = cache_types(scheme) == BASELINE_TYPES  # the baseline itself: one context, zero change
        if self._base_ctx is None:
            self._base_ctx = self.context("bf16", self.window_ctx)
        base_ctx = self._base_ctx
        with self.context(scheme, self.window_ctx) as ctx:
            for ids, t0 in self.windows:
                targets = np.asarray(ids[t0:], np.int64)
                lp_b, p_b = log_softmax64(base_ctx.logits(ids, first=t0 - 1)[:-1])
                lp_q = lp_b if same else log_softmax64(ctx.logits(ids, first=t0 - 1)[:-1])[0]
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

    # -- (b) greedy generation --------------------------------------------------------------------------
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
