"""gpu_check's decode sections: the storage path's decode step against what a user would run instead,
and the memory it holds (imported by benchmarks/gpu_check.py, which runs them as sections 4 and 5).

The reference is transformers' own static-cache step compiled as ``generate()`` compiles it
(``model.get_compiled_call``: ``torch.compile`` of the model's call, CUDA graphs on CUDA), fed what
``generate()`` feeds a decode step (one token per sequence, its position, the 4-D mask, the cache).
Beside it, the HBM floor of a step: the bytes it must read once (the weights and the cache, each as
stored) over the device's measured copy bandwidth. evalkit's storage path runs the same step through
its static storage cache (:class:`evalkit.integration.static_decode.StaticDecoder`, compiled the same
way). Both caches are filled by writing seeded random K/V through the cache (a prefill's write,
without its compute); every loop is warmed (the compile, then ``warmup`` replays) before
``steps`` steps are timed one by one (the median is the figure), and a profile of a few warm steps
gives the GPU-busy time of a step beside its wall time. The eager arms (transformers' DynamicCache
and evalkit's dynamic storage cache, neither compiled) are timed at the first context and batch, to
show what the storage path costs before any compilation.

Targets, judged on CUDA: the storage step at most ``SPEED_LIMIT`` x the reference's; the storage
run's peak memory over the weights at most ``MEMORY_LIMIT`` x the reference's (every FP8 scheme of
``MEMORY_SCHEMES`` at the first context and the largest batch; the probe scheme in every speed run);
every context and batch runs, and the long context runs under the probe scheme alone.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

GiB = 2**30
SPEED_LIMIT = 1.25  # storage step / transformers' compiled static-cache step
MEMORY_LIMIT = 0.6  # storage peak over the weights / the reference's, FP8 schemes
MEMORY_SCHEMES = (
    "fp8_e4m3/tensor/unit",
    "fp8_e4m3/tensor/dynamic",
    "fp8_e4m3/head/dynamic",
    "fp8_e5m2/tensor/unit",
    "fp8_e4m3/token/dynamic",
    "vllm:fp8_per_token_head",
)


def bandwidth(ctx) -> float:
    """Device bytes/s of a copy (read + write counted), measured once: the floor's denominator."""
    if getattr(ctx, "_bandwidth", None) is None:
        n = (1 * GiB if ctx.cuda else 64 * 2**20) // 4
        a = torch.empty(n, device=ctx.device)
        b = torch.empty_like(a)
        for _ in range(2):
            b.copy_(a)
        ctx.sync()
        t = time.perf_counter()
        for _ in range(5):
            b.copy_(a)
        ctx.sync()
        ctx._bandwidth = 2 * a.numel() * 4 * 5 / (time.perf_counter() - t)
        del a, b
    return ctx._bandwidth


def weights_bytes(model) -> int:
    seen = {}
    for p in model.parameters():
        seen.setdefault(p.data_ptr(), p.numel() * p.element_size())
    return sum(seen.values())


def _random_kv(model, context: int, batch: int, generator):
    from evalkit.models.info import kv_layout

    layout = kv_layout(model.config)
    shape = (batch, layout.num_kv_heads, context, layout.head_dim)
    for layer in range(layout.num_layers):
        k = torch.randn(shape, device=model.device, dtype=model.dtype, generator=generator)
        v = torch.randn(shape, device=model.device, dtype=model.dtype, generator=generator)
        yield layer, k, v


def _mask4d(batch: int, length: int, position: int, device) -> torch.Tensor:
    """``generate()``'s decode-step mask for unpadded rows: keys up to ``position`` (B, 1, 1, length), bool."""
    return (torch.arange(length, device=device) <= position).view(1, 1, 1, length).expand(batch, 1, 1, length)


def _time_steps(ctx, step, warmup: int, steps: int) -> tuple[list[float], float | None]:
    """Wall seconds of each of ``steps`` steps after ``warmup`` (each synchronised), and the GPU-busy
    seconds of a step from a profile of two more (None where the profiler saw no kernels)."""
    for _ in range(warmup):
        step()
    ctx.sync()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        ctx.sync()
        times.append(time.perf_counter() - t)
    busy = None
    if ctx.cuda:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(2):
                step()
            ctx.sync()
        total = sum(getattr(e, "self_device_time_total", 0) or 0 for e in prof.key_averages())
        busy = total / 2 / 1e6 if total else None
    return times, busy


def _peak_start(ctx) -> int | None:
    if not ctx.cuda:
        return None
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(ctx.device)
    return torch.cuda.memory_allocated(ctx.device)


def _peak(ctx, base: int | None) -> int | None:
    return None if base is None else torch.cuda.max_memory_allocated(ctx.device) - base


def _decode_from_here(ctx) -> None:
    """Forget the fill's peak (a prefill's write, with its own transients): the peak that follows is the
    decode's, over everything held by then."""
    if ctx.cuda:
        ctx.sync()
        torch.cuda.reset_peak_memory_stats(ctx.device)


def _compile_backend(ctx) -> dict:
    """The reference's compile: generate()'s (Inductor, CUDA graphs) on CUDA; the eager backend on the
    CPU self-test (Inductor's C++ build would take the budget and the CPU's speed is not judged)."""
    return {} if ctx.cuda else {"backend": "eager"}


def plain_compiled(ctx, model, context: int, batch: int) -> dict:
    """transformers' static-cache decode step, compiled as generate() compiles it."""
    from transformers import StaticCache

    from evalkit.integration.hf_compat import cache_keyword

    s = ctx.sizes
    length = context + s.warmup + s.steps + 4
    g = torch.Generator(device=ctx.device).manual_seed(context + batch)
    base = _peak_start(ctx)
    with torch.inference_mode():
        cache = StaticCache(config=model.config, max_cache_len=length)
        position = torch.arange(context, device=ctx.device)
        for layer, k, v in _random_kv(model, context, batch, g):
            cache.update(k, v, layer, cache_kwargs={"cache_position": position})
        del k, v
        _decode_from_here(ctx)
        options = _compile_backend(ctx)
        if options:
            forward = torch.compile(model.__call__, fullgraph=True, **options)
        else:
            from transformers import CompileConfig

            forward = model.get_compiled_call(CompileConfig(fullgraph=True))
        pass_position = "cache_position" in __import__("inspect").signature(type(model).forward).parameters
        tok = torch.randint(10, model.config.vocab_size, (batch, 1), device=ctx.device, generator=g)
        state = {"t": context}

        def step():
            t = state["t"]
            kwargs = {"cache_position": torch.tensor([t], device=ctx.device)} if pass_position else {}
            out = forward(
                input_ids=tok,
                attention_mask=_mask4d(batch, length, t, ctx.device),
                position_ids=torch.full((batch, 1), t, device=ctx.device),
                **{cache_keyword(model): cache},
                use_cache=True,
                **kwargs,
            )
            state["t"] = t + 1
            return out.logits

        t0 = time.perf_counter()
        step()
        ctx.sync()
        compile_s = time.perf_counter() - t0
        times, busy = _time_steps(ctx, step, s.warmup, s.steps)
        peak = _peak(ctx, base)
        kv = sum(layer.keys.numel() * layer.keys.element_size() * 2 for layer in cache.layers)

    return _result(
        "transformers static cache, compiled as generate()", context, batch, times, busy, compile_s, peak, kv
    )


def storage_compiled(ctx, model, scheme: str, context: int, batch: int, compiled: bool = True) -> dict:
    """evalkit's static storage cache, the step (with the LM head) compiled as the decode path compiles it."""
    from evalkit import quantized_kv
    from evalkit.integration.static_decode import StaticDecoder

    s = ctx.sizes
    length = context + s.warmup + s.steps + 4
    g = torch.Generator(device=ctx.device).manual_seed(context + batch)
    base = _peak_start(ctx)
    env = _env_backend(ctx)
    with torch.inference_mode(), quantized_kv(model, scheme) as session, env:
        mask = torch.ones(batch, length, dtype=torch.long, device=ctx.device)
        # the run's own length (rounded up to 16 positions), not its bucket: the reference cache holds exactly it
        dec = StaticDecoder(
            session, model.base_model, mask, context, length, compiled, head=model.lm_head, bucketed=False
        )
        for layer, k, v in _random_kv(model, context, batch, g):
            dec.cache.update(k, v, layer)
        del k, v
        fill_peak = _peak(ctx, base)
        _decode_from_here(ctx)
        tok = torch.randint(10, model.config.vocab_size, (batch, 1), device=ctx.device, generator=g)
        state = {"t": context}

        def step():
            t = state["t"]
            out = dec.step(tok, torch.full((batch, 1), t, device=ctx.device))
            state["t"] = t + 1
            return out

        t0 = time.perf_counter()
        step()
        ctx.sync()
        compile_s = time.perf_counter() - t0
        times, busy = _time_steps(ctx, step, s.warmup, s.steps)
        peak = _peak(ctx, base)
        engine, held = dec.cache.nbytes(), dec.cache.held_bytes()
        session.check_finite()

    label = f"evalkit storage {scheme}, {'compiled' if compiled else 'static, eager'}"
    out = _result(label, context, batch, times, busy, compile_s, peak, held)
    out.update(scheme=scheme, engine_bytes=engine, held_bytes=held, peak_fill_bytes_over_weights=fill_peak)
    return out


def _env_backend(ctx):
    """The CPU self-test compiles with the eager backend (see :func:`_compile_backend`)."""
    if ctx.cuda:
        return contextlib.nullcontext()
    import os
    from unittest import mock

    return mock.patch.dict(os.environ, {"EVALKIT_COMPILE_BACKEND": "eager"})


def eager_dynamic(ctx, model, scheme: str | None, context: int, batch: int) -> dict:
    """No compilation: transformers' DynamicCache (scheme None) or evalkit's dynamic storage cache."""
    from transformers import DynamicCache

    from evalkit import quantized_kv
    from evalkit.integration.hf_compat import cache_inputs

    s = ctx.sizes
    g = torch.Generator(device=ctx.device).manual_seed(context + batch)
    base = _peak_start(ctx)
    block = quantized_kv(model, scheme) if scheme else contextlib.nullcontext()
    with torch.inference_mode(), block as session:
        cache = session.new_cache(None) if scheme else DynamicCache(config=model.config)
        for layer, k, v in _random_kv(model, context, batch, g):
            cache.update(k, v, layer)
        del k, v
        _decode_from_here(ctx)
        tok = torch.randint(10, model.config.vocab_size, (batch, 1), device=ctx.device, generator=g)
        state = {"t": context}

        def step():
            t = state["t"]
            pos = torch.full((batch, 1), t, device=ctx.device)
            out = model(input_ids=tok, position_ids=pos, **cache_inputs(model, cache))
            state["t"] = t + 1
            return out.logits

        times, busy = _time_steps(ctx, step, s.warmup, s.steps)
        peak = _peak(ctx, base)
        if scheme:
            session.check_finite()

    label = f"evalkit storage {scheme}, dynamic cache, eager" if scheme else "transformers DynamicCache, eager"
    return _result(label, context, batch, times, busy, 0.0, peak, None)


def _result(arm, context, batch, times, busy, compile_s, peak, kv_bytes) -> dict:
    step = statistics.median(times)
    return {
        "arm": arm,
        "context": context,
        "batch": batch,
        "step_ms": step * 1e3,
        "step_ms_min": min(times) * 1e3,
        "steps": len(times),
        "gpu_busy_ms": None if busy is None else busy * 1e3,
        "tokens_per_s": batch / step,
        "first_step_s": round(compile_s, 3),
        "peak_bytes_over_weights": peak,
        "kv_bytes": kv_bytes,
    }


def floor_ms(ctx, model, kv_bytes: int) -> float:
    """The step's HBM floor: weights and cache read once, over the measured copy bandwidth."""
    return (weights_bytes(model) + kv_bytes) / bandwidth(ctx) * 1e3


def decode_speed(sec, ctx, model, probe_scheme: str) -> None:
    """Section 4: storage (compiled) vs transformers' compiled static-cache step at every context and
    batch, the long context under the probe scheme, and the eager arms at the first context and batch."""
    s = ctx.sizes
    configs = [(c, b) for c in s.contexts for b in s.batches]
    first = configs[0]

    def label(context, batch) -> str:
        return (
            f"decode at {context} context, batch {batch}: storage ({probe_scheme}, compiled) vs transformers compiled"
        )

    estimate = 0.0
    for i, (context, batch) in enumerate(configs):
        if not sec.fits(estimate):
            sec.cut(
                [label(c, b) for c, b in configs[i:]],
                f"cut: {max(sec.left(), 0):.1f} s left, next needs ~{estimate:.0f} s",
            )
            break
        t = time.perf_counter()
        try:
            plain = plain_compiled(ctx, model, context, batch)
            stored = storage_compiled(ctx, model, probe_scheme, context, batch)
        except torch.cuda.OutOfMemoryError as exc:
            sec.check(label(context, batch), False, reason=f"out of memory: {str(exc).splitlines()[0]}")
            continue
        ctx.speed_runs += [plain, stored]
        ratio = stored["step_ms"] / plain["step_ms"]
        mem = None
        if plain["peak_bytes_over_weights"]:
            mem = stored["peak_bytes_over_weights"] / plain["peak_bytes_over_weights"]
        ok = True if not ctx.cuda else ratio <= SPEED_LIMIT and mem is not None and mem <= MEMORY_LIMIT
        figures = {
            "storage_step_ms": stored["step_ms"],
            "reference_step_ms": plain["step_ms"],
            "storage_vs_reference": ratio,
            "limit": SPEED_LIMIT,
            "storage_gpu_busy_ms": stored["gpu_busy_ms"],
            "reference_gpu_busy_ms": plain["gpu_busy_ms"],
            "hbm_floor_ms_reference": floor_ms(ctx, model, plain["kv_bytes"]),
            "hbm_floor_ms_storage": floor_ms(ctx, model, stored["engine_bytes"]),
            "bandwidth_bytes_per_s": bandwidth(ctx),
            "peak_over_weights_storage_vs_reference": mem,
            "memory_limit": MEMORY_LIMIT,
            "first_step_s": {"reference": plain["first_step_s"], "storage": stored["first_step_s"]},
            "judged": ctx.cuda,
            "runs": [plain, stored],
        }
        sec.check(
            label(context, batch),
            ok,
            figures,
            "" if ctx.cuda else f"storage/reference {ratio:.2f}: not judged on the CPU's stand-in",
            seconds=time.perf_counter() - t,
        )
        estimate = (time.perf_counter() - t) * (2.0 if i + 1 < len(configs) and configs[i + 1][0] > context else 1.2)
        if (context, batch) == first and sec.fits(estimate):
            eager_pair(sec, ctx, model, probe_scheme, context, batch, plain)
    long_context(sec, ctx, model, probe_scheme)


def eager_pair(sec, ctx, model, scheme: str, context: int, batch: int, compiled_reference: dict) -> None:
    t = time.perf_counter()
    plain = eager_dynamic(ctx, model, None, context, batch)
    stored = eager_dynamic(ctx, model, scheme, context, batch)
    ctx.speed_runs += [plain, stored]
    ratio = stored["step_ms"] / plain["step_ms"]
    sec.check(
        f"eager decode at {context} context, batch {batch}: storage ({scheme}, dynamic cache) vs DynamicCache",
        True,
        {
            "storage_step_ms": stored["step_ms"],
            "plain_step_ms": plain["step_ms"],
            "storage_vs_plain": ratio,
            "storage_gpu_busy_ms": stored["gpu_busy_ms"],
            "plain_gpu_busy_ms": plain["gpu_busy_ms"],
            "compiled_reference_step_ms": compiled_reference["step_ms"],
            "runs": [plain, stored],
        },
        "reported, not judged: the eager path's cost before any compilation",
        seconds=time.perf_counter() - t,
    )


def long_context(sec, ctx, model, scheme: str) -> None:
    context = ctx.sizes.long_context
    name = f"decode at {context} context, batch 1: storage ({scheme}, compiled) runs"
    if not sec.fits(10.0):
        sec.skip(name, "cut: the section's share is used")
        return
    t = time.perf_counter()
    try:
        run = storage_compiled(ctx, model, scheme, context, 1)
    except torch.cuda.OutOfMemoryError as exc:
        sec.check(name, False, reason=f"out of memory: {str(exc).splitlines()[0]}")
        return
    ctx.speed_runs.append(run)
    figures = {**run, "hbm_floor_ms_storage": floor_ms(ctx, model, run["engine_bytes"])}
    sec.check(name, True, figures, seconds=time.perf_counter() - t)


def memory(sec, ctx, model) -> None:
    """Section 5: held bytes against the engine's (codes and scales; no full-precision copy) for every
    speed run, and the peak over the weights of every FP8 scheme against the reference's."""
    from evalkit.kv.memory import model_cache_bytes
    from evalkit.kv.scheme import parse_scheme
    from evalkit.models.info import kv_layout

    layout = kv_layout(model.config)
    for run in ctx.speed_runs:
        if run.get("engine_bytes") is None:
            continue
        length = run["context"] + ctx.sizes.warmup + ctx.sizes.steps + 4
        engine_full = model_cache_bytes(layout, parse_scheme(run["scheme"]), length, run["batch"])
        one_layer = 2 * run["batch"] * layout.num_kv_heads * length * layout.head_dim * model.dtype.itemsize
        ok = run["held_bytes"] <= engine_full + one_layer
        sec.check(
            f"memory at {run['context']} context, batch {run['batch']}: {run['arm']} holds the engine's bytes",
            ok,
            {
                "held_bytes": run["held_bytes"],
                "engine_bytes_at_max_len": engine_full,
                "one_layer_kv_model_dtype": one_layer,
                "engine_bytes_written": run["engine_bytes"],
                "peak_bytes_over_weights": run["peak_bytes_over_weights"],
            },
            "" if ok else "the cache holds more than the engine's bytes plus one layer's K/V",
        )
    context, batch = ctx.sizes.contexts[0], max(ctx.sizes.batches)
    reference = next(
        (
            r
            for r in ctx.speed_runs
            if r["arm"].startswith("transformers static") and (r["context"], r["batch"]) == (context, batch)
        ),
        None,
    )
    if reference is None or not sec.fits(5.0):
        sec.skip("peak memory of every FP8 scheme", "no reference run at this size, or no time left")
        return
    for scheme in MEMORY_SCHEMES:
        if not sec.fits(5.0):
            sec.skip(f"peak memory: {scheme}", "cut: the section's share is used")
            continue
        run = storage_compiled(ctx, model, scheme, context, batch, compiled=False)
        ratio = None
        if reference["peak_bytes_over_weights"]:
            ratio = run["peak_bytes_over_weights"] / reference["peak_bytes_over_weights"]
        ok = not ctx.cuda or (ratio is not None and ratio <= MEMORY_LIMIT)
        sec.check(
            f"peak memory at {context} context, batch {batch}: {scheme} vs transformers static cache",
            ok,
            {
                "peak_over_weights": run["peak_bytes_over_weights"],
                "reference_peak_over_weights": reference["peak_bytes_over_weights"],
                "ratio": ratio,
                "limit": MEMORY_LIMIT,
                "held_bytes": run["held_bytes"],
                "engine_bytes": run["engine_bytes"],
            },
            "" if ok else f"peak {ratio} of the reference's, over {MEMORY_LIMIT}",
        )
