"""End-to-end conformance, the part every engine shares: an engine's own perplexity change against
evalkit's emulation, inside float noise.

An engine's check (vLLM's :mod:`evalkit.engines.vllm.end_to_end`, llama.cpp's
:mod:`evalkit.engines.llamacpp.conformance`) measures on the same windows of a corpus, per scored token t,
``d_eng(t)`` (the engine with the quantized cache minus the engine unquantized), ``d_emu(t)`` (the
emulation under the engine's profile minus the model unquantized), ``d_rne(t)`` (the same under plain
round-to-nearest-even) and ``d_s(t)`` per noise seed (the profile emulation on a weight copy moved by a
few ulps). :func:`compare_scheme` turns them into the statistics and the verdict
(:mod:`evalkit.evals.paired_stats`): the gap ``Δppl_emu - Δppl_eng`` (pp) and the per-token r of ``d_eng``
with ``d_emu``, each with a paired block-bootstrap interval; the noise quantiles; "differs" / "conforms" /
"cannot tell at this n".

Every per-token array is kept, rounded to float32, in ``conformance_tokens.safetensors`` beside
``conformance.json`` (:func:`save_tokens`), and the verdicts are computed from those float32 values,
so :func:`verdicts_from_tokens` recomputes them offline, without the engine, to the last digit.
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


def prepared_emulation(params: dict, workdir: Path, lm):
    """evalkit's perplexity evaluation over the conformance windows (``params``), prepared on ``lm``
    (the loaded model, or its weight copy moved by a few ulps)."""
    from evalkit.evals.perplexity.evaluation import PerplexityEval

    ev = PerplexityEval(params)
    ev.prepare(lm, workdir)
    return ev


def noise_changes(lm, schemes, noise_seeds, ulps: float, params: dict, workdir: Path, say) -> list[np.ndarray]:
    """Per scheme, the emulation's per-token change on each weight copy moved by ``ulps``
    (:func:`evalkit.evals.float_noise.perturbed_model`), one row per noise seed: the float noise an
    engine's gap is held against. Each copy is dropped before the next is made."""
    from evalkit.evals.float_noise import perturbed_model

    noise = [[] for _ in schemes]
    for seed in noise_seeds:
        say(f"noise seed {seed}: baseline and {len(schemes)} schemes on weights moved by {ulps:g} ulp")
        loaded = dataclasses.replace(lm, model=perturbed_model(lm.model, seed, ulps))
        ev = prepared_emulation(params, workdir, loaded)
        for i, scheme in enumerate(schemes):
            noise[i].append(_change(ev.token_scores(loaded, scheme)))
        del loaded, ev
    return [np.stack(n) for n in noise]


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


def to_frame(rows: list[dict[str, Any]]):
    """The rows as a pandas DataFrame (one per scheme)."""
    import pandas as pd

    return pd.DataFrame(rows).set_index("scheme")
