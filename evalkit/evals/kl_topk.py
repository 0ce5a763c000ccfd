"""KL(P || Q) per scored position from a baseline summary of 2 KB, whatever the vocabulary.

Storing the baseline's whole next-token distribution costs 2 bytes x vocabulary per position
(256 KB for a 128k vocabulary: 77 GB for wikitext-2's test split). The baseline pass keeps instead,
per position, :data:`BYTES_PER_POSITION` = 2008 bytes (:func:`summarize`):

* the head S: the ``K = 160`` most probable tokens, as int32 ids and float16 weights
  ``w_v = fp16(p_v * 2^15)``, with ``t = sum_S w_v log p_v`` (float32, from the exact log p);
* the tail T (every other token): its log-mass ``log P_T`` (float64, a logsumexp over T);
* ``m = 128`` tail samples, drawn as in 4. below: int32 ids and float32 ``log p``;
* and the perplexity's own NLL (float32) and argmax (int64): 160 * 6 + 128 * 8 + 24 = 2008 B.

A scheme's log-probs ``log q`` (computed anyway for its NLL) give, per position
(:func:`kl_from_summary`; exactly 0 for an identity scheme, the same operations on the same numbers):

    KL = sum_S p log(p/q) + sum_T p log(p/q)

1. Head, exact: ``H = (t - sum_S w_v log q_v) / 2^15``, up to the float16 rounding of the weights
   (relative 2^-12 each, zero-mean; as llama.cpp's ``--kl-divergence-base`` stores them).
2. Tail, proven lower bound. By the log-sum inequality, sum_T p log(p/q) >= P_T log(P_T/Q_T), with
   Q_T the scheme's tail mass (a logsumexp of ``log q`` over T), so for every Q

       L = H + P_T log(P_T / Q_T)  <=  KL.

   The gap is exactly KL - L = P_T * KL(p~ || q~), with p~ = p/P_T and q~ = q/Q_T the tail
   distributions: the KL inside the tail weighted by its mass. On the embedded model (49k
   vocabulary) P_T averages 6 % at K = 160 and L falls about 5 % short of the KL.
3. No useful upper bound exists from any summary this small. Given S, the p on S, P_T and that no
   tail p exceeds p_(K), the true P may put its tail mass on the tail tokens where Q is smallest:
   the supremum of KL - L is about P_T log(p_(K) / min_T q), tens of nats times P_T, for every Q.
   A two-sided bound would need to know where P's tail mass sits relative to Q, and Q is unknown
   when the baseline is stored. So the gap is estimated, without bias and never below L:
4. Tail sampling. The tail, sorted by p, is cut into m strata of equal mass P_T/m; sample j is the
   token at CDF position (j + U_j)/m, U_j iid uniform on [0, 1) (a fixed seed: every scheme sees
   the same samples). Inverse-CDF sampling inside each stratum makes, for any function f,
   E[(1/m) sum_j f(x_j)] = E_{p~}[f] exactly. With d = log(q~/p~), take the estimator

       f = (q~/p~ - 1) - log(q~/p~) = expm1(d) - d  >=  0,      E_{p~}[q~/p~ - 1] = sum_T q~ - 1 = 0,

   so E_{p~}[f] = KL(p~ || q~) (the control variate q~/p~ - 1 cancels the first-order noise of
   log(p~/q~): f is second order in d). The zero mean of q~/p~ - 1 holds only as far as P_T and
   Q_T agree with the log-probs used in d: both tail masses are therefore summed in float64 (in
   float32 their 1e-7 relative error biased a KL of 1e-6 nats by 10-50 %). Hence

       K^ = L + P_T (1/m) sum_j f(x_j)

   is an unbiased estimate of KL, and K^ >= L at every position (f >= 0): it never contradicts
   the proven bound. Var(K^) <= P_T^2 Var_{p~}(f) / m (stratification never increases the
   variance of the mean over m independent draws); positions draw independently, so the mean over
   N positions has standard error sqrt(sum_i Var_i) / N, estimated by pairing neighbouring strata,
   Var_i ~ P_T^2 sum_pairs (f_2k - f_2k+1)^2 / m^2 (biased upward), and reported as
   ``kl_sampling_se``. The bootstrap interval over windows resamples whole positions, so it
   includes this noise.

Reported: ``kl_mean`` is the mean of K^ (each clamped at 0 against float32 noise, ~1e-6 nats); its
info gives the method, ``kl_lower_bound`` (the mean of L: proven never above the true mean KL up
to the weights' rounding), ``kl_tail_mass`` (the mean P_T) and ``kl_sampling_se``. Measured on the
embedded model over 1020 positions, eight sample seeds: the estimate within 0.04 % of the
full-vocabulary KL on average, spread 0.06-0.08 % (sd), matching the reported standard error,
for fp8 and int4 schemes with KL from 0.008 to 1 nat.
"""

from __future__ import annotations

import torch

from evalkit.evals.output_head import P_SCALE, rowdot

TOP_K = 160  # head tokens stored per position: int32 id + float16 weight
TAIL_SAMPLES = 128  # stratified tail samples per position: int32 id + float32 log p (an even number)
SCALAR_DTYPES = {"nll": torch.float32, "argmax": torch.int64, "t": torch.float32, "log_tail": torch.float64}
SCALAR_BYTES = sum(torch.empty(0, dtype=d).element_size() for d in SCALAR_DTYPES.values())  # 4 + 8 + 4 + 8
BYTES_PER_POSITION = TOP_K * (4 + 2) + TAIL_SAMPLES * (4 + 4) + SCALAR_BYTES  # 2008 <= 2048
METHOD = (
    f"top-{TOP_K} exact + tail mass (lower bound: log-sum inequality) + {TAIL_SAMPLES} stratified tail "
    f"samples (unbiased, >= the bound); {BYTES_PER_POSITION} B per token stored"
)
SUMMARY_KEYS = ("head", "w", "t", "log_tail", "tail", "tail_lp")
# the summary's per-position arrays as a cached baseline stores them (.npy memory maps, numpy dtype strings);
# the scalars (SCALAR_DTYPES) go to safetensors
ARRAY_DTYPES = {"head": "<i4", "w": "<f2", "tail": "<i4", "tail_lp": "<f4"}


def tail_logmass(lp: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """log of the probability mass outside the ``head`` ids, per row, summed in float64 (-inf when
    nothing is outside)."""
    return lp.double().scatter_(1, head, float("-inf")).logsumexp(-1)


def summarize(
    lp: torch.Tensor, generator: torch.Generator, top_k: int = TOP_K, samples: int = TAIL_SAMPLES
) -> dict[str, torch.Tensor]:
    """The baseline's summary of each row of log-probs ``lp`` (rows, vocab); see the module docstring.
    ``generator`` (CPU) draws the stratified offsets, in row order."""
    rows, vocab = lp.shape
    k = min(top_k, vocab)
    order = lp.argsort(-1, descending=True)
    head = order[:, :k]
    w = (lp.gather(1, head).exp() * P_SCALE).half()
    u = torch.rand(rows, samples, generator=generator, dtype=torch.float64).to(lp.device)
    if k < vocab:
        tail = order[:, k:]
        cdf = lp.gather(1, tail).double().exp().cumsum(-1)
        u = (torch.arange(samples, device=lp.device, dtype=torch.float64) + u) / samples * cdf[:, -1:]
        picks = tail.gather(1, torch.searchsorted(cdf, u).clamp_(max=vocab - k - 1))
    else:  # the head is the whole vocabulary: no tail (P_T = 0 weighs the samples out)
        picks = head[:, :1].expand(rows, samples)
    return {
        "head": head.int(),
        "w": w,
        "t": rowdot(w.float(), lp.gather(1, head)),
        "log_tail": tail_logmass(lp, head),
        "tail": picks.int(),
        "tail_lp": lp.gather(1, picks),
    }


def kl_from_summary(
    summary: dict[str, torch.Tensor], lq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row, in float64: the KL estimate K^ (clamped at 0), the proven lower bound L, and the
    estimated variance of K^ (tail sampling), from a baseline :func:`summarize` and the scheme's
    log-probs ``lq`` (rows, vocab)."""
    head = summary["head"].long()
    h = ((summary["t"] - rowdot(summary["w"].float(), lq.gather(1, head))) / P_SCALE).double()
    log_pt = summary["log_tail"].double()
    pt = log_pt.exp()
    has_tail = pt > 0
    log_ratio = torch.where(has_tail, log_pt - tail_logmass(lq, head), 0.0)  # log(P_T / Q_T)
    d = (lq.gather(1, summary["tail"].long()) - summary["tail_lp"]).double() + log_ratio[:, None]  # log(q~/p~)
    f = torch.where(has_tail[:, None], torch.expm1(d) - d, 0.0)
    m = f.shape[1]
    lower = h + pt * log_ratio
    kl = (lower + pt * f.mean(-1)).clamp_min_(0)
    var = pt.square() * (f[:, 0::2] - f[:, 1::2]).square().sum(-1) / m**2
    return kl, lower, var
