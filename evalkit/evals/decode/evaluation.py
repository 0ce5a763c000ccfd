"""Decode-time fidelity: how a KV scheme's error grows while a model generates, step by step.

Every other quality number is one forward over a window (prefill). Engines spend their time
decoding: each new token attends to all codes stored so far under scales frozen at the prefill,
and adds its own. This evaluation measures that phase through the storage cache.

Protocol. ``sequences`` (N) sequences of ``L = prefill + decode`` tokens (P + T; with BOS when
the tokenizer adds it, counted in P) are cut from the corpus at evenly spaced, non-overlapping
starts. Each is prefilled with its first P tokens in one forward, then decoded one token per
forward through the storage cache (:mod:`evalkit.evals.decode.loop`). The T *decode positions*
P .. P+T-1 are the T generated tokens: position P is predicted by the prefill (the first generated
token), each later one by a decode step (T - 1 decode forwards). Two kinds of rows run as one
batch of 2N rows (``batch_size`` rows per forward):

* teacher-forced on the corpus continuation (rows 0..N-1): baseline and scheme see identical
  inputs, so K/V storage is the only difference. Per position: KL(baseline || scheme), top-1
  agreement (argmax of the logits) and the NLL difference (scheme minus baseline) of the corpus
  token;
* free-running (rows N..2N-1): the baseline decodes the same prompts greedily; the scheme is fed
  the baseline's greedy tokens. Per position: the scheme's KL at the baseline's own tokens, and
  whether its argmax still equals the baseline's token. The first disagreement is exactly the
  first token where the scheme's own greedy generation differs (:mod:`evalkit.evals.decode.divergence`,
  which also defines the censored median of that step and the share identical through T).

Baseline. The same loop under ``auto`` (identity storage, bit-identical to the plain model), run
once per model x corpus x protocol by the emulation backend (:mod:`evalkit.evals.emulation.decode`,
which :meth:`DecodeEval.prepare` asks with a plain :class:`~evalkit.evals.protocol.DecodeRequest`) and
cached under ``workdir/decode/<key>/``: per row and position its NLL and argmax and the 2 KB summary of its
next-token distribution that perplexity stores too (:mod:`evalkit.evals.kl_topk`: the top-160
tokens exactly, the tail's mass, 128 stratified tail samples; whatever the vocabulary), plus every
row's tokens (the greedy rows' continuation). A scheme's KL per position is that module's
estimate: exact on the head, a proven lower bound plus an unbiased, never-below-the-bound
estimate of the tail; its ``info`` carries the mean lower bound, the tail mass and the sampling
standard error. ``meta.json`` is written last. The key hashes the model (config, weight
fingerprint, dtype, device), tokenizer, corpus hash, the protocol (batch size included: it
decides the floats) and the torch and transformers versions. The identity scheme therefore gives
KL exactly 0 and agreement exactly 1: the same computation on the same numbers.

Buckets. Decode positions are cut into ``buckets`` equal-width groups (fewer when T is smaller),
labelled by absolute positions, ``{"bucket": "512-703"}``; rows repeat per bucket. Equal widths
(not powers of two) because error that compounds over a generation grows with the number of
decoded tokens, which should be read off a linear axis; the first bucket starts with the
prefill's own prediction.

Statistics. 95 % paired intervals over sequences (units: sequences, so the correlation of positions
within a sequence is respected; ``interval``: the studentized jackknife ``t`` by default, whose
coverage holds at 4 sequences, or the percentile ``bootstrap``) for
``kl_mean``, ``top1_agreement``, ``nll_delta`` and ``free_kl_mean``; ``first_divergence`` (median,
order-statistic interval) and ``identical_share`` (Wilson) as in :mod:`evalkit.evals.decode.divergence`.
Per-position KL, its bound and variance, and NLL are kept in float64, as perplexity keeps them. No
interval here holds float spread (perplexity's ``float_noise_seeds`` reruns on perturbed weights
have no decode counterpart): every row's ``info["ci"]`` says so (:data:`NO_FLOAT_SPREAD`), so a
report can show which intervals are sampling-only.

Memory and devices. The loop runs on the model's device; the cache grows linearly with P + T; per
step only (batch x vocabulary) logits exist (the output head runs on the last hidden state only,
also after the prefill); per-position results are (rows x T) numbers. The baseline's summaries
are written and read back one step at a time (memory maps), so nothing of size T x vocabulary is
ever held. Disk: 2N x T x 2008 bytes (P = 32k, T = 8k, N = 4: 134 MB), checked before anything is
written.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from evalkit.data.corpus import load_corpus, tokenize_corpus, tokenizer_adds_bos
from evalkit.errors import EvalkitError
from evalkit.evals.backend import DecodeRequest, backend_of, stamp
from evalkit.evals.base import Column, Evaluation, MetricRow, ReportSpec, register_eval
from evalkit.evals.decode.divergence import censored_median, first_divergence, identical_share
from evalkit.evals.decode.params import DecodeParams, sequence_starts, step_bucket_edges  # noqa: F401 (re-exported)
from evalkit.evals.decode.workload import decode_work
from evalkit.evals.stats import interval_text, unit_interval

NO_FLOAT_SPREAD = "without float spread (not measured for decode)"  # the tail of every decode row's info["ci"]


@register_eval("decode")
class DecodeEval(Evaluation):
    grows = "sequences"
    request = "decode"
    Params = DecodeParams
    summary_metrics = ("kl_mean", "top1_agreement", "nll_delta", "free_kl_mean", "first_divergence", "identical_share")
    report = ReportSpec(
        columns=(
            Column(
                "kl_mean",
                key="decode_kl_last",
                heading="decode KL (last bucket)",
                fmt=".3g",
                interval=True,
                baseline="",
                labels="last:bucket",
            ),
        ),
        frames=("evalkit.evals.decode.report:engine_frame",),
        displays=("evalkit.evals.decode.report:engine_display",),
        notes=("evalkit.evals.decode.report:notes", "evalkit.evals.decode.report:engine_notes"),
        plots=("evalkit.evals.decode.plots:decode_figures",),
        order=20,
    )

    @classmethod
    def workload(cls, params: dict[str, Any], facts, device: str = "cpu"):
        return decode_work(params, facts)

    # ---- data and baseline -----------------------------------------------------------------
    def prepare(self, lm, workdir: Path) -> None:
        p = DecodeParams(**self.params)
        tok = lm.tokenizer
        if lm.max_length is not None and p.length > lm.max_length:
            raise EvalkitError(
                f"prefill + decode = {p.prefill} + {p.decode} = {p.length} tokens is longer than the model's "
                f"maximum {lm.max_length}: lower --decode-prefill or --decode-tokens"
            )
        bos = tokenizer_adds_bos(tok) if p.bos is None else p.bos
        if bos and tok.bos_token_id is None:
            raise EvalkitError("--decode-bos was asked for but the tokenizer has no BOS token: use --no-decode-bos")
        if bos and p.prefill < 2:
            raise EvalkitError(
                "with BOS the prefill needs at least 2 tokens (BOS and one of text): use --decode-prefill 2 or more"
            )
        corpus = load_corpus(p.corpus)
        ids = tokenize_corpus(corpus, tok, Path(workdir))
        span = p.length - int(bos)
        self.starts = sequence_starts(len(ids), span, p.sequences)
        seqs = torch.stack([ids[s : s + span] for s in self.starts])
        if bos:
            seqs = torch.cat([torch.full((p.sequences, 1), tok.bos_token_id, dtype=seqs.dtype), seqs], dim=1)
        self.p, self.bos, self.corpus = p, bos, corpus
        self.inputs = torch.cat([seqs, seqs]).long()  # rows N..2N-1: the same prompts, continued greedily
        self.protocol = {**p.protocol(), "bos": bos}  # the baseline-deciding fields, BOS resolved
        self.request = DecodeRequest(
            inputs=self.inputs,
            prefill=p.prefill,
            decode=p.decode,
            batch_size=p.batch_size,
            cache_key={"corpus": corpus.sha256, "protocol": self.protocol},
            corpus_name=corpus.name,
            starts=tuple(self.starts),
        )
        self.inputs = backend_of(self).prepare_decode(self.request, lm, Path(workdir))
        self.request = dataclasses.replace(self.request, inputs=self.inputs)  # the greedy rows continued

    @property
    def _shape(self) -> tuple[int, int]:
        return 2 * self.p.sequences, self.p.decode

    def positions(self, lm, scheme) -> dict[str, np.ndarray]:
        """Per row and decode position (2N x T): ``kl``, ``agree`` (top-1), ``nll``, ``base_nll``, and the
        KL estimate's ``kl_lower`` bound, sampling variance ``kl_var`` and baseline ``tail_mass``
        (``kl`` and ``kl_var`` None from a backend that gives only the bound), from the eval's backend."""
        self.require_prepared(hasattr(self, "request"))
        return backend_of(self).decode_positions(self.request, lm, scheme)

    def evaluate(self, lm, scheme, artifacts: Path | None = None) -> list[MetricRow]:
        pos = self.positions(lm, scheme)
        if artifacts is not None:
            self._write_positions(Path(artifacts), pos)
        return stamp(self.rows(pos), backend_of(self))

    def _write_positions(self, folder: Path, pos: dict[str, np.ndarray]) -> None:
        """``decode_positions.csv``: one line per row and decode position (what the rows aggregate)."""
        import pandas as pd

        rows, steps = self._shape
        n = self.p.sequences
        row = np.repeat(np.arange(rows), steps)
        folder.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(
            {
                "kind": np.where(row < n, "corpus", "greedy"),
                "sequence": row % n,
                "start": np.array(self.starts)[row % n],
                "position": np.tile(np.arange(steps), rows) + self.p.prefill,
                "kl": (pos["kl"] if pos["kl"] is not None else pos["kl_lower"]).ravel(),
                "top1_agree": pos["agree"].ravel(),
                "nll": pos["nll"].ravel(),
                "base_nll": pos["base_nll"].ravel(),
            }
        ).to_csv(folder / "decode_positions.csv", index=False)

    # ---- rows ------------------------------------------------------------------------------
    def rows(self, pos: dict[str, np.ndarray]) -> list[MetricRow]:
        p, n = self.p, self.p.sequences
        source = pos["info"]  # the backend's provenance (the emulation's: its baseline cache and KL method)
        info = dict(
            protocol=self.protocol,
            corpus=self.corpus.name,
            corpus_sha256=self.corpus.sha256,
            n_sequences=n,
            starts=self.starts,
            bootstrap_samples=p.bootstrap_samples,
            seed=p.seed,
            ci=f"{interval_text(p.interval, 'sequences')}, {NO_FLOAT_SPREAD}",
            **source,
            positions=f"generated tokens {p.prefill}..{p.length - 1}; the first is the prefill's prediction",
        )
        # only a proven lower bound (a top-k backend): the KL rows are named for it, as perplexity's
        kl, (kl_name, free_name) = (
            (pos["kl"], ("kl_mean", "free_kl_mean"))
            if pos["kl"] is not None
            else (pos["kl_lower"], ("kl_lower_bound", "free_kl_lower_bound"))
        )
        edges = step_bucket_edges(p.decode, p.buckets)
        groups = [({}, slice(0, p.decode))] + [
            ({"bucket": f"{p.prefill + a}-{p.prefill + b - 1}"}, slice(a, b)) for a, b in zip(edges, edges[1:])
        ]
        tf, fr = slice(0, n), slice(n, 2 * n)
        out = []
        for labels, cols in groups:
            out += self._mean_rows(
                labels,
                info,
                {
                    kl_name: (kl[tf, cols], None),
                    "top1_agreement": (pos["agree"][tf, cols], None),
                    "nll_delta": (pos["nll"][tf, cols], pos["base_nll"][tf, cols]),
                    free_name: (kl[fr, cols], None),
                },
                {kl_name: _kl_info(pos, tf, cols), free_name: _kl_info(pos, fr, cols)},
            )
            out.append(MetricRow("n_tokens", float(n * (cols.stop - cols.start)), labels=dict(labels), info=info))
        steps = first_divergence(pos["agree"][fr])
        median, low, high, m_info = censored_median(steps, p.decode)
        m_info = {**m_info, "ci": f"exact order-statistic interval of the median over sequences, {NO_FLOAT_SPREAD}"}
        out.append(MetricRow("first_divergence", median, low, high, info={**info, **m_info, "steps": steps.tolist()}))
        share, s_low, s_high, k = identical_share(steps, p.decode)
        out.append(
            MetricRow(
                "identical_share",
                share,
                s_low,
                s_high,
                info={**info, "identical": k, "ci": f"95% Wilson interval over sequences, {NO_FLOAT_SPREAD}"},
            )
        )
        return out

    def _mean_rows(self, labels: dict, info: dict, metrics: dict, extra: dict) -> list[MetricRow]:
        """Per metric: the mean over sequences x positions of ``a - b`` (b optional), with an interval
        over sequences (each sequence's sum over its positions is one unit)."""
        rows = []
        for metric, (a, b) in metrics.items():
            s = a.astype(np.float64).sum(-1) - (0.0 if b is None else b.astype(np.float64).sum(-1))
            count = np.full(len(s), a.shape[1], dtype=np.float64)

            def fn(x, c):
                return x.sum(-1) / c.sum(-1)

            value = float(fn(s, count))
            low, high = unit_interval(
                fn, [s, count], method=self.p.interval, n_resamples=self.p.bootstrap_samples, seed=self.p.seed
            )
            ci = (None, None) if math.isnan(low) else (low, high)
            rows.append(MetricRow(metric, value, *ci, labels=dict(labels), info={**info, **extra.get(metric, {})}))
        return rows


def _kl_info(pos: dict, rows: slice, cols: slice) -> dict:
    """What the KL estimate rests on, for a block of positions (as perplexity reports it): the mean
    proven lower bound, the baseline's mean tail mass, and the standard error of the mean from tail sampling."""
    if pos["kl_var"] is None:  # a bound only: what it leaves out
        return {"kl_bound": True, "kl_tail_mass": float(pos["tail_mass"][rows, cols].mean())}
    var = pos["kl_var"][rows, cols]
    return {
        "kl_lower_bound": float(pos["kl_lower"][rows, cols].mean()),
        "kl_tail_mass": float(pos["tail_mass"][rows, cols].mean()),
        "kl_sampling_se": float(math.sqrt(var.sum()) / var.size),
    }
