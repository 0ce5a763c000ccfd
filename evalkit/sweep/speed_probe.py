"""Measuring a device for the dry run's speed model (:mod:`evalkit.sweep.throughput`): a short probe of a
loaded model through evalkit's paths, or a timed product and copy on this machine's device.

``probe`` (:func:`probe`, :func:`probe_model`): the model and its device are here. It is loaded as the
sweep loads it and timed under :data:`PROBE_SCHEME`, every loop warmed first: a forward of
:data:`PROBE_TOKENS` tokens (on a GPU :data:`PROBE_TOKENS_CUDA`) gives the FLOP/s, a timed copy the
bandwidth, the median of :data:`PROBE_STEPS` warm eager decode steps at batch 1 the host overhead.
``measured device`` (:func:`measured_device`): a timed product and copy, scaled to what a forward
reaches. Apart from the model they feed, because these run torch and time things, and the model does
neither: :class:`~evalkit.sweep.throughput.Speed` prices what they measured.
"""

from __future__ import annotations

import statistics
import time

from evalkit.sweep.throughput import (
    BANDWIDTH_UTILISATION,
    COPY_UTILISATION,
    DISK_READ_BYTES_S,
    FLOPS_UTILISATION,
    GRAPH_S,
    KERNELS_PER_LAYER,
    LAUNCH_S,
    MATMUL_UTILISATION,
    Speed,
    default_compiled,
    forward_flops,
    kv_traffic,
    path_text,
    stored_bytes,
)

PROBE_TOKENS = 128  # the probe's forward on a CPU
PROBE_TOKENS_CUDA = 2048  # on a GPU: shorter forwards are bound by the launches (~20 ms for an 8B model)
PROBE_REPEATS = 2  # timed forwards after one warm-up of the same length; the quickest counts
PROBE_PREFILL = 16  # the decode steps' prompt
PROBE_WARMUP = 8  # untimed decode steps first: a process's first loop is not warm after 3 steps
PROBE_STEPS = 8  # timed decode steps, each synchronised; the median counts
PROBE_SCHEME = "fp8_e4m3/tensor/dynamic"


def _copy_bandwidth(dev, sync) -> float:
    """Bytes/s of a timed copy on ``dev`` (read and write), after one untimed copy."""
    import torch

    big = torch.empty(64 * 2**20 if dev.type == "cpu" else 2**30, dtype=torch.uint8, device=dev)
    return 2 * big.numel() / min(timed(big.clone, sync, warmup=1, repeats=3))


def timed(step, sync, warmup: int, repeats: int) -> list[float]:
    """Seconds of ``repeats`` calls of ``step`` after ``warmup`` untimed ones, each call synchronised
    (``sync``): the first calls of a process (allocations, kernel choice, caches) are not a run's speed."""
    for _ in range(warmup):
        step()
    sync()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        sync()
        out.append(time.perf_counter() - start)
    return out


def _syncer(dev):
    import torch

    return (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)


def measured_device(facts, device: str, dtype_bytes: float, compiled: bool | None = None) -> Speed:
    """FLOP/s of a timed matrix product and bytes/s of a timed copy on this machine's ``device``,
    scaled to what a forward reaches; the decode path of ``device`` (the grid's) unless ``compiled``."""
    import torch

    dev = torch.device(device if device.startswith("cuda") and torch.cuda.is_available() else "cpu")
    sync = _syncer(dev)
    dtype = torch.float32 if dev.type == "cpu" or dtype_bytes >= 4 else torch.bfloat16
    n = 1024 if dev.type == "cpu" else 8192
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    product = 2 * n**3 / min(timed(lambda: a @ b, sync, warmup=1, repeats=4))
    copy = _copy_bandwidth(dev, sync)
    compiled = default_compiled(device) if compiled is None else compiled
    kernels = KERNELS_PER_LAYER * facts.layers
    where = f"this machine's {dev.type}" + (
        "" if dev.type == device.split(":")[0] else f" (the grid's {device} is not here)"
    )
    return Speed(
        product * FLOPS_UTILISATION / MATMUL_UTILISATION,
        copy * BANDWIDTH_UTILISATION / COPY_UTILISATION,
        kernels * LAUNCH_S,
        facts.weight_bytes / DISK_READ_BYTES_S,
        "measured device",
        f"analytic, measured on {where}: {product / 1e9:,.0f} GFLOP/s ({str(dtype).removeprefix('torch.')} "
        f"{n}x{n} product) x {FLOPS_UTILISATION / MATMUL_UTILISATION:.2f}, {copy / 1e9:,.1f} GB/s copy "
        f"x {BANDWIDTH_UTILISATION / COPY_UTILISATION:.2f}; "
        + path_text(compiled, kernels, kernels * LAUNCH_S, kernels * GRAPH_S),
        compiled,
        kernels * GRAPH_S,
        default_compiled(device),
        "cuda" if default_compiled(device) else "cpu",
    )


def device_available(device: str) -> bool:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.is_available()
    return device in ("cpu", "auto") or device.startswith("cpu")


def probe(spec, facts, compiled: bool | None = None) -> Speed:
    """Load the model as the sweep does and time a forward and warm decode steps through evalkit's paths."""
    from transformers.utils import logging as hf_logging

    from evalkit.models.loading import load_model_with

    start = time.perf_counter()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Loading weights" bar in the dry run's output
    try:
        lm = load_model_with(spec.name, spec)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return probe_model(lm, facts, load_seconds=time.perf_counter() - start, compiled=compiled)


def probe_model(lm, facts, load_seconds: float = 0.0, compiled: bool | None = None) -> Speed:
    """Time a forward, a copy and warm eager decode steps of an already loaded model (a ``LoadedModel``)
    through evalkit's paths; :func:`probe` after loading, and ``gpu_check`` on the model it built.
    ``compiled``: the decode path to price (None: the device's default)."""
    import torch

    from evalkit.evals.decode.loop import decode_logits
    from evalkit.integration.install import quantized_kv

    model, dev = lm.model, lm.device
    sync = _syncer(dev)
    head = model.get_output_embeddings()
    tokens = PROBE_TOKENS_CUDA if dev.type == "cuda" else PROBE_TOKENS
    tokens = min(tokens, facts.max_length or tokens)
    steps_len = PROBE_PREFILL + PROBE_WARMUP + PROBE_STEPS + 1
    ids = (torch.arange(max(tokens, steps_len), device=dev)[None] * 7919 + 11) % head.out_features

    def forward():
        hidden = model.base_model(input_ids=ids[:, :tokens], use_cache=False).last_hidden_state
        for chunk in hidden.split(512, dim=1):  # the head over every position, never a (tokens x vocab) tensor at once
            head(chunk).float()

    with torch.inference_mode(), quantized_kv(model, PROBE_SCHEME) as session:
        t_prefill = min(timed(forward, sync, warmup=1, repeats=PROBE_REPEATS))
        steps = decode_logits(
            model,
            lambda h: head(h).float(),
            session,
            ids[:, :steps_len].clone(),
            torch.ones(1, steps_len, dtype=torch.long, device=dev),
            PROBE_PREFILL,
        )
        next(steps)  # the prefill's prediction
        t_step = statistics.median(timed(lambda: next(steps), sync, warmup=PROBE_WARMUP, repeats=PROBE_STEPS))
        steps.close()
    copy = _copy_bandwidth(dev, sync)
    flops = forward_flops(facts, tokens) / t_prefill
    # the timed step, at batch 1 and a short context: host launches (overlapping the products on a GPU,
    # after them on a CPU) and its small attention; a step quicker than the copy allows raises the bandwidth
    kv = (PROBE_PREFILL + PROBE_WARMUP + PROBE_STEPS / 2) * facts.layers * 2 * facts.kv_width
    kv *= kv_traffic(facts, stored_bytes(PROBE_SCHEME, facts), grows=True)
    bandwidth = max(copy * BANDWIDTH_UTILISATION / COPY_UTILISATION, (facts.weight_bytes + kv) / t_step)
    t_lin = max(2 * facts.params / flops, facts.weight_bytes / bandwidth)
    t_att = kv / bandwidth
    overlap = dev.type == "cuda"
    overhead = max(t_step - t_att - (0.0 if overlap else t_lin), 0.0)
    if not overlap:  # on a CPU the timed forward paid the launches too: the products' rate is without them
        flops = forward_flops(facts, tokens) / max(t_prefill - overhead, t_prefill / 2)
    compiled = default_compiled(dev.type) if compiled is None else compiled
    kernels = KERNELS_PER_LAYER * facts.layers
    return Speed(
        flops,
        bandwidth,
        overhead,
        load_seconds,
        "probe",
        f"probe on {dev.type} under {PROBE_SCHEME}: forward of {tokens} tokens {t_prefill * 1e3:.0f} ms "
        f"({tokens / t_prefill:,.0f} tokens/s), warm decode step {t_step * 1e3:.1f} ms at batch 1 (median of "
        f"{PROBE_STEPS} after {PROBE_WARMUP} warm-up steps), copy {copy / 1e9:,.1f} GB/s, model load {load_seconds:.1f} s; "
        + path_text(compiled, kernels, overhead, kernels * GRAPH_S)
        + (" (not timed: from the bandwidth and the H200's graph overhead)" if compiled else ""),
        compiled,
        kernels * GRAPH_S,
        overlap,
        dev.type,
    )
