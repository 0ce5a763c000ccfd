"""End-to-end conformance on vLLM: vLLM's own perplexity change against evalkit's emulation, inside float
noise (the shared statistics and token store: :mod:`evalkit.engines.conformance_e2e`).

For each scheme vLLM runs, :func:`end_to_end` measures on the same windows of a corpus, in the
model's dtype (``float32`` or ``bfloat16``: vLLM then runs with that ``dtype``), per scored token t:

* ``d_eng(t)``: vLLM with the FP8 cache minus vLLM unquantized (``kv_cache_dtype auto``), from its
  prompt log-probs (:mod:`evalkit.engines.vllm.runner`);
* ``d_emu(t)``: the emulation under the engine's profile (``vllm-cpu``: the store's rounding toward
  zero) minus the transformers model unquantized; ``d_rne(t)`` the same under plain
  round-to-nearest-even (evalkit's default);
* ``d_s(t)`` for every noise seed s: the profile emulation on a weight copy moved by a few ulps of
  its own dtype (:func:`evalkit.evals.float_noise.perturbed_model`), against that copy's own
  unquantized run (one perturbed baseline per seed, shared by all schemes).

Nearest-even is held against the engine by the same rule and the same noise quantiles (``rne_*``
columns; the profile's noise stands for the float noise of this model's FP8-cache forward).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from evalkit.engines.conformance_e2e import (
    NOISE_SEEDS,
    NOISE_ULPS,
    Settings,
    _change,
    compare_scheme,
    noise_changes,
    prepared_emulation,
    save_tokens,
)
from evalkit.errors import EvalkitError
from evalkit.evals import paired_stats as ps

DTYPES = ("float32", "bfloat16")
DEFAULT_SCHEMES = (
    "fp8_e4m3/tensor/unit",
    "fp8_e5m2/tensor/unit",
    "fp8_e4m3/tensor/static+scales=calibration/smollm2-135m-tensor-amax.safetensors",
)


def end_to_end(
    model: str = "embedded",
    schemes=DEFAULT_SCHEMES,
    corpus: str = "embedded",
    windows: int = 4,
    length: int = 512,
    *,
    dtype: str = "float32",
    model_dir: str | None = None,
    noise_seeds=tuple(range(1, NOISE_SEEDS + 1)),
    ulps: float = NOISE_ULPS,
    settings: Settings | None = None,
    tokens_path: str | Path | None = None,
    workdir: str | Path | None = None,
    top_k: int | None = None,
    progress=None,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """One row per scheme (see the module docstring). ``model`` (or ``model_dir``) is anything
    ``evalkit.models.loading.load_model`` takes; vLLM loads the folder it resolves to. ``schemes``:
    Scheme objects or strings, mapped through the profile of ``device``'s engine (``vllm-cpu`` on cpu,
    ``vllm-cuda`` on cuda: the rounding is the engine's); the emulation runs on the same device.
    ``tokens_path``: where the per-token arrays go (:func:`save_tokens`)."""
    from evalkit.engines.vllm.backend import VllmBackend
    from evalkit.engines.vllm.runner import DEFAULT_TOP_K, engine_config, profile_for
    from evalkit.evals.perplexity.evaluation import PerplexityEval
    from evalkit.kv.formats import Recipe, Rounding
    from evalkit.kv.scheme import parse_scheme
    from evalkit.models.loading import cache_root, load_model

    say = progress or (lambda text: None)
    settings = settings or Settings()
    if dtype not in DTYPES:
        raise EvalkitError(f"--dtype {dtype}: conformance runs the model in {' or '.join(DTYPES)}")
    if len(tuple(noise_seeds)) < 2:
        raise EvalkitError("conformance needs at least 2 noise seeds for a noise quantile (default 20)")
    profile_name = profile_for(device)
    configs = [engine_config(s, profile_name) for s in schemes]  # one line for what it cannot run, before any load
    configs = [c for c in configs if c.kv_cache_dtype != "auto"]
    if not configs:
        raise EvalkitError("end-to-end conformance needs at least one quantized scheme the engine runs")
    backend = VllmBackend(top_k=top_k or DEFAULT_TOP_K)
    if backend.profile != profile_name:
        raise EvalkitError(
            f"end-to-end conformance on {device} needs vLLM's {device} build; this environment's vLLM runs on "
            f"{backend.device}: use --device {backend.device}"
        )
    lm = load_model(model_dir or model, dtype=dtype, device=device)
    backend.check([c.emulation for c in configs], lm.layout)
    workdir = Path(workdir) if workdir is not None else cache_root() / "work"
    params = dict(corpus=corpus, window=length, stride=length, max_windows=windows, bootstrap_samples=100)

    profile = [parse_scheme(c.emulation) for c in configs]
    say("emulation baseline")
    emu = prepared_emulation(params, workdir, lm)
    per = [{} for _ in configs]
    for i, scheme in enumerate(profile):
        say(f"{scheme}: emulation (profile, rne)")
        scores = emu.token_scores(lm, scheme)
        per[i]["profile"], emu_base_nll = _change(scores), scores.base_nll.double()
        per[i]["rne"] = _change(
            emu.token_scores(lm, dataclasses.replace(scheme, rounding=Rounding.RNE, recipe=Recipe.STANDARD))
        )
    noise = noise_changes(lm, profile, noise_seeds, ulps, params, workdir, say)
    say("engine baseline (kv_cache_dtype auto)")
    eng = PerplexityEval(params, backend=backend)
    eng.prepare(lm, workdir)
    base_gap = float((backend.base.nll - emu_base_nll).mean())
    ids = ps.block_ids(emu.offsets, settings.block)
    rows = []
    for i, (config, scheme) in enumerate(zip(configs, profile)):
        say(f"{scheme}: engine")
        e = eng.token_scores(lm, scheme)
        per[i]["engine"] = _change(e)
        per[i]["noise"] = noise[i]
        rows.append(_row(scheme, config, per[i], compare_scheme(per[i], ids, settings), e, base_gap, dtype))
    if tokens_path is not None:
        meta = {"noise_seeds": [int(s) for s in noise_seeds], "ulps": ulps, "dtype": dtype, "windows": windows}
        save_tokens(Path(tokens_path), [str(s) for s in profile], per, emu.offsets, settings, meta)
    return rows


def _row(scheme, config, arrays, comparisons, e, base_gap, dtype) -> dict[str, Any]:
    def rounded(c: dict, prefix: str = "") -> dict[str, Any]:
        return {prefix + k: (round(v, 4) if isinstance(v, float) else v) for k, v in c.items()}

    rne = {k: v for k, v in comparisons["rne"].items() if k not in ("noise_gap_pp", "noise_r", "n_tokens")}
    return {
        "scheme": str(scheme),
        "kv_cache_dtype": config.kv_cache_dtype,
        "dtype": dtype,
        "engine_dppl_pct": round(ps.dppl_pct(arrays["engine"]), 4),
        "emulation_dppl_pct": round(ps.dppl_pct(arrays["profile"]), 4),
        "emulation_rne_dppl_pct": round(ps.dppl_pct(arrays["rne"]), 4),
        **rounded(comparisons["profile"]),
        **rounded(rne, "rne_"),
        "noise_seeds": len(arrays["noise"]),
        "noise_gaps_pp": comparisons["noise_gaps_pp"],
        "noise_rs": comparisons["noise_rs"],
        "baseline_nll_gap": float(f"{base_gap:.3g}"),
        "engine": f"vllm {e.info.get('engine_version')} {e.info.get('attention_backend')}",
        "kl_lower_bound_engine": round(float(e.kl_lower.mean()), 6),
    }
