"""vLLM's answers as top-k lists, and the one KL they allow: :class:`EngineRun` (per scored token the
NLL of the actual next token and the engine's top-k ids and log-probs) and :func:`kl_lower_bound`,
kl_topk's proven lower bound of KL(baseline || scheme) from two such runs. Shared by the perplexity and
decode paths of the vLLM backend (:mod:`evalkit.engines.vllm_backend`, :mod:`evalkit.engines.vllm_decode`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from evalkit.evals.kl_topk import kl_from_summary
from evalkit.evals.output_head import P_SCALE, rowdot


@dataclass
class EngineRun:
    nll: torch.Tensor  # (n,) float64
    ids: torch.Tensor  # (n, k) int64, by rank
    lps: torch.Tensor  # (n, k) float64
    target: torch.Tensor  # (n,) int64 the actual next tokens


def kl_lower_bound(base: EngineRun, run: EngineRun, chunk: int = 4096) -> tuple[None, torch.Tensor, torch.Tensor]:
    """Per position, kl_topk's proven lower bound of KL(base || run) from two top-k lists: the head S is
    the tokens both returned (the actual next token always among them), the tail everything else, so
    ``L = sum_S p log(p/q) + P_T log(P_T/Q_T)`` (log-sum inequality). Computed by
    :func:`evalkit.evals.kl_topk.kl_from_summary` on a summary over a local vocabulary (S's columns
    plus one for the tail), whose tail sample is that one column: its estimate then equals the bound.
    Returns (None, bound, P_T)."""
    n = base.nll.numel()
    lower, tail_mass = torch.empty(n, dtype=torch.float64), torch.empty(n, dtype=torch.float64)
    for lo in range(0, n, chunk):
        sl = slice(lo, lo + chunk)
        # the baseline's columns: the actual token first, then its top-k without the actual token again
        b_ids = torch.cat([base.target[sl, None], base.ids[sl]], 1)
        b_lps = torch.cat([-base.nll[sl, None], base.lps[sl]], 1)
        q_ids = torch.cat([run.target[sl, None], run.ids[sl]], 1)
        q_lps = torch.cat([-run.nll[sl, None], run.lps[sl]], 1)
        dup = torch.zeros_like(b_ids, dtype=torch.bool)
        dup[:, 1:] = b_ids[:, 1:] == b_ids[:, :1]
        match = b_ids[:, :, None] == q_ids[:, None, :]
        found = match.any(-1) & ~dup
        lq_at = torch.where(match, q_lps[:, None, :], float("-inf")).amax(-1)
        lp = torch.where(found, b_lps, 0.0)
        lq = torch.where(found, lq_at, 0.0)
        p_t = (1 - torch.where(found, lp.exp(), 0.0).sum(-1)).clamp_min(0)
        q_t = (1 - torch.where(found, lq.exp(), 0.0).sum(-1)).clamp_min(1e-30)
        rows, width = b_ids.shape
        w = torch.where(found, (lp.exp() * P_SCALE), 0.0).half()
        local_lq = torch.cat([lq, q_t.log()[:, None]], 1).float()  # float32, as the emulation's log-probs
        log_pt = p_t.log().float()  # rounded as log Q_T is, so an identity run gives exactly 0
        summary = {
            "head": torch.arange(width).expand(rows, width),
            "w": w,
            "t": rowdot(w.float(), lp.float()),
            "log_tail": log_pt.double(),
            "tail": torch.full((rows, 2), width),
            "tail_lp": log_pt[:, None].expand(rows, 2),
        }
        _, low, _ = kl_from_summary(summary, local_lq)
        lower[sl], tail_mass[sl] = low.double(), p_t
    return None, lower, tail_mass
