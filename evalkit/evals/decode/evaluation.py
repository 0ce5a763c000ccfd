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

Baseline. The same loop under ``bf16`` (identity storage, bit-identical to the plain model), run
once per model x corpus x protocol in :meth:`DecodeEval.prepare` and cached under
``workdir/decode/<key>/``: per row and position its NLL and argmax and the 2 KB summary of its
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

Statistics. 95 % paired percentile bootstrap over sequences (units: sequences, so the correlation
of positions within a sequence is respected; fixed seed, ``bootstrap_samples`` resamples) for
``kl_mean``, ``top1_agreement``, ``nll_delta`` and ``free_kl_mean``; ``first_divergence`` (median,
order-statistic interval) and ``identical_share`` (Wilson) as in :mod:`evalkit.evals.decode.divergence`.

Memory and devices. The loop runs on the model's device; the cache grows linearly with P + T; per
step only (batch x vocabulary) logits exist (the output head runs on the last hidden state only,
also after the prefill); per-position results are (rows x T) numbers. The baseline's summaries
are written and read back one step at a time (memory maps), so nothing of size T x vocabulary is
ever held. Disk: 2N x T x 2008 bytes (P = 32k, T = 8k, N = 4: 134 MB), checked before anything is
written.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from evalkit.data.corpus import load_corpus, tokenize_corpus, tokenizer_adds_bos
from evalkit.errors import EvalkitError
from evalkit.evals.backend import backend_of, stamp
from evalkit.evals.base import Column, Evaluation, MetricRow, Params, ReportSpec, param, register_eval
from evalkit.evals.decode.divergence import censored_median, first_divergence, identical_share
from evalkit.evals.kl_topk import (
    BYTES_PER_POSITION,
    METHOD,
    SCALAR_DTYPES,
    TAIL_SAMPLES,
    TOP_K,
    kl_from_summary,
    summarize,
)
from evalkit.evals.output_head import (
    OutputHead,
    baseline_dir,
    baseline_key,
    check_free_space,
    load_or_build,
    publish,
    temp_dir,
)
from evalkit.evals.stats import paired_bootstrap_ci

FORMAT_VERSION = (
    3  # bump when the cached baseline's contents change (2: the 2 KB top-k + tail summary; 3: log P_T in float64)
)
SCALARS = tuple(SCALAR_DTYPES)  # (rows, T) each, in baseline.safetensors with the rows' "tokens"
ARRAYS = {"head": "<i4", "w": "<f2", "tail": "<i4", "tail_lp": "<f4"}  # (rows, T, width) each, as .npy memory maps
SAMPLE_SEED = 0  # the tail samples' stratified offsets (drawn in step order)


@dataclass(frozen=True)
class DecodeParams(Params):
    """The decode evaluation's parameters: grid keys are the field names, CLI flags ``--decode-<field>``."""

    corpus: str = param(
        "embedded", "corpus: embedded (default), wikitext2, file:PATH (.txt/.jsonl) or hf:NAME[/CONFIG]:SPLIT[:COLUMN]"
    )
    prefill: int = param(512, "prompt tokens P per sequence, BOS included (default 512)", low=1, baseline=True)
    decode: int = param(
        1536, "generated tokens T per sequence (default 1536)", low=1, baseline=True, flag="--decode-tokens"
    )
    sequences: int = param(4, "sequences N cut from the corpus (default 4)", low=1, baseline=True)
    batch_size: int = param(
        8,
        "rows per forward; each sequence is two rows, teacher-forced and free-running (default 8)",
        low=1,
        baseline=True,
    )
    buckets: int = param(8, "equal-width position buckets over the decoded tokens (default 8)", low=1)
    bos: bool | None = param(
        None, "start each sequence with BOS (default: when the tokenizer adds BOS itself)", baseline=True
    )
    bootstrap_samples: int = param(2000, "bootstrap resamples (default 2000)", low=100)
    seed: int = param(0, "bootstrap seed (default 0)", low=0)

    @property
    def length(self) -> int:
        return self.prefill + self.decode


def step_bucket_edges(decode: int, buckets: int) -> list[int]:
    """Edges of ``min(buckets, decode)`` equal-width groups of decode steps 0..decode (widths differ by at most 1)."""
    k = min(buckets, decode)
    return [i * decode // k for i in range(k + 1)]


def sequence_starts(n_tokens: int, span: int, sequences: int) -> list[int]:
    """Evenly spaced, non-overlapping starts of ``sequences`` spans of ``span`` corpus tokens."""
    need = sequences * span
    if n_tokens < need:
        raise EvalkitError(
            f"the corpus has {n_tokens} tokens, fewer than {sequences} sequences x {span} tokens = {need}: "
            "use a longer corpus or fewer --decode-sequences / a shorter --decode-prefill or --decode-tokens"
        )
    if sequences == 1:
        return [0]
    return [i * (n_tokens - span) // (sequences - 1) for i in range(sequences)]


@register_eval("decode")
class DecodeEval(Evaluation):
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
        plots=("evalkit.report.plots:decode_figures",),
        order=20,
    )

    @classmethod
    def workload(cls, params: dict[str, Any], facts, device: str = "cpu"):
        from evalkit.evals.decode.workload import decode_work

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
        backend_of(self).prepare_decode(self, lm, Path(workdir))

    def _prepare_emulation(self, lm, workdir: Path) -> None:
        """The emulation's baseline: the decode loop under bf16, cached (see the module docstring)."""
        import transformers

        model, corpus = lm.model, self.corpus
        self.head = OutputHead(model, "decode")
        key = baseline_key(
            lm,
            version=FORMAT_VERSION,
            corpus=corpus.sha256,
            protocol=self.protocol,
            torch=torch.__version__,
            transformers=transformers.__version__,
        )
        self.dir = baseline_dir(workdir, "decode", key)
        self.base = base = load_or_build(self.dir, self._load_baseline, lambda: self._compute_baseline(lm, key))
        self.inputs = base["tokens"]

    @property
    def _shape(self) -> tuple[int, int]:
        return 2 * self.p.sequences, self.p.decode

    def _load_baseline(self) -> dict | None:
        """The cached baseline (scalars as tensors, summaries memory-mapped), or None when a file is
        missing, unreadable or of another shape, or holds other tokens."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            base = load_file(self.dir / "baseline.safetensors")
            arrays = {name: np.load(self.dir / f"{name}.npy", mmap_mode="r") for name in ARRAYS}
        except (OSError, ValueError, SafetensorError):
            return None
        rows, steps = self._shape
        if (
            any(k not in base or base[k].shape != (rows, steps) or base[k].dtype != SCALAR_DTYPES[k] for k in SCALARS)
            or "tokens" not in base
            or base["tokens"].shape != self.inputs.shape
            or any(
                a.shape != (rows, steps, self._width(name)) or a.dtype != np.dtype(ARRAYS[name])
                for name, a in arrays.items()
            )
        ):
            return None
        n, prefill = self.p.sequences, self.p.prefill  # the same text and prompts (a hash collision aside)
        if not (
            torch.equal(base["tokens"][:n], self.inputs[:n])
            and torch.equal(base["tokens"][n:, :prefill], self.inputs[n:, :prefill])
        ):
            return None
        return {**base, **arrays}

    def _width(self, name: str) -> int:
        return min(TOP_K, self.head.vocab) if name in ("head", "w") else TAIL_SAMPLES

    def _compute_baseline(self, lm, key: dict) -> None:
        from evalkit.kv.scheme import Scheme

        (rows, steps), vocab = self._shape, self.head.vocab
        check_free_space(
            self.dir.parent,
            rows * steps * BYTES_PER_POSITION,
            f"the baseline summaries ({rows} rows x {steps} tokens x {BYTES_PER_POSITION} B)",
            "lower --sequences/--decode or use --cache-dir on a bigger disk",
        )
        tmp = temp_dir(self.dir)
        arrays = {
            name: np.lib.format.open_memmap(
                tmp / f"{name}.npy", mode="w+", dtype=np.dtype(dtype), shape=(rows, steps, self._width(name))
            )
            for name, dtype in ARRAYS.items()
        }
        out = {k: torch.empty(rows, steps, dtype=dtype, device=lm.device) for k, dtype in SCALAR_DTYPES.items()}
        tokens = self.inputs.clone()
        generator = torch.Generator().manual_seed(SAMPLE_SEED)

        def record(sl, j, lp, nll, top):
            summary = summarize(lp, generator)
            out["nll"][sl, j], out["argmax"][sl, j] = nll, top
            out["t"][sl, j], out["log_tail"][sl, j] = summary["t"], summary["log_tail"]
            for name, a in arrays.items():
                a[sl, j] = summary[name].cpu().numpy()

        free = torch.arange(rows) >= self.p.sequences
        self.run_pass(lm, Scheme(), tokens, record, free)
        for a in arrays.values():
            a.flush()
        from safetensors.torch import save_file

        save_file({**{k: v.cpu() for k, v in out.items()}, "tokens": tokens}, tmp / "baseline.safetensors")
        (tmp / "meta.json").write_text(
            json.dumps(
                {**key, "rows": rows, "vocab": vocab, "corpus_name": self.corpus.name, "starts": self.starts},
                indent=1,
                sort_keys=True,
            )
        )
        publish(tmp, self.dir)

    def run_pass(self, lm, scheme, tokens: torch.Tensor, record, free: torch.Tensor | None = None) -> None:
        """Run every row of ``tokens`` through the decode loop under ``scheme``, in batches; call
        ``record(rows, j, log_probs, nll, argmax)`` per step (``tokens`` of free rows get the greedy tokens)."""
        from tqdm import tqdm

        from evalkit.evals.decode.loop import decode_logits
        from evalkit.integration.install import quantized_kv

        p, device = self.p, lm.device
        bar = tqdm(
            total=tokens.shape[0] * p.decode,
            desc=f"decode {scheme}",
            leave=False,
            disable=os.environ.get("EVALKIT_PROGRESS") == "0",
        )
        with quantized_kv(lm.model, scheme) as session, torch.inference_mode(), bar:
            for b0 in range(0, tokens.shape[0], p.batch_size):
                sl = slice(b0, b0 + p.batch_size)
                ids = tokens[sl].to(device)
                mask = torch.ones_like(ids)
                rows_free = None if free is None else free[sl].to(device)
                steps = decode_logits(lm.model, self.head, session, ids, mask, p.prefill, rows_free)
                for j, logits in enumerate(steps):
                    lp = torch.log_softmax(logits, dim=-1)
                    nll = -lp.gather(1, ids[:, p.prefill + j, None])[:, 0]
                    record(sl, j, lp, nll, logits.argmax(-1))
                    bar.update(ids.shape[0])
                tokens[sl] = ids.cpu()

    # ---- one scheme ------------------------------------------------------------------------
    def scorer(self, device: torch.device):
        """``(record, collect)`` for one scheme's pass: ``record`` scores one step against the stored
        baseline (KL from the step's summary, read from the memory maps; top-1 against the
        baseline's argmax) into (rows x T) tensors on ``device``; ``collect()`` returns them as
        :meth:`positions` does."""
        rows, steps = self._shape
        base = {k: self.base[k].to(device) for k in ("t", "log_tail", "argmax")}
        kl = torch.empty(rows, steps, dtype=torch.float32, device=device)
        lower, var, nll = torch.empty_like(kl), torch.empty_like(kl), torch.empty_like(kl)
        agree = torch.empty(rows, steps, dtype=torch.bool, device=device)

        def record(sl, j, lp, step_nll, top):
            summary = {name: torch.from_numpy(np.array(self.base[name][sl, j])).to(device) for name in ARRAYS}
            summary["t"], summary["log_tail"] = base["t"][sl, j], base["log_tail"][sl, j]
            kl[sl, j], lower[sl, j], var[sl, j] = kl_from_summary(summary, lp)
            nll[sl, j], agree[sl, j] = step_nll, top == base["argmax"][sl, j]

        def collect() -> dict[str, np.ndarray]:
            return {
                "kl": kl.double().cpu().numpy(),
                "agree": agree.cpu().numpy(),
                "nll": nll.double().cpu().numpy(),
                "base_nll": self.base["nll"].double().numpy(),
                "kl_lower": lower.double().cpu().numpy(),
                "kl_var": var.double().cpu().numpy(),
                "tail_mass": self.base["log_tail"].double().exp().numpy(),
            }

        return record, collect

    def positions(self, lm, scheme) -> dict[str, np.ndarray]:
        """Per row and decode position (2N x T): ``kl``, ``agree`` (top-1), ``nll``, ``base_nll``, and the
        KL estimate's ``kl_lower`` bound, sampling variance ``kl_var`` and baseline ``tail_mass``
        (``kl`` and ``kl_var`` None from a backend that gives only the bound), from the eval's backend."""
        self.require_prepared(hasattr(self, "protocol"))
        return backend_of(self).decode_positions(self, lm, scheme)

    def _positions_emulation(self, lm, scheme) -> dict[str, np.ndarray]:
        record, collect = self.scorer(lm.device)
        self.run_pass(lm, scheme, self.inputs.clone(), record)
        return collect()

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
        # the emulation's provenance is its baseline cache; another backend's comes with its positions
        source = pos["info"] if "info" in pos else dict(baseline_cache=self.dir.name, kl_method=METHOD)
        info = dict(
            protocol=self.protocol,
            corpus=self.corpus.name,
            corpus_sha256=self.corpus.sha256,
            n_sequences=n,
            starts=self.starts,
            bootstrap_samples=p.bootstrap_samples,
            seed=p.seed,
            ci="95% paired percentile bootstrap over sequences",
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
        out.append(MetricRow("first_divergence", median, low, high, info={**info, **m_info, "steps": steps.tolist()}))
        share, s_low, s_high, k = identical_share(steps, p.decode)
        out.append(
            MetricRow(
                "identical_share",
                share,
                s_low,
                s_high,
                info={**info, "identical": k, "ci": "95% Wilson interval over sequences"},
            )
        )
        return out

    def _mean_rows(self, labels: dict, info: dict, metrics: dict, extra: dict) -> list[MetricRow]:
        """Per metric: the mean over sequences x positions of ``a - b`` (b optional), with a bootstrap
        interval over sequences (each sequence's sum over its positions is one unit)."""
        rows = []
        for metric, (a, b) in metrics.items():
            s = a.astype(np.float64).sum(-1) - (0.0 if b is None else b.astype(np.float64).sum(-1))
            count = np.full(len(s), a.shape[1], dtype=np.float64)

            def fn(x, c):
                return x.sum(-1) / c.sum(-1)

            value = float(fn(s, count))
            low, high = paired_bootstrap_ci(fn, [s, count], n_resamples=self.p.bootstrap_samples, seed=self.p.seed)
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
