"""Next-token distributions shared by the evaluations that score them (perplexity, decode).

Output head. :class:`OutputHead` applies the model's output layer (plus gemma-style final-logit
soft-capping) to final hidden states, so an evaluation runs the backbone once and computes logits
only for the rows it scores, a chunk at a time: no (positions x vocabulary) float tensor exists
for long inputs. It is checked once against the model's own logits, so a head evalkit does not
reproduce is refused rather than mis-scored.

Stored baseline (as llama.cpp's ``--kl-divergence-base``: the full baseline distribution in 16
bits). KL(P || Q) needs the baseline's whole distribution P at every scored position; recomputing
it per scheme costs a second forward and top-k storage is not exact. The baseline pass stores per
position the float16 weights ``w = fp16(P * 2^15)`` (relative precision 2^-11, normal range down
to P = 2e-9) and two float32 numbers, ``t = sum_v w_v log P_v`` and ``z = sum_v w_v``
(:func:`baseline_summary`). A scheme's KL is then

    KL = (t - sum_v w_v log Q_v) / z                                  (:func:`kl_stored`)

one fused dot product with the scheme's log-softmax, which the NLL needs anyway. This equals
KL(P'||Q) - KL(P'||P) for the renormalized stored distribution P' = w / z (KL(P'||P) ~ 1e-8): the
exact KL up to zero-mean rounding noise of ~1e-3 of each token's KL, exactly 0 for an identity
scheme (the same dot product on the same numbers), clamped at 0 per token against float32
summation noise (~1e-6 nats: the floor below which a scheme's KL is not resolved). Disk: 2 bytes
x vocabulary per scored position, checked against free space (:func:`check_free_space`) before
anything is written.

Baseline folders are written to a temporary sibling and renamed into place (:func:`publish`), with
their completion marker (``meta.json``) written last, so an interrupted run never leaves a folder
that looks complete; :func:`weights_fingerprint` goes into their cache keys.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import torch

from evalkit.errors import EvalkitError
from evalkit.units import format_bytes

P_SCALE = 2.0**15  # stored weights are fp16(P * P_SCALE): normal range down to P = 2e-9
CHUNK_ELEMENTS = 8 * 2**20  # logits per chunk: 32 MB of float32


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
            raise EvalkitError(f"{type(model).__name__} post-processes its logits in a way evalkit does not reproduce: {eval_name} cannot score it")

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.linear(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row dot product of two (rows, vocab) tensors, fused (no (rows, vocab) temporary)."""
    return torch.bmm(a[:, None, :], b[:, :, None])[:, 0, 0]


def baseline_summary(lp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the baseline stores per position: fp16 weights w, t = w . log P and z = sum w."""
    w = (lp.exp() * P_SCALE).half()
    wf = w.float()
    return w, rowdot(wf, lp), wf.sum(-1)


def kl_stored(w: torch.Tensor, t: torch.Tensor, z: torch.Tensor, lq: torch.Tensor) -> torch.Tensor:
    """Per-row KL(P || Q) from the stored baseline (w, t, z) and the scheme's log-probs ``lq``."""
    return ((t - rowdot(w.float(), lq)) / z).clamp_min_(0)


def weights_fingerprint(model) -> str:
    """Cheap hash of every parameter's name, shape, dtype and first/last 64 values."""
    h = hashlib.sha256()
    with torch.no_grad():
        for name, t in model.named_parameters():
            flat = t.detach().reshape(-1)
            h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
            h.update(torch.cat([flat[:64], flat[-64:]]).float().cpu().numpy().tobytes())
    return h.hexdigest()


def fits(need: float, free: int) -> bool:
    """``need`` bytes fit in ``free`` with headroom: 5 % and 256 MiB (caches, the store, the OS)."""
    return need * 1.05 + 2**28 <= free


def check_free_space(folder: Path, need: int, what: str, fix: str) -> None:
    """EvalkitError unless ``need`` bytes :func:`fit <fits>` in the free space under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if not fits(need, free):
        raise EvalkitError(f"{what} need {format_bytes(need)} but {format_bytes(free)} are free: {fix}")


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
