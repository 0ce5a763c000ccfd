"""The emulation as a backend (:mod:`evalkit.evals.protocol`): the transformers model with K/V through
evalkit's storage cache (:func:`evalkit.integration.install.quantized_kv`), each request's baseline
cached on disk.

* log-probs (perplexity): :mod:`evalkit.evals.emulation.perplexity`, with float-noise reruns on
  perturbed-weight copies;
* decode: :mod:`evalkit.evals.emulation.decode`;
* greedy generation (retrieval): :func:`evalkit.evals.retrieval.generate.generate_batches`;
* lm-eval: lm-eval's own ``HFLM`` around the loaded model, the scheme switched around each call.

One instance serves one prepared evaluation (it keeps that evaluation's baseline).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from evalkit.evals.emulation.decode import DecodeEmulation
from evalkit.evals.emulation.perplexity import PerplexityEmulation
from evalkit.evals.protocol import Backend, Capabilities, DecodeRequest, LmevalRequest, LogprobsRequest, TokenScores
from evalkit.integration.install import quantized_kv


class EmulationBackend(Backend):
    """The transformers model, K/V through evalkit's storage cache; each request's cached baseline."""

    capabilities = Capabilities("emulation", float_noise=True, reusable_baseline=True, cache_reuse=True)

    def __init__(self):
        self.perplexity: PerplexityEmulation | None = None
        self.decode: DecodeEmulation | None = None
        self.hflm = None

    def check_eval(self, eval_name: str, params: dict, request: str | None) -> None:
        """Every evaluation runs on the emulation."""

    # (a): the 2 KB-summary baseline and its scored chunks
    def prepare(self, request: LogprobsRequest, lm, workdir: Path) -> None:
        self.perplexity = PerplexityEmulation(request, lm, Path(workdir))

    def score(self, request: LogprobsRequest, lm, scheme) -> TokenScores:
        return self._prepared(self.perplexity, request).score(lm, scheme)

    def float_noise_scores(self, request: LogprobsRequest, scheme) -> list[tuple[int, TokenScores]]:
        return self._prepared(self.perplexity, request).noise_scores(scheme)

    # (b): the decode loop through the storage cache, the cached baseline (auto)
    def prepare_decode(self, request: DecodeRequest, lm, workdir: Path) -> torch.Tensor:
        self.decode = DecodeEmulation(request, lm, Path(workdir))
        return self.decode.inputs

    def decode_positions(self, request: DecodeRequest, lm, scheme) -> dict:
        if self.decode is None:
            raise RuntimeError("prepare_decode() the request before decode_positions()")
        return self.decode.positions(lm, scheme)

    # (c): greedy generation through the storage cache
    def generate(self, lm, scheme, batches, progress=None, on_batch=None) -> list[list[str]]:
        from evalkit.evals.retrieval.generate import generate_batches  # imports transformers: only when generating

        return generate_batches(lm, scheme, batches, progress, on_batch=on_batch)

    # (d): lm-eval's HFLM around the loaded model, the scheme switched around each call
    def prepare_lmeval(self, request: LmevalRequest, lm) -> None:
        from evalkit.evals.lmeval.adapter import make_hflm

        self.hflm = make_hflm(lm.model, lm.tokenizer, request.batch_size)

    @contextlib.contextmanager
    def lmeval_model(self, request: LmevalRequest, lm, scheme):
        if self.hflm is None:
            raise RuntimeError("prepare_lmeval() before lmeval_model()")
        path = getattr(lm, "decode_path", "eager")
        if scheme is None and path == "eager":  # the baseline: the plain model, no hook
            with self._prefix_hits(request, lm, None):
                yield self.hflm
            return
        # on the static paths the baseline generates through the identity storage cache (bit for bit the
        # plain model's static-cache decoding), as every scheme does through its own
        with quantized_kv(lm.model, "auto" if scheme is None else scheme) as session:
            with self.hflm.decode_through(session, path), self._prefix_hits(request, lm, session):
                yield self.hflm

    def _prefix_hits(self, request: LmevalRequest, lm, session):
        """With ``request.prefix_cache_hit``: the HFLM's generations served with prefix-cache hits."""
        if not request.prefix_cache_hit:
            return contextlib.nullcontext()
        if getattr(lm, "decode_path", "eager") != "eager":
            from evalkit.errors import EvalkitError

            raise EvalkitError("prefix-cache hits are modelled on the eager decode path: drop --decode-path")
        return self.hflm.prefix_cache_hits(lm.model, session)

    @staticmethod
    def _prepared(state, request):
        if state is None or state.request is not request:
            raise RuntimeError("prepare() this request before scoring it")
        return state
