"""Perplexity, KL(baseline || scheme) and top-1 agreement per KV scheme, with paired intervals.

Protocol. The corpus is tokenized once (:mod:`evalkit.data.corpus`) and cut into windows of ``window``
input tokens, optionally starting with BOS (default: on when the tokenizer itself adds BOS). A
window holds ``C = window - bos`` corpus tokens and the next window starts ``min(stride, C)``
tokens later; the last window is aligned to the corpus end. Every token is scored exactly once,
by the first window that reaches it, which is the one giving it the most context (the standard
strided-perplexity protocol; ``stride == window`` gives disjoint windows, and without BOS the
first token of each disjoint window is predicted by nothing and so not scored).

Baseline. ``prepare()`` runs the unquantized model once per model x corpus x protocol and caches,
under ``workdir/perplexity/<key>/``, per scored token: its NLL and argmax (exact: perplexity, its
change and top-1 agreement need nothing else) and a 2 KB summary of its next-token distribution
(:mod:`evalkit.evals.kl_topk`): the top 160 tokens' probabilities, the tail's mass and 128
stratified tail samples. Scalars go to ``baseline.safetensors``, the per-token arrays to ``.npy``
files written chunk by chunk; ``meta.json`` is written last as the completion marker. The key
hashes the model (config, a weight fingerprint, dtype, device), the tokenizer, the corpus hash,
the protocol and the torch version.

KL choice: the 2 KB summary, whatever the vocabulary (2008 bytes per scored token: 600 MB for
wikitext-2's ~300k test tokens, where full float16 distributions of a 128k vocabulary take 77 GB),
checked against free space before anything is written. A scheme's KL per token is the head's
exact term plus the tail's, estimated without bias from the samples; the tail's aggregated term
gives a proven lower bound, reported with the estimate (the math and why no useful two-sided bound
exists from a small summary: :mod:`evalkit.evals.kl_topk`). A scheme costs one forward per window,
as the NLL needs anyway; computing the baseline in lockstep instead would be exact without storage
but would double every scheme's cost.

Memory. The backbone runs once per batch of windows (sdpa, no KV cache); the output head,
log-softmax and KL run on chunks of scored positions (``CHUNK_ELEMENTS`` logits at a time), so no
(window x vocabulary) float tensor exists for long windows and nothing grows with the corpus.

Backends. The eval asks a backend for the log-probs of its windows (:class:`TokenScores` per
scored token); the default, :class:`EmulationBackend`, is the transformers model through evalkit's
storage cache with the cached baseline above. An engine (``evalkit.engines.vllm_backend.VllmBackend``,
``evalkit run --engine vllm``) is another: its baseline is its own unquantized run, and where it
returns only a top-k its KL row is the proven lower bound, named ``kl_lower_bound`` (``kl_bound:
true`` in the row's info) instead of ``kl_mean``.

Statistics (:mod:`evalkit.evals.stats`): 95 % paired percentile bootstrap over windows (fixed seed,
``bootstrap_samples`` resamples) for perplexity, its change, KL and agreement, and a Wilcoxon
signed-rank p-value over per-window mean NLL. Rows repeat for position buckets within the window
(target index 0-127, 128-511, 512-2047, ... powers of 4 up to the window) with ``labels={"bucket":..}``.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from evalkit.data.corpus import load_corpus, tokenize_corpus, tokenizer_adds_bos
from evalkit.errors import EvalkitError
from evalkit.evals.backend import EMULATION, EmulationBackend, TokenScores, backend_of, stamp  # noqa: F401 (re-exported)
from evalkit.evals.base import Column, Criterion, Evaluation, MetricRow, Params, ReportSpec, param, register_eval
from evalkit.evals.float_noise import DEFAULT_ULPS
from evalkit.evals.kl_topk import BYTES_PER_POSITION, METHOD, SCALAR_DTYPES, kl_from_summary, summarize
from evalkit.evals.output_head import (
    CHUNK_ELEMENTS,
    OutputHead,
    baseline_dir,
    baseline_key,
    check_free_space,
    load_or_build,
    publish,
    temp_dir,
)
from evalkit.evals.perplexity.float_spread import ci_text, combine
from evalkit.evals.stats import PVALUE_TEST, paired_bootstrap_ci, paired_pvalue

FORMAT_VERSION = (
    4  # bump when the cached baseline's contents change (3: the 2 KB top-k + tail summary; 4: log P_T in float64)
)
BASELINE_KEYS = frozenset(SCALAR_DTYPES)  # one value per scored token (safetensors)
ARRAYS = {"head": "<i4", "w": "<f2", "tail": "<i4", "tail_lp": "<f4"}  # a row per scored token (.npy)
SAMPLE_SEED = 0  # the tail samples' stratified offsets


@dataclass
class Realisation:
    """One float realisation of the emulation: a model (the loaded one, or a perturbed-weight copy with
    ``seed``), its output head and its cached baseline (folder and arrays)."""

    lm: Any
    head: Any
    dir: Path
    base: dict
    seed: int | None = None


def position_bucket_edges(window: int) -> list[int]:
    """Edges 0, 128, 512, 2048, ... (powers of 4 from 128) up to the window's last target index."""
    edges, e = [0], 128
    while e < window:
        edges.append(e)
        e *= 4
    return edges + [window]


def plan_windows(n_tokens: int, window: int, stride: int, bos: bool, max_windows: int | None) -> list[tuple[int, int]]:
    """``(start, first_target)`` per window: the corpus index of its first content token and the
    input index of its first scored target (targets run from there to the window's end)."""
    c = window - int(bos)
    if n_tokens < c:
        raise EvalkitError(
            f"the corpus has {n_tokens} tokens, fewer than one window needs ({c}): use a longer corpus or a smaller --perplexity-window"
        )
    step, plan, scored_to, start = min(stride, c), [], (0 if bos else 1), 0
    while scored_to < n_tokens and (max_windows is None or len(plan) < max_windows):
        start = min(start, n_tokens - c)
        plan.append((start, max(scored_to - start + int(bos), 1)))  # input 0 is never a target
        scored_to, start = start + c, start + step
    return plan


KL_QUANTILES = {"kl_p50": 50.0, "kl_p99": 99.0, "kl_p999": 99.9, "kl_max": 100.0}  # llama.cpp's KL summary


def kl_quantile_rows(kl: np.ndarray, info: dict) -> list[MetricRow]:
    """Median, 99th and 99.9th percentiles and maximum of the per-token KL over all scored tokens
    (numpy's linear interpolation between order statistics), as llama.cpp's KL tool reports them:
    the mean hides whether a scheme's error is spread thin or concentrated in a few tokens. No
    interval: the bootstrap over windows is for means, and a maximum has none worth giving."""
    values = np.percentile(kl, list(KL_QUANTILES.values()))
    q_info = {**info, "kl_quantile": "per-token KL estimate over all scored tokens, numpy linear percentile"}
    return [MetricRow(name, float(v), labels={}, info=q_info) for name, v in zip(KL_QUANTILES, values)]


@dataclass(frozen=True)
class PerplexityParams(Params):
    """The perplexity evaluation's parameters: grid keys are the field names, CLI flags ``--perplexity-<field>``."""

    corpus: str = param(
        "embedded", "embedded (default), wikitext2, file:PATH (.txt/.jsonl) or hf:NAME[/CONFIG]:SPLIT[:COLUMN]"
    )
    window: int = param(1024, "tokens per window incl. BOS (default 1024)", baseline=True)
    stride: int | None = param(None, "tokens between window starts (default: window, disjoint)", baseline=True)
    max_windows: int | None = param(20, "evaluate at most N windows (default 20)", low=1, baseline=True)
    max_tokens: int | None = param(None, "use only the first N corpus tokens", low=2, baseline=True)
    batch_size: int = param(1, "windows per forward (default 1)", low=1, baseline=True)
    bos: bool | None = param(
        None, "start each window with BOS (default: when the tokenizer adds BOS itself)", baseline=True
    )
    bootstrap_samples: int = param(2000, "bootstrap resamples (default 2000)", low=100)
    seed: int = param(0, "bootstrap seed (default 0)")
    float_noise_seeds: int = param(
        0,
        "also rerun baseline and scheme on N weight copies perturbed by a few ulps (seeds 1..N) and widen the "
        "intervals by that float spread (default 0: off; costs N extra forwards per scheme and N model copies in memory)",
        low=0,
    )

    def check(self) -> None:
        if self.window < 2:
            raise EvalkitError(f"window {self.window} is too short: use {self.flag('window')} 2 or more")
        if self.stride is None:
            self._set("stride", self.window)
        if not 0 < self.stride <= self.window:
            raise EvalkitError(f"stride {self.stride} must be in 1..window ({self.window}): fix {self.flag('stride')}")


@register_eval("perplexity")
class PerplexityEval(Evaluation):
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
        plots=("evalkit.report.plots:positions_figures",),
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
        self.backend = EMULATION if backend is None else backend

    @classmethod
    def workload(cls, params: dict[str, Any], facts, device: str = "cpu"):
        from evalkit.evals.perplexity.workload import perplexity_work

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
        backend_of(self).prepare(self, lm, Path(workdir))
        self._noisy = self._prepare_float_noise(lm, Path(workdir))

    def canonical_params(self) -> dict[str, Any]:
        """The parameters, without ``float_noise_seeds`` while it is off (0): runs made before it existed keep their ids."""
        return {k: v for k, v in self.params.items() if not (k == "float_noise_seeds" and not v)}

    def _prepare_float_noise(self, lm, workdir: Path) -> list[Realisation]:
        """The perturbed-weight copies (seeds 1..N) with their own cached baselines (see
        :mod:`evalkit.evals.perplexity.float_spread`); none when ``float_noise_seeds`` is 0."""
        n = self.params["float_noise_seeds"]
        if not n:
            return []
        if not isinstance(backend_of(self), EmulationBackend):
            raise EvalkitError(
                f"--perplexity-float-noise-seeds reruns the emulation on perturbed weight copies; backend "
                f"{backend_of(self).name} cannot: drop it (0) or use --engine emulation"
            )
        import dataclasses

        from evalkit.evals.float_noise import DEFAULT_ULPS, perturbed_model

        out = []
        for seed in range(1, n + 1):
            copy = dataclasses.replace(lm, model=perturbed_model(lm.model, seed, DEFAULT_ULPS))
            out.append(self._realisation(copy, workdir, {"seed": seed, "ulps": DEFAULT_ULPS}))
        return out

    def window_inputs(self):
        """Each window's input ids (BOS first where used) and the index of its first scored target."""
        for i, (_, t0) in enumerate(self.plan):
            yield self._input_ids(self.plan[i : i + 1])[0], t0

    def _input_ids(self, batch) -> torch.Tensor:
        c = self.params["window"] - int(self.bos)
        ids = torch.stack([self.ids[s : s + c] for s, _ in batch])
        if self.bos:
            ids = torch.cat([torch.full((len(batch), 1), self.tokenizer_bos, dtype=ids.dtype), ids], dim=1)
        return ids

    def _prepare_baseline(self, lm, workdir: Path) -> None:
        """The emulation's baseline: the unquantized model's summaries, cached (see the module docstring)."""
        real = self._realisation(lm, workdir)
        self.head, self.dir, self.base = real.head, real.dir, real.base
        self.base_nll, self.base_argmax = real.base["nll"], real.base["argmax"]

    def _realisation(self, lm, workdir: Path, float_noise: dict | None = None) -> Realisation:
        """``lm``'s output head and cached baseline; ``float_noise`` (seed, ulps) keys a perturbed copy's."""
        head = OutputHead(lm.model, "perplexity")
        extra = {} if float_noise is None else {"float_noise": float_noise}
        key = baseline_key(
            lm,
            version=FORMAT_VERSION,
            corpus=self.corpus.sha256,
            protocol=self.protocol,
            torch=torch.__version__,
            **extra,
        )
        folder = baseline_dir(workdir, "perplexity", key)
        base = load_or_build(
            folder, lambda: self._load_baseline(folder), lambda: self._compute_baseline(lm, key, head, folder)
        )
        return Realisation(lm, head, folder, base, None if float_noise is None else float_noise["seed"])

    def _load_baseline(self, folder: Path | None = None) -> dict | None:
        """The cached baseline (scalars as tensors, per-token arrays memory-mapped), or None when a
        file is missing, unreadable, incomplete or of another shape."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        folder = self.dir if folder is None else folder
        try:
            base = load_file(folder / "baseline.safetensors")
            arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in ARRAYS}
        except (OSError, ValueError, SafetensorError):
            return None
        n = int(self.offsets[-1])
        if not BASELINE_KEYS <= set(base) or any(
            base[k].shape != (n,) or base[k].dtype != SCALAR_DTYPES[k] for k in BASELINE_KEYS
        ):
            return None
        if any(a.ndim != 2 or a.shape[0] != n or a.dtype != np.dtype(ARRAYS[name]) for name, a in arrays.items()):
            return None
        return {**base, **arrays}

    def _compute_baseline(self, lm, key: dict, head: OutputHead | None = None, folder: Path | None = None) -> None:
        from evalkit.evals.kl_topk import TAIL_SAMPLES, TOP_K

        head, folder = head or self.head, folder or self.dir
        n, vocab = int(self.offsets[-1]), head.vocab
        check_free_space(
            folder.parent,
            n * BYTES_PER_POSITION,
            f"the baseline summaries ({n} tokens x {BYTES_PER_POSITION} B)",
            "lower --perplexity-max-windows/--perplexity-max-tokens or use --cache-dir on a bigger disk",
        )
        tmp = temp_dir(folder)
        out = {k: torch.empty(n, dtype=dtype) for k, dtype in SCALAR_DTYPES.items()}
        width = {"head": min(TOP_K, vocab), "w": min(TOP_K, vocab), "tail": TAIL_SAMPLES, "tail_lp": TAIL_SAMPLES}
        generator = torch.Generator().manual_seed(SAMPLE_SEED)
        with contextlib.ExitStack() as stack:
            files = {name: stack.enter_context(open(tmp / f"{name}.npy", "wb")) for name in ARRAYS}
            for name, fh in files.items():
                np.lib.format.write_array_header_2_0(
                    fh, {"descr": ARRAYS[name], "fortran_order": False, "shape": (n, width[name])}
                )
            for lo, lp, tgt_nll, top in self._scored_chunks(lm, head):
                summary = summarize(lp, generator)
                sl = slice(lo, lo + len(top))
                out["nll"][sl], out["argmax"][sl] = tgt_nll.cpu(), top.cpu()
                out["t"][sl], out["log_tail"][sl] = summary["t"].cpu(), summary["log_tail"].cpu()
                for name, fh in files.items():
                    fh.write(summary[name].cpu().numpy().astype(ARRAYS[name], copy=False).tobytes())
        from safetensors.torch import save_file

        save_file({**out, "offsets": torch.from_numpy(self.offsets)}, tmp / "baseline.safetensors")
        (tmp / "meta.json").write_text(
            json.dumps(
                {**key, "n_tokens": n, "vocab": vocab, "corpus_name": self.corpus.name}, indent=1, sort_keys=True
            )
        )
        publish(tmp, folder)

    def _scored_chunks(self, lm, head: OutputHead | None = None):
        """Yield ``(offset, log_probs, nll, argmax)`` for chunks of scored positions, in order."""
        model, p, head = lm.model, self.params, head or self.head
        rows = max(1, CHUNK_ELEMENTS // head.vocab)
        with torch.inference_mode():
            for b0 in range(0, len(self.plan), p["batch_size"]):
                batch = self.plan[b0 : b0 + p["batch_size"]]
                ids = self._input_ids(batch).to(lm.device)
                hidden = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
                h = torch.cat([hidden[i, t0 - 1 : -1] for i, (_, t0) in enumerate(batch)])
                tgt = torch.cat([ids[i, t0:] for i, (_, t0) in enumerate(batch)])
                del hidden
                base = int(self.offsets[b0])
                for lo in range(0, len(tgt), rows):
                    lp = torch.log_softmax(head(h[lo : lo + rows]), dim=-1)
                    nll = -lp.gather(1, tgt[lo : lo + rows, None])[:, 0]
                    yield base + lo, lp, nll, lp.argmax(-1)

    # ---- one scheme ------------------------------------------------------------------------
    def evaluate(self, lm, scheme, artifacts: Path | None = None) -> list[MetricRow]:
        self.require_prepared(hasattr(self, "protocol"))
        scores = backend_of(self).score(self, lm, scheme)
        if artifacts is not None:
            self._write_windows(Path(artifacts), scores)
        noise = [(r.seed, self._score_emulation(r.lm, scheme, r)) for r in getattr(self, "_noisy", [])]
        return stamp(self._rows(scores, noise), backend_of(self))

    def _score_emulation(self, lm, scheme, real: Realisation | None = None) -> TokenScores:
        """``scheme`` through the storage cache on ``lm``, against the baseline of ``real`` (default: the
        unperturbed model's, prepared by :meth:`prepare`)."""
        from evalkit.integration.install import quantized_kv

        base, head, folder = (self.base, self.head, self.dir) if real is None else (real.base, real.head, real.dir)

        n = int(self.offsets[-1])
        nll, kl, agree = (
            torch.empty(n, dtype=torch.float64),
            torch.empty(n, dtype=torch.float64),
            torch.empty(n, dtype=torch.bool),
        )
        lower, var = torch.empty(n, dtype=torch.float64), torch.empty(n, dtype=torch.float64)
        with quantized_kv(lm.model, scheme):
            for lo, lp, tgt_nll, top in self._scored_chunks(lm, head):
                sl = slice(lo, lo + len(top))
                summary = {
                    k: (torch.from_numpy(np.array(base[k][sl])) if k in ARRAYS else base[k][sl]).to(lp.device)
                    for k in ("head", "w", "t", "log_tail", "tail", "tail_lp")
                }
                k, low, v = kl_from_summary(summary, lp)
                kl[sl], lower[sl], var[sl] = k.double().cpu(), low.double().cpu(), v.double().cpu()
                nll[sl] = tgt_nll.double().cpu()
                agree[sl] = top.cpu() == base["argmax"][sl]
        return TokenScores(
            nll,
            base["nll"].double(),
            agree,
            kl,
            lower,
            var,
            base["log_tail"].double().exp(),
            info=dict(kl_method=METHOD, baseline_cache=folder.name),
        )

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
            ci=ci_text(len(noise)),
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
        for metric, fn in metric_fns.items():
            value = float(fn(*arrays))
            low, high = paired_bootstrap_ci(
                fn, arrays, n_resamples=self.params["bootstrap_samples"], seed=self.params["seed"]
            )
            ci = (None, None) if math.isnan(low) else (low, high)
            row_info = kl_info if metric == kl_metric else info
            if rerun_arrays:
                values = [float(fn(*a)) for _, a in rerun_arrays]
                combined, spread = combine(value, ci, values, [seed for seed, _ in rerun_arrays], DEFAULT_ULPS)
                row_info = {**row_info, "ci_bootstrap": list(ci), "float_noise": spread}
                ci = combined
            rows.append(MetricRow(metric, value, *ci, labels=dict(labels), info=row_info))
            if metric == "top1_agreement":  # p_value and n_tokens keep their place before dp_mean
                p_info = {
                    **info,
                    "p_value_min": 2.0 / 2 ** len(cnt),
                }  # smallest exact signed-rank p with this many windows
                rows.append(
                    MetricRow("p_value", paired_pvalue(s_nll / cnt, s_base / cnt), labels=dict(labels), info=p_info)
                )
                rows.append(MetricRow("n_tokens", float(cnt.sum()), labels=dict(labels), info=info))
        return rows
