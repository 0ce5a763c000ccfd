"""Perplexity, KL(baseline || scheme) and top-1 agreement per KV scheme, with paired intervals.

Protocol. The corpus is tokenized once (:mod:`evalkit.data.corpus`) and cut into windows of ``window``
input tokens, optionally starting with BOS (default: on when the tokenizer itself adds BOS). A
window holds ``C = window - bos`` corpus tokens and the next window starts ``min(stride, C)``
tokens later; the last window is aligned to the corpus end. Every token is scored exactly once,
by the first window that reaches it, which is the one giving it the most context (the standard
strided-perplexity protocol; ``stride == window`` gives disjoint windows, and without BOS the
first token of each disjoint window is predicted by nothing and so not scored).

Backends. ``prepare()`` builds one plain :class:`~evalkit.evals.protocol.LogprobsRequest` (the corpus
ids, the window plan, BOS, batch size, and the corpus hash and protocol that key a cached baseline)
and asks the eval's backend for the log-probs of its windows (:class:`TokenScores` per scored token,
against the backend's own unquantized run). The default, the emulation
(:mod:`evalkit.evals.emulation.perplexity`), is the transformers model through evalkit's storage cache
against a cached baseline: per scored token its NLL, argmax and a 2 KB summary of its next-token
distribution (:mod:`evalkit.evals.kl_topk`), so KL is an estimate with a proven lower bound, whatever
the vocabulary. An engine (``evalkit run --engine vllm`` or ``llamacpp``) is another: its baseline is
its own unquantized run, and where it returns only a top-k its KL row is the proven lower bound,
named ``kl_lower_bound`` (``kl_bound: true`` in the row's info) instead of ``kl_mean``.

Statistics (:mod:`evalkit.evals.stats`): 95 % intervals over windows (``interval``: the studentized
jackknife ``t`` by default, whose coverage holds at 4 windows, or the percentile ``bootstrap``) for
perplexity, its change, KL and agreement, and a paired t test p-value over per-window mean NLL. With
``float_noise_seeds`` the row's value is the mean over the float realisations (the unperturbed run and
the perturbed-weight reruns; :mod:`evalkit.evals.perplexity.float_spread`), the unperturbed run's value
kept in its info. The overall Δppl row keeps its per-window NLL-change sums of every realisation in
``info["units"]``, so a report can form the *paired* interval of the difference between two schemes
(:func:`evalkit.evals.perplexity.float_spread.paired_difference`). Rows repeat for position buckets within the window
(target index 0-127, 128-511, 512-2047, ... powers of 4 up to the window) with ``labels={"bucket":..}``.

Chunked prefill. A scheme whose engine attends a first-chunk prefill from the raw K/V (vLLM TurboQuant,
UltraQuant) reads nothing quantized in one forward per window: over windows of at most ``prefill_chunk``
tokens (the engine's ``max_num_batched_tokens``, default 8192) its rows are "not measured". Over longer
windows a backend that models it (the emulation) prefills each window chunk by chunk, as the engine does,
every later chunk reading the earlier ones through the stored bytes (:mod:`evalkit.integration.chunked`);
the rows are measured and say so (``info["prefill"]``: "chunked prefill, chunk N"). Every other scheme keeps
the one forward: it reads back everything it stores either way.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from evalkit.data.corpus import load_corpus, tokenize_corpus, tokenizer_adds_bos
from evalkit.errors import EvalkitError
from evalkit.evals.backend import LogprobsRequest, TokenScores, backend_of, stamp
from evalkit.evals.base import Column, Criterion, Evaluation, MetricRow, ReportSpec, register_eval
from evalkit.evals.float_noise import DEFAULT_ULPS
from evalkit.evals.perplexity.float_spread import ci_text, combine, units_info
from evalkit.evals.perplexity.params import PerplexityParams  # noqa: F401 (re-exported: it was declared here)
from evalkit.evals.perplexity.windows import plan_windows, position_bucket_edges  # noqa: F401 (re-exported)
from evalkit.evals.perplexity.workload import perplexity_work
from evalkit.evals.stats import PVALUE_TEST, paired_pvalue, unit_interval

KL_QUANTILES = {"kl_p50": 50.0, "kl_p99": 99.0, "kl_p999": 99.9, "kl_max": 100.0}  # llama.cpp's KL summary


def kl_quantile_rows(kl: np.ndarray, info: dict) -> list[MetricRow]:
    """Median, 99th and 99.9th percentiles and maximum of the per-token KL over all scored tokens
    (numpy's linear interpolation between order statistics), as llama.cpp's KL tool reports them:
    the mean hides whether a scheme's error is spread thin or concentrated in a few tokens. No
    interval: the bootstrap over windows is for means, and a maximum has none worth giving."""
    values = np.percentile(kl, list(KL_QUANTILES.values()))
    q_info = {**info, "kl_quantile": "per-token KL estimate over all scored tokens, numpy linear percentile"}
    return [MetricRow(name, float(v), labels={}, info=q_info) for name, v in zip(KL_QUANTILES, values)]


@register_eval("perplexity")
class PerplexityEval(Evaluation):
    grows = "max_windows"
    request = "logprobs"
    Params = PerplexityParams
    summary_metrics = ("ppl", "ppl_delta", "ppl_delta_rel", "kl_mean", "top1_agreement", "p_value", "n_tokens")
    report = ReportSpec(
        columns=(
            Column("ppl", heading="ppl", fmt=".2f", when="ppl"),
            Column("ppl_delta"),
            Column(
                "ppl_delta_rel",
                heading="Δppl [95% CI]",
                fmt="+.2f",
                scale=100,
                unit="%",
                interval=True,
                baseline="baseline",
                when="ppl",
            ),
            Column("kl_mean", heading="KL (nats)", fmt=".3g", baseline="", when="ppl"),
            Column("top1_agreement", heading="top-1 %", fmt=".1f", scale=100, baseline="", when="ppl"),
            Column("dp_mean", heading="Δp %", fmt="+.2f", scale=100, baseline=""),
            Column("p_value"),
            *(
                Column(key, heading=title, fmt=".3g", baseline="", group="kl")  # per-token KL percentiles
                for key, title in (
                    ("kl_p50", "KL p50"),
                    ("kl_p99", "KL p99"),
                    ("kl_p999", "KL p99.9"),
                    ("kl_max", "KL max"),
                )
            ),
        ),
        frames=("evalkit.evals.perplexity.report:float_noise_frame",),
        notes=("evalkit.evals.perplexity.report:notes",),
        plots=("positions",),
        criteria=(
            Criterion(
                "Δppl", "ppl_delta_rel", "max_ppl_rel", True, "|Δppl|", transform="abs", signed=True, required=True
            ),
            Criterion("KL", "kl_mean", "max_kl", True, "mean KL", unit=" nats", digits=4),
            Criterion("Δp", "dp_mean", "max_dp_drop", True, "mean Δp drop", transform="neg", signed=True),
            Criterion("top-1", "top1_agreement", "min_top1", False, "top-1"),
        ),
        order=10,
    )

    def __init__(self, params: dict[str, Any] | None = None, backend=None):
        super().__init__(params)
        self.backend = backend  # None: a new emulation backend of its own (evalkit.evals.backend.backend_of)

    @classmethod
    def workload(cls, params: dict[str, Any], facts, device: str = "cpu"):
        return perplexity_work(params, facts)

    # ---- baseline --------------------------------------------------------------------------
    def prepare(self, lm, workdir: Path) -> None:
        p, tok = self.params, lm.tokenizer
        if lm.max_length is not None and p["window"] > lm.max_length:
            raise EvalkitError(
                f"window {p['window']} is longer than the model's maximum {lm.max_length}: use --perplexity-window {lm.max_length} or less"
            )
        bos = tokenizer_adds_bos(tok) if p["bos"] is None else p["bos"]
        if bos and tok.bos_token_id is None:
            raise EvalkitError(
                "--perplexity-bos was asked for but the tokenizer has no BOS token: use --no-perplexity-bos"
            )
        corpus = load_corpus(p["corpus"])
        ids = tokenize_corpus(corpus, tok, Path(workdir))
        if p["max_tokens"] is not None:
            ids = ids[: p["max_tokens"]]
        self.ids, self.bos, self.corpus, self.tokenizer_bos = ids, bos, corpus, tok.bos_token_id
        self.plan = plan_windows(len(ids), p["window"], p["stride"], bos, p["max_windows"])
        self.targets = [(p["window"] - t0) for _, t0 in self.plan]
        self.offsets = np.concatenate([[0], np.cumsum(self.targets)]).astype(np.int64)
        # the baseline-deciding fields, BOS resolved, and the stride the windows really advance by
        self.protocol = {
            **PerplexityParams(**p).protocol(),
            "effective_stride": min(p["stride"], p["window"] - bos),
            "bos": bos,
        }
        backend = backend_of(self)
        if p["float_noise_seeds"] and not backend.capabilities.float_noise:
            raise EvalkitError(
                f"--perplexity-float-noise-seeds reruns the emulation on perturbed weight copies; backend "
                f"{backend.name} cannot: drop it (0) or use --engine emulation"
            )
        self.request = LogprobsRequest(
            corpus_ids=ids,
            plan=tuple(self.plan),
            window=p["window"],
            bos_id=self.tokenizer_bos if bos else None,
            batch_size=p["batch_size"],
            cache_key={"corpus": corpus.sha256, "protocol": self.protocol},
            corpus_name=corpus.name,
            float_noise_seeds=p["float_noise_seeds"],
            prefill_chunk=p["prefill_chunk"],
        )
        backend.prepare(self.request, lm, Path(workdir))

    def canonical_params(self) -> dict[str, Any]:
        """The parameters, without ``float_noise_seeds`` while it is off (0) and without ``prefill_chunk``
        while no window is longer than it (then it decides no number): runs made before either existed keep their ids."""
        p = self.params
        return {
            k: v
            for k, v in p.items()
            if not (k == "float_noise_seeds" and not v) and not (k == "prefill_chunk" and p["window"] <= v)
        }

    def window_inputs(self):
        """Each window's input ids (BOS first where used) and the index of its first scored target."""
        self.require_prepared(hasattr(self, "request"))
        return self.request.windows()

    # ---- one scheme ------------------------------------------------------------------------
    def evaluate(self, lm, scheme, artifacts: Path | None = None) -> list[MetricRow]:
        from evalkit.integration.chunked import chunked_prefill_applies
        from evalkit.kv.scheme import one_forward_reads_raw

        chunked = chunked_prefill_applies(scheme, self.params["window"], self.params["prefill_chunk"])
        if one_forward_reads_raw(scheme) and not (chunked and backend_of(self).capabilities.cache_reuse):
            return stamp(self._not_measured_rows(scheme), backend_of(self))
        scores = self.token_scores(lm, scheme)
        if artifacts is not None:
            self._write_windows(Path(artifacts), scores)
        noise = backend_of(self).float_noise_scores(self.request, scheme)
        return stamp(self._rows(scores, noise), backend_of(self))

    def _not_measured_rows(self, scheme) -> list[MetricRow]:
        """A scheme whose engine attends each window's one forward from the raw K/V: every metric "not
        measured by this protocol" (no value, no interval), never a measured 0; the windows are not run."""
        self.require_prepared(hasattr(self, "request"))
        p, backend = self.params, backend_of(self)
        if not backend.capabilities.cache_reuse:
            how = f"backend {backend.capabilities.name} does not model chunked prefill: use --engine emulation"
        else:
            how = (
                f"a window of {p['window']} tokens fits one prefill chunk ({p['prefill_chunk']}): a window longer than "
                f"--perplexity-prefill-chunk is measured through chunked prefill"
            )
        why = (
            f"not measured by this protocol: {scheme} attends a sequence's first write (here each window's one "
            f"forward) from the raw K/V, so no quantized value is read ({how}); the decode evaluation measures its cache"
        )
        info = dict(protocol=self.protocol, corpus=self.corpus.name, n_windows=len(self.plan), not_measured=why)
        names = ("ppl", "ppl_delta", "ppl_delta_rel", "kl_mean", "top1_agreement", "p_value", "dp_mean")
        return [MetricRow(name, math.nan, labels={}, info=info) for name in names]

    def token_scores(self, lm, scheme) -> TokenScores:
        """``scheme``'s numbers per scored token, from the eval's backend (against its own baseline)."""
        self.require_prepared(hasattr(self, "request"))
        return backend_of(self).score(self.request, lm, scheme)

    def _write_windows(self, folder: Path, scores: TokenScores) -> None:
        """Per-window sums as ``perplexity_windows.csv`` (what the intervals resample)."""
        import pandas as pd

        win = np.repeat(np.arange(len(self.plan)), self.targets)
        kl = scores.kl if scores.kl is not None else scores.kl_lower
        sums = {
            name: np.bincount(win, weights=x.astype(np.float64), minlength=len(self.plan))
            for name, x in (
                ("nll_sum", scores.nll.numpy()),
                ("base_nll_sum", scores.base_nll.double().numpy()),
                ("kl_sum", kl.numpy()),
                ("top1_agree", scores.agree.numpy()),
            )
        }
        folder.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(
            {
                "start": [s for s, _ in self.plan],
                "first_target": [t for _, t in self.plan],
                "n_tokens": self.targets,
                **sums,
            }
        ).to_csv(folder / "perplexity_windows.csv", index_label="window")

    def _rows(self, scores: TokenScores, noise: list[tuple[int, TokenScores]] = ()) -> list[MetricRow]:
        """The rows of one scheme: every metric overall and per position bucket, then the KL percentiles.
        ``noise``: (seed, scores) of the perturbed-weight reruns, whose spread widens the intervals."""
        p, w = self.params, len(self.plan)
        pos = torch.cat([torch.arange(t0, p["window"]) for _, t0 in self.plan]).numpy()
        win = np.repeat(np.arange(w), self.targets)
        info = dict(
            protocol=self.protocol,
            corpus=self.corpus.name,
            corpus_sha256=self.corpus.sha256,
            n_windows=w,
            bootstrap_samples=p["bootstrap_samples"],
            seed=p["seed"],
            ci=ci_text(p["interval"], len(noise)),
            p_value_test=PVALUE_TEST,
            **scores.info,
        )
        tail_mass = scores.kl_tail_mass.numpy()
        lower = scores.kl_lower.numpy()
        # only a bound: the row is named for it; with an estimate, kl_mean and the bound in its info
        kl_metric, kl = ("kl_mean", scores.kl.numpy()) if scores.kl is not None else ("kl_lower_bound", lower)
        edges = position_bucket_edges(p["window"])
        groups = [({}, np.ones(len(pos), bool))] + [
            ({"bucket": f"{a}-{b - 1}"}, (pos >= a) & (pos < b)) for a, b in zip(edges, edges[1:])
        ]
        rows = []
        for labels, sel in groups:
            if sel.any():
                kl_info = {**info, "kl_tail_mass": float(tail_mass[sel].mean())}
                if scores.kl is not None:
                    kl_info = {
                        **info,
                        "kl_lower_bound": float(lower[sel].mean()),
                        **kl_info,
                        "kl_sampling_se": float(math.sqrt(scores.kl_var.numpy()[sel].sum()) / sel.sum()),
                    }
                reruns = [(seed, self._token_arrays(s, kl_metric, sel)) for seed, s in noise]
                rows += self._group_rows(
                    labels,
                    win[sel],
                    w,
                    *self._token_arrays(scores, kl_metric, sel),
                    info,
                    kl_info,
                    kl_metric,
                    reruns,
                )
        if scores.kl is not None:
            rows += kl_quantile_rows(kl, info)
        return rows

    @staticmethod
    def _token_arrays(scores: TokenScores, kl_metric: str, sel) -> tuple:
        """(nll, baseline nll, KL, agreement) of the tokens ``sel``, as float64/bool numpy arrays."""
        kl = scores.kl if kl_metric == "kl_mean" else scores.kl_lower
        return (
            scores.nll.numpy()[sel],
            scores.base_nll.double().numpy()[sel],
            kl.numpy()[sel],
            scores.agree.numpy()[sel],
        )

    def _group_rows(
        self, labels, win, w, nll, base, kl, agree, info, kl_info, kl_metric="kl_mean", reruns=()
    ) -> list[MetricRow]:
        """Metric rows for one set of tokens, aggregated to per-window sums for the bootstrap; with
        ``reruns`` ((seed, (nll, base, kl, agree)) of perturbed-weight copies), intervals widened by
        their float spread (:func:`evalkit.evals.perplexity.float_spread.combine`)."""

        def window_sums(nll, base, kl, agree):
            per_token = (np.ones(len(win)), nll, base, kl, agree, np.exp(-nll) - np.exp(-base))
            sums = [np.bincount(win, weights=x.astype(np.float64), minlength=w) for x in per_token]
            keep = sums[0] > 0
            return [s[keep] for s in sums]

        metric_fns = {
            "ppl": lambda c, a, b, k, g, d: np.exp(a.sum(-1) / c.sum(-1)),
            "ppl_delta": lambda c, a, b, k, g, d: np.exp(a.sum(-1) / c.sum(-1)) - np.exp(b.sum(-1) / c.sum(-1)),
            "ppl_delta_rel": lambda c, a, b, k, g, d: np.exp((a.sum(-1) - b.sum(-1)) / c.sum(-1)) - 1,
            kl_metric: lambda c, a, b, k, g, d: k.sum(-1) / c.sum(-1),
            "top1_agreement": lambda c, a, b, k, g, d: g.sum(-1) / c.sum(-1),
            # llama.cpp's "mean change in correct-token probability": p_scheme - p_baseline per token
            "dp_mean": lambda c, a, b, k, g, d: d.sum(-1) / c.sum(-1),
        }
        arrays = window_sums(nll, base, kl, agree)
        rerun_arrays = [(seed, window_sums(*r)) for seed, r in reruns]
        cnt, s_nll, s_base = arrays[:3]
        rows = []
        p = self.params
        for metric, fn in metric_fns.items():
            value = float(fn(*arrays))
            low, high = unit_interval(
                fn, arrays, method=p["interval"], n_resamples=p["bootstrap_samples"], seed=p["seed"]
            )
            ci = (None, None) if math.isnan(low) else (low, high)
            row_info = kl_info if metric == kl_metric else info
            if rerun_arrays:
                values = [float(fn(*a)) for _, a in rerun_arrays]
                value, ci, spread = combine(value, ci, values, [seed for seed, _ in rerun_arrays], DEFAULT_ULPS)
                row_info = {**row_info, "ci_sampling": list(spread.pop("ci_sampling")), "float_noise": spread}
            if metric == "ppl_delta_rel" and not labels:  # what a paired comparison of two rows needs
                row_info = {**row_info, "units": units_info(cnt, s_nll - s_base, rerun_arrays)}
            rows.append(MetricRow(metric, value, *ci, labels=dict(labels), info=row_info))
            if metric == "top1_agreement":  # p_value and n_tokens keep their place before dp_mean
                rows.append(
                    MetricRow("p_value", paired_pvalue(s_nll / cnt, s_base / cnt), labels=dict(labels), info=info)
                )
                rows.append(MetricRow("n_tokens", float(cnt.sum()), labels=dict(labels), info=info))
        return rows
