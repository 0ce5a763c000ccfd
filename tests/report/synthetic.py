"""Per-window Δppl units for SYNTHETIC stores (``info["units"]`` of an overall Δppl row, as
:func:`evalkit.evals.perplexity.float_spread.units_info` writes it), so the report's paired order
(:mod:`evalkit.report.order`) has something to pair.

Each window's NLL-change sum is ``tokens x (log1p(rel) + COMMON[w] + own x z)``: ``COMMON`` is the same
for every scheme (hard windows are hard for all of them: it widens the marginal intervals and cancels in
a paired difference), ``z`` a fixed standard-normal draw per scheme (``key``), realisation and window. ``LAYOUT`` is the tiny KV layout the report tests record as a run's ``kv_layout``."""

from __future__ import annotations

import math

import numpy as np

COMMON = (0.004, -0.003, 0.006, -0.005, 0.002, -0.004, 0.001, -0.001)  # sums to 0
TOKENS = 100

# a tiny KV layout (2 layers, 2 KV heads, head_dim 16): what the report tests record as a run's kv_layout
LAYOUT = {
    "model_type": "llama",
    "num_layers": 2,
    "num_kv_heads": 2,
    "head_dim": 16,
    "v_head_dim": 16,
    "sliding_layers": [],
    "sliding_window": None,
    "max_positions": 512,
}


def units(rel: float, seeds: int = 0, own: float = 0.001, key: int = 0, pattern=None) -> dict:
    """The units of a row whose Δppl is about ``rel``, over ``len(COMMON)`` windows and ``seeds`` + 1
    float realisations; ``own``: the scheme's own per-window noise (per-token mean NLL change);
    ``pattern``: a fixed per-window offset of the scheme's own (for a paired difference chosen exactly)."""
    z = np.random.default_rng(key).standard_normal((seeds + 1, len(COMMON)))
    extra = np.zeros(len(COMMON)) if pattern is None else np.asarray(pattern, dtype=np.float64)
    d = TOKENS * (math.log1p(rel) + np.asarray(COMMON) + extra + own * z)
    return {
        "unit": "window",
        "tokens": [TOKENS] * len(COMMON),
        "seeds": list(range(seeds + 1)),
        "d_sum": d.tolist(),
    }
