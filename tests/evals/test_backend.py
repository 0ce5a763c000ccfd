"""The backend seam (evalkit.evals.backend): evaluations ask a backend, rows say which one answered.

A test backend with known answers shows each evaluation computing its rows from what the backend
returns (nothing else), naming a bound-only KL for what it is, and stamping ``info["backend"]``;
a backend that does not serve a request, or per-step distributions, is refused in one line before
any work. The emulation backend's identity scheme is bit for bit the plain model: the bf16 scheme
through the storage cache against the eval's unhooked baseline, and that baseline against the
model's own forward.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from evalkit.data.corpus import load_corpus
from evalkit.errors import EvalkitError
from evalkit.evals.backend import (
    Backend,
    Capabilities,
    DecodeRequest,
    LogprobsRequest,
    TokenScores,
    backend_of,
    use_backend,
)
from evalkit.evals.base import get_eval
from evalkit.evals.emulation.backend import EmulationBackend
from evalkit.kv.scheme import Scheme

PPL = dict(window=64, stride=64, max_windows=3, bootstrap_samples=200)
DECODE = dict(prefill=16, decode=8, sequences=2, buckets=2, bootstrap_samples=200)


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    from evalkit.models.loading import load_model

    return load_model(str(tiny_llama_dir))


@pytest.fixture(scope="module")
def prose(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "prose.txt"
    path.write_text(load_corpus("embedded").text[:20_000], encoding="utf-8")
    return f"file:{path}"


class KnownBackend(Backend):
    """Answers every scheme with fixed numbers: NLL 0.1 above its baseline, KL bound 0.05, top-1 right
    on every other token; decode positions with a known first divergence."""

    capabilities = Capabilities("test-backend", kl="bound", requests=frozenset({"logprobs", "decode"}))

    def prepare(self, request: LogprobsRequest, lm, workdir):
        self.prepared = True

    def score(self, request: LogprobsRequest, lm, scheme):
        n = request.n_scored
        base = torch.full((n,), 2.0, dtype=torch.float64)
        return TokenScores(
            nll=base + 0.1,
            base_nll=base,
            agree=torch.arange(n) % 2 == 0,
            kl=None,
            kl_lower=torch.full((n,), 0.05, dtype=torch.float64),
            kl_var=None,
            kl_tail_mass=torch.full((n,), 0.2, dtype=torch.float64),
            info={"from": "known"},
        )

    def prepare_decode(self, request: DecodeRequest, lm, workdir):
        self.decode_prepared = True
        return request.inputs  # teacher tokens as the greedy rows: what a backend answers is the eval's to use

    def decode_positions(self, request: DecodeRequest, lm, scheme):
        rows, steps = request.shape
        agree = np.ones((rows, steps), dtype=bool)
        agree[request.sequences, 3] = False  # the first greedy row leaves the baseline at step 3, the second never
        ones = np.ones((rows, steps))
        return {
            "kl": None,
            "kl_var": None,
            "kl_lower": 0.01 * ones,
            "tail_mass": 0.5 * ones,
            "agree": agree,
            "nll": 1.5 * ones,
            "base_nll": ones,
            "info": {"from": "known"},
        }


def test_perplexity_rows_come_from_the_backend(tiny, tmp_path, prose):
    from evalkit.evals.perplexity.evaluation import PerplexityEval

    backend = KnownBackend()
    ev = use_backend(PerplexityEval({**PPL, "corpus": prose}), backend)
    assert backend_of(ev) is backend
    ev.prepare(tiny, tmp_path)
    assert backend.prepared and not (tmp_path / "perplexity").exists()  # the emulation's baseline never ran
    rows = {r.metric: r for r in ev.evaluate(tiny, Scheme()) if not r.labels}
    assert rows["ppl"].value == pytest.approx(math.exp(2.1)) and rows["ppl_delta_rel"].value == pytest.approx(
        math.exp(0.1) - 1
    )
    assert rows["top1_agreement"].value == pytest.approx(0.5, abs=1 / rows["n_tokens"].value)
    assert "kl_mean" not in rows and rows["kl_lower_bound"].value == pytest.approx(0.05)
    assert rows["kl_lower_bound"].info["kl_tail_mass"] == pytest.approx(0.2)
    assert all(r.info["backend"] == "test-backend" and r.info["from"] == "known" for r in rows.values())


def test_decode_rows_come_from_the_backend(tiny, tmp_path, prose):
    from evalkit.evals.decode.evaluation import DecodeEval

    backend = KnownBackend()
    ev = use_backend(DecodeEval({**DECODE, "corpus": prose}), backend)
    ev.prepare(tiny, tmp_path)
    assert backend.decode_prepared and not (tmp_path / "decode").exists()
    rows = {r.metric: r for r in ev.evaluate(tiny, Scheme()) if not r.labels}
    assert rows["kl_lower_bound"].value == pytest.approx(0.01) and rows["free_kl_lower_bound"].value == pytest.approx(
        0.01
    )
    assert "kl_mean" not in rows and rows["kl_lower_bound"].info["kl_bound"] is True
    assert rows["nll_delta"].value == pytest.approx(0.5) and rows["top1_agreement"].value == 1.0
    assert rows["first_divergence"].info["steps"] == [3, DECODE["decode"]]
    assert rows["identical_share"].value == 0.5
    assert {r.info["backend"] for r in rows.values()} == {"test-backend"}


def test_a_request_the_backend_does_not_serve_is_one_line():
    from evalkit.evals.lmeval.evaluation import LmEvalEval
    from evalkit.evals.retrieval.evaluation import RetrievalEval

    for ev, needle in (
        (RetrievalEval({"tasks": "passkey"}), "greedy generation"),
        (LmEvalEval({"tasks": "evalkit_mmlu4"}), "lm-eval's loglikelihood"),
    ):
        with pytest.raises(EvalkitError) as info:
            use_backend(ev, KnownBackend())
        text = str(info.value)
        assert needle in text and "test-backend" in text and "--engine emulation" in text and "\n" not in text
    with pytest.raises(EvalkitError, match="does not ask a backend"):  # an eval that computes on the emulation itself
        KnownBackend().check_eval("sensitivity", {}, None)
    EmulationBackend().check_eval("sensitivity", {}, None)  # the emulation runs every eval


def test_per_step_distributions_the_backend_cannot_return_are_refused():
    from evalkit.evals.decode.evaluation import DecodeEval

    class TokensOnly(KnownBackend):
        capabilities = Capabilities("tokens-only", step_distributions=False, requests=frozenset({"decode", "generate"}))

    with pytest.raises(EvalkitError, match="per-step next-token distributions.*tokens-only"):
        use_backend(DecodeEval(DECODE), TokensOnly())
    with pytest.raises(ValueError, match="'estimate' or 'bound'"):
        Capabilities("x", kl="exact")


def test_emulation_is_the_default_and_stamps_its_rows(tiny, tmp_path, prose):
    from evalkit.evals.perplexity.evaluation import PerplexityEval

    ev = PerplexityEval({**PPL, "corpus": prose})
    own = backend_of(ev)
    assert isinstance(own, EmulationBackend) and backend_of(ev) is own  # one of its own, kept
    other = PerplexityEval({**PPL, "corpus": prose})
    assert backend_of(other) is not own  # a backend holds its evaluation's baseline: never shared
    assert isinstance(backend_of(use_backend(ev, None)), EmulationBackend)
    ev.prepare(tiny, tmp_path)
    assert {r.info["backend"] for r in ev.evaluate(tiny, "int4/tensor/dynamic")} == {"emulation"}


def test_emulation_identity_is_bit_exact_with_the_model(tiny, tmp_path, prose):
    """bf16 through the storage cache == the unhooked baseline, bit for bit (NLL, argmax, KL 0), and
    that baseline's NLL == log_softmax of the model's own forward logits at the scored positions."""
    from evalkit.evals.perplexity.evaluation import PerplexityEval

    ev = PerplexityEval({**PPL, "corpus": prose})
    ev.prepare(tiny, tmp_path)
    s = backend_of(ev).score(ev.request, tiny, Scheme())
    assert (
        torch.equal(s.nll, s.base_nll)
        and bool(s.agree.all())
        and bool((s.kl == 0).all())
        and bool((s.kl_lower == 0).all())
    )
    plain = []
    with torch.inference_mode():
        for ids, t0 in ev.window_inputs():
            logits = tiny.model(ids[None]).logits[0, t0 - 1 : -1].float()
            plain.append(-torch.log_softmax(logits, -1).gather(1, ids[t0:, None])[:, 0].double())
    plain = torch.cat(plain)
    assert plain.shape == s.base_nll.shape
    assert float((plain - s.base_nll).abs().max()) <= 1e-6 * float(plain.abs().max())  # the head runs in chunks


def test_emulation_decode_identity_is_bit_exact(tiny, tmp_path, prose):
    from evalkit.evals.decode.evaluation import DecodeEval

    ev = DecodeEval({**DECODE, "corpus": prose})
    ev.prepare(tiny, tmp_path)
    pos = backend_of(ev).decode_positions(ev.request, tiny, Scheme())
    assert np.array_equal(pos["nll"], pos["base_nll"]) and pos["agree"].all() and (pos["kl"] == 0).all()


def test_the_refusal_reads_the_evaluations_own_declaration():
    """No list of evaluation names: an evaluation (here a test-only subclass, registered nowhere) declares the
    request it asks for, and a backend accepts or refuses it by that declaration alone."""
    from evalkit.evals.retrieval.evaluation import RetrievalEval

    class ScoredRetrieval(RetrievalEval):
        request = "logprobs"  # a variant that asks for log-probs: the test backend serves those

    class OwnNumbers(RetrievalEval):
        request = None  # computes on the emulation itself

    assert use_backend(ScoredRetrieval({"tasks": "passkey"}), KnownBackend()).backend.name == "test-backend"
    with pytest.raises(EvalkitError, match="greedy generation"):
        use_backend(RetrievalEval({"tasks": "passkey"}), KnownBackend())
    with pytest.raises(EvalkitError, match="does not ask a backend"):
        use_backend(OwnNumbers({"tasks": "passkey"}), KnownBackend())
    assert {e: get_eval(e).request for e in ("perplexity", "decode", "retrieval", "lmeval")} == {
        "perplexity": "logprobs",
        "decode": "decode",
        "retrieval": "generate",
        "lmeval": "lmeval",
    }
