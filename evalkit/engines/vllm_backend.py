"""The perplexity eval's log-prob backend through vLLM (:class:`VllmBackend`), and ``evalkit run
--engine vllm``'s set-up of it (:func:`engine_backend`).

The backend runs prompts through :class:`~evalkit.engines.vllm_runner.VllmRunner` (see
:mod:`evalkit.evals.perplexity.evaluation` for the seam): the engine's own unquantized run (``kv_cache_dtype="auto"``, same
dtype) is the baseline; NLL and perplexity are exact from the engine's log-probs, top-1 agreement is
taken from its top-k, and KL(baseline || scheme) is the proven lower bound of
:mod:`evalkit.evals.kl_topk` over the tokens both runs returned (the top-k gives no estimate of the
rest), reported as ``kl_lower_bound`` with ``kl_bound: true``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from evalkit.engines.vllm_kernel import check_vllm_available
from evalkit.engines.vllm_runner import (DEFAULT_TOP_K, ENGINE, KV_CACHE_BYTES, PROFILE, EngineConfig, VllmRunner,
                                         engine_config)
from evalkit.errors import EvalkitError

KL_METHOD = ("proven lower bound (kl_topk log-sum inequality) over the tokens both the baseline's and the scheme's "
             "top-k returned, the rest of the vocabulary as one aggregate; no estimate of the gap")


# -- the perplexity eval's backend ---------------------------------------------------------------------------
@dataclass
class _EngineRun:
    nll: torch.Tensor  # (n,) float64
    ids: torch.Tensor  # (n, k) int64, by rank
    lps: torch.Tensor  # (n, k) float64
    target: torch.Tensor  # (n,) int64 the actual next tokens


class VllmBackend:
    """The perplexity eval's log-prob backend through vLLM (see the module docstring)."""

    name = ENGINE

    def __init__(self, top_k: int = DEFAULT_TOP_K, kv_cache_bytes: int = KV_CACHE_BYTES, seed: int = 0):
        check_vllm_available()
        self.top_k, self.kv_cache_bytes, self.seed = top_k, kv_cache_bytes, seed
        self.seconds: dict[str, float] = {}

    def check(self, schemes, layout=None) -> list[EngineConfig]:
        """The engine configuration of each scheme: EvalkitError (one line) for one it cannot run
        (with ``layout``, a model's KV layout, also what the engine needs of the model)."""
        from evalkit.engines.profiles import get_profile
        from evalkit.kv.scheme import parse_scheme

        configs = [engine_config(s) for s in schemes]
        if layout is not None:
            for c in configs:
                get_profile(PROFILE).check(parse_scheme(c.emulation), layout)
        return configs

    def prepare(self, ev, lm, workdir: Path) -> None:
        """The engine's own unquantized run (kv_cache_dtype auto, the model's dtype): the baseline."""
        self.model_dir = lm.path
        self.dtype = str(next(lm.model.parameters()).dtype).removeprefix("torch.")
        self.prompts, self.first_targets = [], []
        for ids, t0 in ev.window_inputs():
            self.prompts.append(ids.tolist())
            self.first_targets.append(t0)
        self.max_model_len = max(len(p) for p in self.prompts) + 1
        self.base, self.base_info = self.run(EngineConfig("auto"))

    def start(self, config: EngineConfig) -> VllmRunner:
        """An engine for ``config`` on the prepared model (close it, or use it as a context manager)."""
        return VllmRunner(self.model_dir, dtype=self.dtype, kv_cache_dtype=config.kv_cache_dtype, scales=config.scales,
                          skip_layers=config.skip_layers, max_model_len=self.max_model_len, top_k=self.top_k,
                          kv_cache_bytes=self.kv_cache_bytes, seed=self.seed)

    def run(self, config: EngineConfig) -> tuple[_EngineRun, dict]:
        """The scored tokens' log-probs of every window through one engine started for ``config``."""
        import time

        start = time.perf_counter()
        with self.start(config) as runner:
            loaded = time.perf_counter()
            run = self.collect(runner)
            info = runner.info()
        info.update(config.to_dict(), engine_profile=PROFILE, engine_load_seconds=round(loaded - start, 3),
                    engine_score_seconds=round(time.perf_counter() - loaded, 3))
        return run, info

    def collect(self, runner: VllmRunner) -> _EngineRun:
        """The windows' prompt log-probs from a started engine, as the eval's scored tokens."""
        outs = runner.prompt_logprobs(self.prompts)
        # prompt row j-1 predicts input j; the eval scores inputs t0..end of each window
        sl = [slice(t0 - 1, None) for t0 in self.first_targets]
        return _EngineRun(nll=-torch.from_numpy(np.concatenate([o.target[s] for o, s in zip(outs, sl)])),
                          ids=torch.from_numpy(np.concatenate([o.ids[s] for o, s in zip(outs, sl)])),
                          lps=torch.from_numpy(np.concatenate([o.lps[s] for o, s in zip(outs, sl)])),
                          target=torch.tensor([t for p, t0 in zip(self.prompts, self.first_targets) for t in p[t0:]]))

    def score(self, ev, lm, scheme):
        config = engine_config(scheme)
        run, info = (self.base, self.base_info) if config.kv_cache_dtype == "auto" else self.run(config)
        return self.scores(run, info)

    def scores(self, run: _EngineRun, info: dict):
        """The eval's per-token scores of an engine run against the engine's baseline."""
        from evalkit.evals.perplexity.evaluation import TokenScores

        _, lower, tail = kl_lower_bound(self.base, run)
        return TokenScores(nll=run.nll, base_nll=self.base.nll, agree=run.ids[:, 0] == self.base.ids[:, 0], kl=None,
                           kl_lower=lower, kl_var=None, kl_tail_mass=tail,
                           info={**info, "kl_method": KL_METHOD, "kl_bound": True})


def engine_backend(args, schemes: list) -> tuple[VllmBackend, list]:
    """``evalkit run --engine vllm``: the backend and the schemes as the engine runs them (the
    vllm-cpu profile applied), or EvalkitError (one line) before anything loads or is written."""
    from evalkit.kv.scheme import parse_scheme

    if args.eval_name != "perplexity":
        raise EvalkitError(f"--engine vllm runs --eval perplexity only, not {args.eval_name}: drop --engine or use --eval perplexity")
    if getattr(args, "engine_profile", None) not in (None, PROFILE):
        raise EvalkitError(f"--engine vllm runs vLLM's CPU kernels: its profile is {PROFILE}, not {args.engine_profile}")
    if str(args.device) != "cpu" or args.device_map is not None:
        raise EvalkitError(f"--engine vllm runs vllm-cpu, on the CPU: drop --device {args.device}"
                           + (" and --device-map" if args.device_map is not None else ""))
    mapped = [parse_scheme(engine_config(s).emulation) for s in schemes]
    return VllmBackend(), list(dict.fromkeys(mapped))


def kl_lower_bound(base: _EngineRun, run: _EngineRun, chunk: int = 4096) -> tuple[None, torch.Tensor, torch.Tensor]:
    """Per position, kl_topk's proven lower bound of KL(base || run) from two top-k lists: the head S is
    the tokens both returned (the actual next token always among them), the tail everything else, so
    ``L = sum_S p log(p/q) + P_T log(P_T/Q_T)`` (log-sum inequality). Computed by
    :func:`evalkit.evals.kl_topk.kl_from_summary` on a summary over a local vocabulary (S's columns
    plus one for the tail), whose tail sample is that one column: its estimate then equals the bound.
    Returns (None, bound, P_T)."""
    from evalkit.evals.output_head import P_SCALE, rowdot
    from evalkit.evals.kl_topk import kl_from_summary

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
        summary = {"head": torch.arange(width).expand(rows, width), "w": w, "t": rowdot(w.float(), lp.float()),
                   "log_tail": log_pt.double(), "tail": torch.full((rows, 2), width), "tail_lp": log_pt[:, None].expand(rows, 2)}
        _, low, _ = kl_from_summary(summary, local_lq)
        lower[sl], tail_mass[sl] = low.double(), p_t
    return None, lower, tail_mass
