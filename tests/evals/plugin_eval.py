"""A test-only evaluation defined entirely inside the tests: the proof that an evaluation is one unit.

``echo`` scores one short text, teacher-forced, under each scheme: its mean next-token NLL and
the change from the baseline's (computed once in ``prepare``). Everything the harness needs comes
from this file: its parameters (``--echo-text``, ``--echo-max-tokens``, grid keys ``text`` and
``max_tokens``), its ``--dry-run`` size, its report column (``echo Δnll``) and its plot
(:func:`figures`). No package file names it: it is loaded with the documented plugin mechanism,
``EVALKIT_EVALS=tests.evals.plugin_eval`` (see :mod:`evalkit.evals.base`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from evalkit.evals.base import Column, Evaluation, MetricRow, Params, ReportSpec, param, register_eval

MODULE = "tests.evals.plugin_eval"
TEXT = (
    "The quick brown fox jumps over the lazy dog. Python's documentation describes the language "
    "reference, the library, and how a statement is executed."
)


@dataclass(frozen=True)
class EchoParams(Params):
    """The echo evaluation's parameters (flags ``--echo-<field>``)."""

    text: str = param(TEXT, "the text scored (default: a fixed pangram and sentence)")
    max_tokens: int = param(16, "tokens of the text scored (default 16)", low=4, baseline=True)


@register_eval("echo")
class EchoEval(Evaluation):
    Params = EchoParams
    summary_metrics = ("nll", "nll_delta")
    report = ReportSpec(
        columns=(Column("nll_delta", key="echo_nll_delta", heading="echo Δnll", fmt="+.4f", baseline="baseline"),),
        plots=(f"{MODULE}:figures",),
        order=90,
    )

    @classmethod
    def workload(cls, params, facts, device: str = "cpu"):
        from evalkit.evals.sizing import ROW_BYTES, Forwards, Work

        n = params["max_tokens"]
        one = (Forwards(1, 1, n),)  # one forward of the text, under the scheme (and once for the baseline)
        return Work("echo", n, one, baseline=one, store_bytes=2 * ROW_BYTES)

    def _nll(self, lm) -> torch.Tensor:
        with torch.no_grad():
            lp = torch.log_softmax(lm.model(self.ids.to(lm.device)).logits[0, :-1].double(), -1)
        return -lp.gather(-1, self.ids[0, 1:, None].to(lm.device))[:, 0].cpu()

    def prepare(self, lm, workdir: Path) -> None:
        self.ids = torch.tensor([lm.tokenizer(self.params["text"])["input_ids"][: self.params["max_tokens"]]])
        self.base = self._nll(lm)

    def evaluate(self, lm, scheme, artifacts: Path | None = None) -> list[MetricRow]:
        from evalkit.integration.install import quantized_kv

        self.require_prepared(hasattr(self, "base"))
        with quantized_kv(lm.model, scheme):
            nll = self._nll(lm)
        info = {"tokens": int(self.ids.shape[1])}
        return [
            MetricRow("nll", float(nll.mean()), info=info),
            MetricRow("nll_delta", float((nll - self.base).mean()), info=info),
        ]


def figures(results, style=None) -> dict:
    """One bar per scheme of its Δnll, one figure per model (the report saves them as PNG and SVG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = results.rows[results.rows["metric"] == "nll_delta"]
    out = {}
    for model, g in df.groupby("model", sort=False):
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.bar(range(len(g)), g["value"])
        ax.set_xticks(range(len(g)), list(g["scheme"]), rotation=30, fontsize=6)
        ax.set_ylabel("Δ NLL (nats)")
        ax.set_title(f"{model}: echo Δ NLL by scheme", fontsize=8)
        out[f"echo_{len(out)}"] = fig
    return out
