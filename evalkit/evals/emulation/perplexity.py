"""The emulation's answer to a log-probs request (perplexity): the cached unquantized baseline and each
scheme's scores against it, through evalkit's storage cache.

Baseline. :class:`PerplexityEmulation` runs the unquantized model once per model x corpus x protocol
and caches, under ``workdir/perplexity/<key>/``, per scored token: its NLL and argmax (exact:
perplexity, its change and top-1 agreement need nothing else) and a 2 KB summary of its next-token
distribution (:mod:`evalkit.evals.kl_topk`): the top 160 tokens' probabilities, the tail's mass and
128 stratified tail samples. Scalars go to ``baseline.safetensors``, the per-token arrays to
``.npy`` files written chunk by chunk; ``meta.json`` is written last as the completion marker. The
key hashes the model (config, a weight fingerprint, dtype, device), the tokenizer, the request's
``cache_key`` (the corpus hash and the protocol) and the torch version. The 2 KB summary is checked
against free space before anything is written.

A scheme's KL per token is the head's exact term plus the tail's, estimated without bias from the
samples; the tail's aggregated term gives a proven lower bound, reported with the estimate.

Chunked prefill. A scheme whose engine attends a first-chunk prefill from raw K/V (vLLM TurboQuant,
UltraQuant) reads nothing quantized in one forward; over a window longer than the request's
``prefill_chunk`` it is prefilled chunk by chunk into one storage cache, each later chunk reading the
earlier ones through the stored bytes as the engine's continuation chunks do
(:mod:`evalkit.integration.chunked`), and its scores say so (``info["prefill"]``). Every other scheme,
and every window of at most one chunk, keeps the one forward.

Memory. The backbone runs once per batch of windows (sdpa, no KV cache); the output head,
log-softmax and KL run on chunks of scored positions (``CHUNK_ELEMENTS`` logits at a time), so no
(window x vocabulary) float tensor exists for long windows and nothing grows with the corpus.

Float noise. With ``float_noise_seeds`` N, the same baseline and scores are computed on N copies of
the model whose weights are moved by a few ulps (seeds 1..N, :mod:`evalkit.evals.float_noise`),
each with its own cached baseline (:mod:`evalkit.evals.perplexity.float_spread` turns their spread
into wider intervals).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from evalkit.evals.float_noise import DEFAULT_ULPS, perturbed_model
from evalkit.evals.kl_topk import (
    ARRAY_DTYPES,
    BYTES_PER_POSITION,
    METHOD,
    SCALAR_DTYPES,
    TAIL_SAMPLES,
    TOP_K,
    kl_from_summary,
    summarize,
)
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
from evalkit.evals.protocol import LogprobsRequest, TokenScores
from evalkit.integration.chunked import chunked_prefill_applies, prefill_in_chunks, prefill_note
from evalkit.integration.install import quantized_kv

FORMAT_VERSION = (
    4  # bump when the cached baseline's contents change (3: the 2 KB top-k + tail summary; 4: log P_T in float64)
)
BASELINE_KEYS = frozenset(SCALAR_DTYPES)  # one value per scored token (safetensors)
ARRAYS = ARRAY_DTYPES  # a row per scored token (.npy)
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


def realise(request: LogprobsRequest, lm, workdir: Path, float_noise: dict | None = None) -> Realisation:
    """``lm``'s output head and cached baseline; ``float_noise`` (seed, ulps) keys a perturbed copy's."""
    head = OutputHead(lm.model, "perplexity")
    extra = {} if float_noise is None else {"float_noise": float_noise}
    key = baseline_key(lm, version=FORMAT_VERSION, **request.cache_key, torch=torch.__version__, **extra)
    folder = baseline_dir(workdir, "perplexity", key)
    base = load_or_build(
        folder,
        lambda: load_baseline(request, folder),
        lambda: compute_baseline(request, lm, key, head, folder),
    )
    return Realisation(lm, head, folder, base, None if float_noise is None else float_noise["seed"])


def load_baseline(request: LogprobsRequest, folder: Path) -> dict | None:
    """The cached baseline (scalars as tensors, per-token arrays memory-mapped), or None when a
    file is missing, unreadable, incomplete or of another shape."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        base = load_file(folder / "baseline.safetensors")
        arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in ARRAYS}
    except (OSError, ValueError, SafetensorError):
        return None
    n = request.n_scored
    if not BASELINE_KEYS <= set(base) or any(
        base[k].shape != (n,) or base[k].dtype != SCALAR_DTYPES[k] for k in BASELINE_KEYS
    ):
        return None
    if any(a.ndim != 2 or a.shape[0] != n or a.dtype != np.dtype(ARRAYS[name]) for name, a in arrays.items()):
        return None
    return {**base, **arrays}


def compute_baseline(request: LogprobsRequest, lm, key: dict, head: OutputHead, folder: Path) -> None:
    """Run the unquantized model over the request's windows and write the baseline's files."""
    offsets = request.offsets
    n, vocab = int(offsets[-1]), head.vocab
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
        for lo, lp, tgt_nll, top in scored_chunks(request, lm, head):
            summary = summarize(lp, generator)
            sl = slice(lo, lo + len(top))
            out["nll"][sl], out["argmax"][sl] = tgt_nll.cpu(), top.cpu()
            out["t"][sl], out["log_tail"][sl] = summary["t"].cpu(), summary["log_tail"].cpu()
            for name, fh in files.items():
                fh.write(summary[name].cpu().numpy().astype(ARRAYS[name], copy=False).tobytes())
    from safetensors.torch import save_file

    save_file({**out, "offsets": torch.from_numpy(offsets)}, tmp / "baseline.safetensors")
    (tmp / "meta.json").write_text(
        json.dumps({**key, "n_tokens": n, "vocab": vocab, "corpus_name": request.corpus_name}, indent=1, sort_keys=True)
    )
    publish(tmp, folder)


def scored_chunks(request: LogprobsRequest, lm, head: OutputHead, session=None, chunk: int | None = None):
    """Yield ``(offset, log_probs, nll, argmax)`` for chunks of scored positions, in order. With ``chunk``
    (and the ``quantized_kv`` ``session``), each window is prefilled ``chunk`` tokens at a time into one
    storage cache (:func:`evalkit.integration.chunked.prefill_in_chunks`), else in one forward."""
    model, plan, batch_size, offsets = lm.model, request.plan, request.batch_size, request.offsets
    rows = max(1, CHUNK_ELEMENTS // head.vocab)
    with torch.inference_mode():
        for b0 in range(0, len(plan), batch_size):
            batch = plan[b0 : b0 + batch_size]
            ids = request.input_ids(batch).to(lm.device)
            if chunk is None:
                hidden = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
            else:
                hidden = prefill_in_chunks(model.base_model, ids, chunk, session.new_cache())
            h = torch.cat([hidden[i, t0 - 1 : -1] for i, (_, t0) in enumerate(batch)])
            tgt = torch.cat([ids[i, t0:] for i, (_, t0) in enumerate(batch)])
            del hidden
            base = int(offsets[b0])
            for lo in range(0, len(tgt), rows):
                lp = torch.log_softmax(head(h[lo : lo + rows]), dim=-1)
                nll = -lp.gather(1, tgt[lo : lo + rows, None])[:, 0]
                yield base + lo, lp, nll, lp.argmax(-1)


def score(request: LogprobsRequest, real: Realisation, scheme) -> TokenScores:
    """``scheme`` through the storage cache on ``real``'s model, against ``real``'s baseline."""
    base, head, folder, lm = real.base, real.head, real.dir, real.lm
    n = request.n_scored
    nll, kl, agree = (
        torch.empty(n, dtype=torch.float64),
        torch.empty(n, dtype=torch.float64),
        torch.empty(n, dtype=torch.bool),
    )
    lower, var = torch.empty(n, dtype=torch.float64), torch.empty(n, dtype=torch.float64)
    chunk = request.prefill_chunk if chunked_prefill_applies(scheme, request.window, request.prefill_chunk) else None
    with quantized_kv(lm.model, scheme) as session:
        for lo, lp, tgt_nll, top in scored_chunks(request, lm, head, session, chunk):
            sl = slice(lo, lo + len(top))
            summary = {
                k: (torch.from_numpy(np.array(base[k][sl])) if k in ARRAYS else base[k][sl]).to(lp.device)
                for k in ("head", "w", "t", "log_tail", "tail", "tail_lp")
            }
            k, low, v = kl_from_summary(summary, lp)
            kl[sl], lower[sl], var[sl] = k.double().cpu(), low.double().cpu(), v.double().cpu()
            nll[sl] = tgt_nll.double().cpu()
            agree[sl] = top.cpu() == base["argmax"][sl]
    info = dict(kl_method=METHOD, baseline_cache=folder.name)
    if chunk is not None:
        info["prefill"] = prefill_note(chunk)
    return TokenScores(
        nll,
        base["nll"].double(),
        agree,
        kl,
        lower,
        var,
        base["log_tail"].double().exp(),
        info=info,
    )


class PerplexityEmulation:
    """One log-probs request on the emulation: the loaded model's realisation and, with
    ``float_noise_seeds``, one per perturbed-weight copy (seeds 1..N), each with its cached baseline."""

    def __init__(self, request: LogprobsRequest, lm, workdir: Path):
        self.request = request
        real = realise(request, lm, Path(workdir))
        self.head, self.dir, self.base = real.head, real.dir, real.base
        self.real = real
        self.noisy = [
            realise(
                request,
                dataclasses.replace(lm, model=perturbed_model(lm.model, seed, DEFAULT_ULPS)),
                Path(workdir),
                {"seed": seed, "ulps": DEFAULT_ULPS},
            )
            for seed in range(1, request.float_noise_seeds + 1)
        ]

    def score(self, lm, scheme) -> TokenScores:
        return score(self.request, dataclasses.replace(self.real, lm=lm), scheme)

    def noise_scores(self, scheme) -> list[tuple[int, TokenScores]]:
        return [(r.seed, score(self.request, r, scheme)) for r in self.noisy]
