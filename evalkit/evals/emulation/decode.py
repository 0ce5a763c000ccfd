"""The emulation's answer to a decode request: the decode loop through evalkit's storage cache and the
cached baseline (auto).

Baseline. The same loop under ``auto`` (identity storage, bit-identical to the plain model), run once
per model x corpus x protocol by :class:`DecodeEmulation` and cached under ``workdir/decode/<key>/``:
per row and position its NLL and argmax and the 2 KB summary of its next-token distribution that
perplexity stores too (:mod:`evalkit.evals.kl_topk`), plus every row's tokens (the greedy rows'
continuation). ``meta.json`` is written last. The key hashes the model (config, weight fingerprint,
dtype, device), tokenizer, the request's ``cache_key`` (corpus hash, protocol: batch size included,
it decides the floats) and the torch and transformers versions. The identity scheme therefore gives
KL exactly 0 and agreement exactly 1: the same computation on the same numbers.

A scheme's pass (:meth:`DecodeEmulation.positions`) runs the loop on the baseline's tokens and scores
each step against the stored summaries (read one step at a time from memory maps, so nothing of size
T x vocabulary is ever held). Disk: 2N x T x 2008 bytes, checked before anything is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from evalkit.evals.decode.loop import decode_logits
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
    OutputHead,
    baseline_dir,
    baseline_key,
    check_free_space,
    load_or_build,
    publish,
    temp_dir,
)
from evalkit.evals.protocol import DecodeRequest
from evalkit.integration.install import quantized_kv
from evalkit.kv.scheme import Scheme

FORMAT_VERSION = (
    3  # bump when the cached baseline's contents change (2: the 2 KB top-k + tail summary; 3: log P_T in float64)
)
SCALARS = tuple(SCALAR_DTYPES)  # (rows, T) each, in baseline.safetensors with the rows' "tokens"
ARRAYS = ARRAY_DTYPES  # (rows, T, width) each, as .npy memory maps
SAMPLE_SEED = 0  # the tail samples' stratified offsets (drawn in step order)


class DecodeEmulation:
    """One decode request on the emulation: its output head, cached baseline and scheme passes."""

    def __init__(self, request: DecodeRequest, lm, workdir: Path):
        import transformers

        self.request = request
        self.head = OutputHead(lm.model, "decode")
        path = getattr(lm, "decode_path", "eager")
        key = baseline_key(
            lm,
            version=FORMAT_VERSION,
            **request.cache_key,
            **({} if path == "eager" else {"decode_path": path}),  # the static paths round differently
            torch=torch.__version__,
            transformers=transformers.__version__,
        )
        self.dir = baseline_dir(workdir, "decode", key)
        self.base = load_or_build(self.dir, self.load_baseline, lambda: self.compute_baseline(lm, key))
        self.inputs = self.base["tokens"]  # the greedy rows continued by the baseline

    def width(self, name: str) -> int:
        return min(TOP_K, self.head.vocab) if name in ("head", "w") else TAIL_SAMPLES

    def load_baseline(self) -> dict | None:
        """The cached baseline (scalars as tensors, summaries memory-mapped), or None when a file is
        missing, unreadable or of another shape, or holds other tokens."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        request = self.request
        try:
            base = load_file(self.dir / "baseline.safetensors")
            arrays = {name: np.load(self.dir / f"{name}.npy", mmap_mode="r") for name in ARRAYS}
        except (OSError, ValueError, SafetensorError):
            return None
        rows, steps = request.shape
        if (
            any(k not in base or base[k].shape != (rows, steps) or base[k].dtype != SCALAR_DTYPES[k] for k in SCALARS)
            or "tokens" not in base
            or base["tokens"].shape != request.inputs.shape
            or any(
                a.shape != (rows, steps, self.width(name)) or a.dtype != np.dtype(ARRAYS[name])
                for name, a in arrays.items()
            )
        ):
            return None
        n, prefill = request.sequences, request.prefill  # the same text and prompts (a hash collision aside)
        if not (
            torch.equal(base["tokens"][:n], request.inputs[:n])
            and torch.equal(base["tokens"][n:, :prefill], request.inputs[n:, :prefill])
        ):
            return None
        return {**base, **arrays}

    def compute_baseline(self, lm, key: dict) -> None:
        request = self.request
        (rows, steps), vocab = request.shape, self.head.vocab
        check_free_space(
            self.dir.parent,
            rows * steps * BYTES_PER_POSITION,
            f"the baseline summaries ({rows} rows x {steps} tokens x {BYTES_PER_POSITION} B)",
            "lower --sequences/--decode or use --cache-dir on a bigger disk",
        )
        tmp = temp_dir(self.dir)
        arrays = {
            name: np.lib.format.open_memmap(
                tmp / f"{name}.npy", mode="w+", dtype=np.dtype(dtype), shape=(rows, steps, self.width(name))
            )
            for name, dtype in ARRAYS.items()
        }
        out = {k: torch.empty(rows, steps, dtype=dtype, device=lm.device) for k, dtype in SCALAR_DTYPES.items()}
        tokens = request.inputs.clone()
        generator = torch.Generator().manual_seed(SAMPLE_SEED)

        def record(sl, j, lp, nll, top):
            summary = summarize(lp, generator)
            out["nll"][sl, j], out["argmax"][sl, j] = nll, top
            out["t"][sl, j], out["log_tail"][sl, j] = summary["t"], summary["log_tail"]
            for name, a in arrays.items():
                a[sl, j] = summary[name].cpu().numpy()

        free = torch.arange(rows) >= request.sequences
        self.run_pass(lm, Scheme(), tokens, record, free)
        for a in arrays.values():
            a.flush()
        from safetensors.torch import save_file

        save_file({**{k: v.cpu() for k, v in out.items()}, "tokens": tokens}, tmp / "baseline.safetensors")
        (tmp / "meta.json").write_text(
            json.dumps(
                {
                    **key,
                    "rows": rows,
                    "vocab": vocab,
                    "corpus_name": request.corpus_name,
                    "starts": list(request.starts),
                },
                indent=1,
                sort_keys=True,
            )
        )
        publish(tmp, self.dir)

    def run_pass(self, lm, scheme, tokens: torch.Tensor, record, free: torch.Tensor | None = None) -> None:
        """Run every row of ``tokens`` through the decode loop under ``scheme``, in batches; call
        ``record(rows, j, log_probs, nll, argmax)`` per step (``tokens`` of free rows get the greedy tokens)."""
        from tqdm import tqdm

        request, device = self.request, lm.device
        bar = tqdm(
            total=tokens.shape[0] * request.decode,
            desc=f"decode {scheme}",
            leave=False,
            disable=os.environ.get("EVALKIT_PROGRESS") == "0",
        )
        with quantized_kv(lm.model, scheme) as session, torch.inference_mode(), bar:
            for b0 in range(0, tokens.shape[0], request.batch_size):
                sl = slice(b0, b0 + request.batch_size)
                ids = tokens[sl].to(device)
                mask = torch.ones_like(ids)
                rows_free = None if free is None else free[sl].to(device)
                steps = decode_logits(
                    lm.model,
                    self.head,
                    session,
                    ids,
                    mask,
                    request.prefill,
                    rows_free,
                    getattr(lm, "decode_path", "eager"),
                )
                for j, logits in enumerate(steps):
                    lp = torch.log_softmax(logits, dim=-1)
                    nll = -lp.gather(1, ids[:, request.prefill + j, None])[:, 0]
                    record(sl, j, lp, nll, logits.argmax(-1))
                    bar.update(ids.shape[0])
                tokens[sl] = ids.cpu()

    def scorer(self, device: torch.device):
        """``(record, collect)`` for one scheme's pass: ``record`` scores one step against the stored
        baseline (KL from the step's summary, read from the memory maps; top-1 against the
        baseline's argmax) into (rows x T) tensors on ``device``; ``collect()`` returns them as
        :meth:`positions` does."""
        rows, steps = self.request.shape
        base = {k: self.base[k].to(device) for k in ("t", "log_tail", "argmax")}
        kl = torch.empty(rows, steps, dtype=torch.float64, device=device)  # float64, as perplexity's
        lower, var, nll = torch.empty_like(kl), torch.empty_like(kl), torch.empty_like(kl)
        agree = torch.empty(rows, steps, dtype=torch.bool, device=device)

        def record(sl, j, lp, step_nll, top):
            summary = {name: torch.from_numpy(np.array(self.base[name][sl, j])).to(device) for name in ARRAYS}
            summary["t"], summary["log_tail"] = base["t"][sl, j], base["log_tail"][sl, j]
            kl[sl, j], lower[sl, j], var[sl, j] = kl_from_summary(summary, lp)
            nll[sl, j], agree[sl, j] = step_nll, top == base["argmax"][sl, j]

        def collect() -> dict:
            return {
                "kl": kl.double().cpu().numpy(),
                "agree": agree.cpu().numpy(),
                "nll": nll.double().cpu().numpy(),
                "base_nll": self.base["nll"].double().numpy(),
                "kl_lower": lower.double().cpu().numpy(),
                "kl_var": var.double().cpu().numpy(),
                "tail_mass": self.base["log_tail"].double().exp().numpy(),
                "info": dict(baseline_cache=self.dir.name, kl_method=METHOD),
            }

        return record, collect

    def positions(self, lm, scheme) -> dict:
        """Per row and decode position: the scheme's pass on the baseline's tokens, scored against it."""
        record, collect = self.scorer(lm.device)
        self.run_pass(lm, scheme, self.inputs.clone(), record)
        return collect()
