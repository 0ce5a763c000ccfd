"""A small deterministic test-only Evaluation for the sweep machinery.

``ToyEval`` ("toy") scores one short text: teacher-forced next-token NLL under a scheme (with a
normal-approximation 95 % interval), the KL divergence from the baseline's next-token
distribution (the baseline computed once in ``prepare``), and the NLL of each half of the text
as labeled rows. ``sleep`` / ``marker_dir`` (not number-deciding, so not in run ids) let the crash
test kill a sweep in the middle of a run; ``fail_schemes`` makes chosen schemes raise.

Tests register it into the eval registry through the ``toy_eval`` fixture (``conftest.py``); subprocesses do the
same through :data:`SUBPROCESS_MAIN`. Nothing in the package is patched at import time.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from evalkit.errors import EvalkitError
from evalkit.evals.base import Evaluation, MetricRow

TOY_PATH = "tests.toy_eval:ToyEval"
TEXT = (
    "The quick brown fox jumps over the lazy dog. Python's documentation describes the language "
    "reference, the library, and how a statement is executed."
)

#: python -c program: register the toy eval, then run the CLI with sys.argv[1:]
SUBPROCESS_MAIN = (
    "import sys, torch; torch.set_num_threads(1); from evalkit.evals import base; "
    f"base._REGISTRY['toy'] = {TOY_PATH!r}; from evalkit.cli import main; raise SystemExit(main(sys.argv[1:]))"
)


def token_ids(tokenizer, text: str, max_tokens: int) -> torch.Tensor:
    return torch.tensor([tokenizer(text)["input_ids"][:max_tokens]])


def toy_metrics(base_logits: torch.Tensor, logits: torch.Tensor, ids: torch.Tensor) -> dict:
    """The toy numbers from two logit tensors (float64), shared with the independent check."""
    lp = torch.log_softmax(logits[0, :-1].double(), -1)
    base_lp = torch.log_softmax(base_logits[0, :-1].double(), -1)
    nll = -lp.gather(-1, ids[0, 1:, None])[:, 0]
    kl = (base_lp.exp() * (base_lp - lp)).sum(-1)
    return {"nll": nll, "kl": kl}


class ToyEval(Evaluation):
    name = "toy"
    summary_metrics = ("nll", "kl")
    prepare_calls: list = []

    @classmethod
    def validate(cls, params):
        known = {"text": TEXT, "max_tokens": 24, "sleep": 0.0, "marker_dir": None, "fail_schemes": [], "seed": 0}
        for k in params:
            if k not in known:
                raise EvalkitError(f"unknown toy parameter {k!r}: use {', '.join(known)}")
        out = {**known, **params}
        if not isinstance(out["max_tokens"], int) or out["max_tokens"] < 4:
            raise EvalkitError(f"max_tokens must be an integer >= 4, got {out['max_tokens']!r}")
        return out

    def canonical_params(self):
        return {k: v for k, v in self.params.items() if k not in ("sleep", "marker_dir")}

    def prepare(self, lm, workdir: Path) -> None:
        ToyEval.prepare_calls.append(lm.name)
        if self.params["marker_dir"]:
            d = Path(self.params["marker_dir"])
            d.mkdir(parents=True, exist_ok=True)
            (d / f"prepare-{time.time_ns()}").write_text("")
        self.ids = token_ids(lm.tokenizer, self.params["text"], self.params["max_tokens"])
        with torch.no_grad():
            self.base_logits = lm.model(self.ids).logits

    def evaluate(self, lm, scheme, artifacts=None):
        from evalkit.integration.install import quantized_kv

        if self.params["marker_dir"]:
            (Path(self.params["marker_dir"]) / f"start-{time.time_ns()}").write_text(str(scheme))
        time.sleep(self.params["sleep"])
        if str(scheme) in self.params["fail_schemes"]:
            raise RuntimeError(f"toy failure for {scheme}")
        with torch.no_grad(), quantized_kv(lm.model, scheme):
            logits = lm.model(self.ids).logits
        m = toy_metrics(self.base_logits, logits, self.ids)
        nll = m["nll"]
        half = len(nll) // 2
        sd = float(nll.std(unbiased=True)) / math.sqrt(len(nll))
        rows = [
            MetricRow("nll", float(nll.mean()), float(nll.mean()) - 1.96 * sd, float(nll.mean()) + 1.96 * sd),
            MetricRow("kl", float(m["kl"].mean()), info={"tokens": int(self.ids.shape[1])}),
            MetricRow("nll", float(nll[:half].mean()), labels={"half": "first"}),
            MetricRow("nll", float(nll[half:].mean()), labels={"half": "second"}),
        ]
        if artifacts is not None:
            artifacts.mkdir(parents=True, exist_ok=True)
            (artifacts / "toy.json").write_text(json.dumps({"scheme": str(scheme), "nll": rows[0].value}))
        return rows
