"""What the evaluations that score next-token distributions (perplexity, decode) share: the output
head, the stored-weight scale, and the baseline cache folders.

Output head. :class:`OutputHead` applies the model's output layer (plus gemma-style final-logit
soft-capping) to final hidden states, so an evaluation runs the backbone once and computes logits
only for the rows it scores, a chunk at a time (``CHUNK_ELEMENTS`` logits): no (positions x
vocabulary) float tensor exists for long inputs. It is checked once against the model's own
logits, so a head evalkit does not reproduce is refused rather than mis-scored.

Stored probabilities. A baseline keeps probabilities as float16 weights ``w = fp16(P * P_SCALE)``
(relative precision 2^-11, normal range down to P = 2e-9) and scores a scheme with one fused dot
product per row (:func:`rowdot`) against its log-probs; what is stored per position (the 2 KB
summary: top tokens, tail mass, tail samples) and the KL estimate and bound built from it are
:mod:`evalkit.evals.kl_topk`'s.

Baseline folders. Their size is checked against free space before anything is written
(:func:`check_free_space`, with the headroom of :func:`fits`); they are built in a temporary
sibling (:func:`temp_dir`) and renamed into place (:func:`publish`) with their completion marker
(``meta.json``) written last, so an interrupted run never leaves a folder that looks complete.
Their cache keys hold the model's :func:`evalkit.models.info.weights_fingerprint`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from evalkit.errors import EvalkitError
from evalkit.units import format_bytes

P_SCALE = 2.0**15  # stored weights are fp16(P * P_SCALE): normal range down to P = 2e-9
CHUNK_ELEMENTS = 8 * 2**20  # logits per chunk: 32 MiB of float32


class OutputHead:
    """The model's output layer applied to final hidden states (plus gemma-style soft-capping),
    checked once against the model's own logits so an unusual head is refused, not mis-scored."""

    def __init__(self, model, eval_name: str = "perplexity"):
        self.linear = model.get_output_embeddings()
        if self.linear is None:
            raise EvalkitError(f"{type(model).__name__} has no output embeddings: {eval_name} needs a causal LM head")
        cfg = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        self.vocab = self.linear.out_features
        device = next(model.parameters()).device
        ids = torch.arange(1, 9, device=device)[None] % self.vocab
        with torch.inference_mode():
            ref = model(input_ids=ids, use_cache=False).logits.float()
            ours = self(model.base_model(input_ids=ids, use_cache=False).last_hidden_state[0])
        if not torch.allclose(ours, ref[0], rtol=1e-4, atol=1e-4):
            raise EvalkitError(
                f"{type(model).__name__} post-processes its logits in a way evalkit does not reproduce: {eval_name} cannot score it"
            )

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.linear(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row dot product of two (rows, vocab) tensors, fused (no (rows, vocab) temporary)."""
    return torch.bmm(a[:, None, :], b[:, :, None])[:, 0, 0]


def fits(need: float, free: int) -> bool:
    """``need`` bytes fit in ``free`` with headroom: 5 % and 256 MiB (caches, the store, the OS)."""
    return need * 1.05 + 2**28 <= free


def check_free_space(folder: Path, need: int, what: str, fix: str) -> None:
    """EvalkitError unless ``need`` bytes :func:`fit <fits>` in the free space under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if not fits(need, free):
        raise EvalkitError(f"{what} need {format_bytes(need)} but {format_bytes(free)} are free: {fix}")


def baseline_key(lm, **fields) -> dict:
    """What decides a cached baseline's numbers: the model (name, config, weights, dtype, device),
    its tokenizer, and the evaluation's own ``fields`` (format version, corpus, protocol, versions)."""
    from evalkit.data.corpus import tokenizer_fingerprint
    from evalkit.models.info import weights_fingerprint

    model = lm.model
    return dict(
        model=lm.name,
        config=lm.config_hash,
        weights=weights_fingerprint(model),
        dtype=str(next(model.parameters()).dtype),
        device=lm.device.type,
        tokenizer=tokenizer_fingerprint(lm.tokenizer),
        **fields,
    )


def baseline_dir(workdir: Path, eval_name: str, key: dict) -> Path:
    """The folder of the baseline cached under ``key`` (a hash of its sorted JSON)."""
    import hashlib
    import json

    return Path(workdir) / eval_name / hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def load_or_build(folder: Path, load, build) -> dict:
    """The baseline in ``folder``: ``load()`` when its completion marker (``meta.json``) is there, else
    (not there, or left by an older evalkit or a damaged disk: a cache miss) ``build()`` into a clean
    folder and ``load()`` it back; ``load`` returns None for a folder it cannot read."""
    base = load() if (folder / "meta.json").is_file() else None
    if base is None:
        shutil.rmtree(folder, ignore_errors=True)
        build()
        base = load()
        if base is None:
            raise EvalkitError(
                f"the baseline just written to {folder} cannot be read back: check the disk, or use --cache-dir elsewhere"
            )
    return base


def temp_dir(final: Path) -> Path:
    """A fresh temporary sibling of ``final`` (this process's own) to build a cache folder in."""
    tmp = final.with_name(f"{final.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def append_lines(path: Path, lines: list[str]) -> None:
    """Append text lines to a cache file shared by several processes (Ray workers of one model): one
    ``write`` with ``O_APPEND``, so lines of concurrent writers never interleave; a reader skips a
    line cut by a killed writer."""
    if not lines:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, "".join(line + "\n" for line in lines).encode())
    finally:
        os.close(fd)


def publish(tmp: Path, final: Path) -> None:
    """Rename a finished temporary folder into place (another process that finished first wins)."""
    try:
        os.rename(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
