"""vLLM's answers as top-k lists, and the one KL they allow: :class:`EngineRun` (per scored token the
NLL of the actual next token and the engine's top-k ids and log-probs) and :func:`kl_lower_bound`,
kl_topk's proven lower bound of KL(baseline || scheme) from two such runs (and, where the scheme's
reported top-k probabilities sum to >= 1 so its tail mass is not known, the part of that bound that
needs no tail mass). Shared by the perplexity and
decode paths of the vLLM backend (:mod:`evalkit.engines.vllm.backend`, :mod:`evalkit.engines.vllm.decode`).
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


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x <= 0``, accurate at both ends (Maechler's split at -log 2); -inf at
    ``x = 0`` and NaN above it (the caller decides what a sum of probabilities >= 1 means)."""
    return torch.where(x > -0.6931471805599453, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def kl_lower_bound(base: EngineRun, run: EngineRun, chunk: int = 4096) -> tuple[None, torch.Tensor, torch.Tensor]:
    """Per position, a proven lower bound of KL(base || run) from two top-k lists. Returns
    (None, bound, P_T).

    The head S is the tokens both lists returned (the actual next token always among them), the tail
    T everything else; P_S, Q_S are the two runs' masses on S (logsumexp of the reported log-probs, in
    float64) and P_T = 1 - P_S, Q_T = 1 - Q_S their tail masses, from ``log1mexp(log P_S)`` (no
    cancellation in ``1 - sum``). With p|S = p/P_S and q|S = q/Q_S the distributions inside S:

        KL(P||Q) = sum_S p log(p/q) + sum_T p log(p/q)
                 = P_S KL(p|S || q|S) + P_S log(P_S/Q_S) + sum_T p log(p/q)
                >= P_S KL(p|S || q|S) + P_S log(P_S/Q_S) + P_T log(P_T/Q_T)     (log-sum inequality on T)
                 = P_S KL(p|S || q|S) + KL(Bern(P_S) || Bern(Q_S))               =: L
                >= P_S KL(p|S || q|S)                                             =: L_S  (Gibbs: KL >= 0)

    * Q_T > 0 after rounding (the usual case): ``L = sum_S p log(p/q) + P_T log(P_T/Q_T)``, computed by
      :func:`evalkit.evals.kl_topk.kl_from_summary` on a summary over a local vocabulary (S's columns
      plus one for the tail, whose one tail sample makes its estimate equal the bound): the emulation's
      bound, exactly 0 for an identity run.
    * Q_T rounds to <= 0 (the scheme's reported top-k probabilities sum to >= 1: its tail is below the
      rounding of the log-probs, or the lists cover the vocabulary): L needs log Q_T, which the
      numbers no longer give (any floor, such as 1e-30, makes P_T log(P_T/Q_T) arbitrary and can put
      the "bound" above the KL). The bound is then L_S, the part of L that does not depend on either
      tail mass: it uses only the log-prob differences inside S (so a common offset in the reported
      log-probs, such as a rounded log-normaliser, cancels) and P_S <= 1. L_S <= L <= KL by the lines
      above, for every true Q_T; where the tails are truly empty (P_T = Q_T = 0) L_S = L = KL, so it
      is the bound's limit there; where Q_T -> 0 with P_T > 0 the KL grows without limit and L_S stays
      a (loose) lower bound. An identity run gives exactly 0 here too (the same differences).
    """
    n = base.nll.numel()
    lower, tail_mass = torch.empty(n, dtype=torch.float64), torch.empty(n, dtype=torch.float64)
    for lo in range(0, n, chunk):
        sl = slice(lo, lo + chunk)
        # the baseline's columns: the actual token first, then its top-k without the actual token again
        b_ids = torch.cat([base.target[sl, None], base.ids[sl]], 1)
        b_lps = torch.cat([-base.nll[sl, None], base.lps[sl]], 1).double()
        q_ids = torch.cat([run.target[sl, None], run.ids[sl]], 1)
        q_lps = torch.cat([-run.nll[sl, None], run.lps[sl]], 1).double()
        dup = torch.zeros_like(b_ids, dtype=torch.bool)
        dup[:, 1:] = b_ids[:, 1:] == b_ids[:, :1]
        match = b_ids[:, :, None] == q_ids[:, None, :]
        found = match.any(-1) & ~dup
        lq_at = torch.where(match, q_lps[:, None, :], float("-inf")).amax(-1)
        lp = torch.where(found, b_lps, 0.0)
        lq = torch.where(found, lq_at, 0.0)
        log_ps = torch.where(found, lp, float("-inf")).logsumexp(-1)  # log P_S, float64
        log_qs = torch.where(found, lq, float("-inf")).logsumexp(-1)  # log Q_S
        log_pt = torch.where(log_ps < 0, log1mexp(log_ps.clamp(max=0)), float("-inf"))
        q_tail = log_qs < 0  # Q_T > 0 after rounding: L is computable
        log_qt = torch.where(q_tail, log1mexp(log_qs.clamp(max=0)), 0.0)  # 0 (Q_T = 1) is a placeholder, unused
        p_t = log_pt.exp()
        rows, width = b_ids.shape
        w = torch.where(found, (lp.exp() * P_SCALE), 0.0).half()
        local_lq = torch.cat([lq, log_qt[:, None]], 1).float()  # float32, as the emulation's log-probs
        log_pt32 = log_pt.float()  # rounded as log Q_T is, so an identity run gives exactly 0
        summary = {
            "head": torch.arange(width).expand(rows, width),
            "w": w,
            "t": rowdot(w.float(), lp.float()),
            "log_tail": log_pt32.double(),
            "tail": torch.full((rows, 2), width),
            "tail_lp": log_pt32[:, None].expand(rows, 2),
        }
        _, low, _ = kl_from_summary(summary, local_lq)
        # Q_T rounded to <= 0: L_S = P_S KL(p|S || q|S), from differences inside S only
        d = torch.where(found, (lp - log_ps[:, None]) - (lq - log_qs[:, None]), 0.0)
        low_s = log_ps.clamp(max=0).exp() * (torch.where(found, (lp - log_ps[:, None]).exp(), 0.0) * d).sum(-1)
        lower[sl], tail_mass[sl] = torch.where(q_tail, low.double(), low_s), p_t
    return None, lower, tail_mass
