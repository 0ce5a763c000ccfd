"""How fast a model runs on a device, for sizing a sweep: a short measured probe, or an analytic estimate.

A :class:`Speed` prices the forward calls of :mod:`evalkit.sweep.workload` with a roofline:

    FLOPs per token = 2 x parameters + 4 x layers x (heads x head_dim) x tokens attended
    one call        = max(tokens x FLOPs per token / flops, (weights + KV read) / bandwidth) + overhead

Three ways to get its numbers, the first that applies (the dry run prints which one it used):

* ``probe`` (:func:`probe`): the model is on this machine and its device is here. It is loaded as
  the sweep loads it, then timed through evalkit's own paths under ``fp8_e4m3/tensor/dynamic``
  (the storage emulation most runs pay): one forward of :data:`PROBE_TOKENS` tokens without cache
  (as perplexity runs; the quicker of :data:`PROBE_REPEATS`) gives the sustained FLOP/s, :data:`PROBE_STEPS` one-token decode steps
  through the storage cache (as decode and generation run) the time of a step, read as an
  effective bandwidth. A couple of seconds for the embedded model on a CPU.
* ``datasheet`` (``--assume-device h100|h200|a100``, :data:`DEVICES`): the datasheet's dense BF16
  peak and memory bandwidth times :data:`FLOPS_UTILISATION` and :data:`BANDWIDTH_UTILISATION`,
  plus :data:`LAYER_OVERHEAD_S` per decoder layer and call (Python and kernel launches:
  transformers' eager decode of an 8B model runs at a few tens of tokens per second, far from
  the bandwidth bound).
* ``measured device``: neither: a timed matrix product and copy on this machine's device give
  FLOP/s and bandwidth, with the same overhead per layer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

PROBE_TOKENS = 128
PROBE_STEPS = 5
PROBE_REPEATS = 2  # timed forwards of PROBE_TOKENS; the quickest counts
PROBE_SCHEME = "fp8_e4m3/tensor/dynamic"
FLOPS_UTILISATION = 0.40  # of the dense BF16 peak, for transformers' prefill (sdpa) with evalkit's K/V emulation
BANDWIDTH_UTILISATION = 0.70  # of the HBM peak, for the weight and KV reads of a decode step
LAYER_OVERHEAD_S = 5e-4  # per decoder layer and forward call (Python, kernel launches, evalkit's storage cache)
DISK_READ_BYTES_S = 2e9  # loading weights from a local disk (analytic estimates)


@dataclass(frozen=True)
class Device:
    name: str
    bf16_flops: float  # dense, FLOP/s
    bandwidth: float  # bytes/s
    source: str


DEVICES = {
    "h100": Device(
        "NVIDIA H100 SXM5 80GB",
        989e12,
        3.35e12,
        "NVIDIA H100 Tensor Core GPU datasheet: 989 TFLOP/s dense BF16 (1,979 with sparsity), 3.35 TB/s HBM3",
    ),
    "h200": Device(
        "NVIDIA H200 SXM 141GB",
        989e12,
        4.8e12,
        "NVIDIA H200 Tensor Core GPU datasheet: 989 TFLOP/s dense BF16 (1,979 with sparsity), 4.8 TB/s HBM3e",
    ),
    "a100": Device(
        "NVIDIA A100 SXM4 80GB",
        312e12,
        2.039e12,
        "NVIDIA A100 Tensor Core GPU datasheet: 312 TFLOP/s dense BF16, 2,039 GB/s HBM2e",
    ),
}


@dataclass(frozen=True)
class Speed:
    flops: float  # sustained FLOP/s of a forward's matrix products
    bandwidth: float  # effective bytes/s of weight and KV reads
    overhead: float  # seconds per forward call besides both
    load_seconds: float  # loading the model once
    kind: str  # probe | datasheet | measured device
    description: str  # one line for the output

    def seconds(self, f, facts) -> float:
        """Wall time of a :class:`~evalkit.sweep.workload.Forwards` on a model of these ``facts``."""
        compute = f.rows * _flops(facts, f.length, f.context) / self.flops
        kv = f.rows * (f.context + f.length) * facts.layers * 2 * facts.kv_width * facts.dtype_bytes
        memory = (facts.weight_bytes + kv) / self.bandwidth
        return f.calls * (max(compute, memory) + self.overhead)


def _flops(facts, tokens: int, context: float = 0.0) -> float:
    """FLOPs of one row's forward of ``tokens`` new tokens after ``context`` cached ones."""
    return tokens * (2 * facts.params + 4 * facts.layers * facts.attn_width * (context + (tokens + 1) / 2))


def datasheet(facts, device: str) -> Speed:
    d = DEVICES[device]
    return Speed(
        d.bf16_flops * FLOPS_UTILISATION,
        d.bandwidth * BANDWIDTH_UTILISATION,
        facts.layers * LAYER_OVERHEAD_S,
        facts.weight_bytes / DISK_READ_BYTES_S,
        "datasheet",
        f"analytic, {d.name} datasheet ({d.bf16_flops / 1e12:.0f} TFLOP/s BF16 x {FLOPS_UTILISATION:.0%}, "
        f"{d.bandwidth / 1e12:.2f} TB/s x {BANDWIDTH_UTILISATION:.0%}, {LAYER_OVERHEAD_S * 1e3:.1f} ms per layer and call)",
    )


def measured_device(facts, device: str, dtype_bytes: float) -> Speed:
    """FLOP/s of a timed matrix product and bytes/s of a timed copy on this machine's ``device``."""
    import torch

    dev = torch.device(device if device.startswith("cuda") and torch.cuda.is_available() else "cpu")
    dtype = torch.float32 if dev.type == "cpu" or dtype_bytes >= 4 else torch.bfloat16
    n = 1024 if dev.type == "cpu" else 8192
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    big = torch.empty(64 * 2**20 if dev.type == "cpu" else 2**30, dtype=torch.uint8, device=dev)

    def timed(fn, reps: int) -> float:
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / reps

    flops = 2 * n**3 / timed(lambda: a @ b, 4)
    bandwidth = 2 * big.numel() / timed(lambda: big.clone(), 4)  # read and write
    where = f"this machine's {dev.type}" + (
        "" if dev.type == device.split(":")[0] else f" (the grid's {device} is not here)"
    )
    return Speed(
        flops,
        bandwidth,
        facts.layers * LAYER_OVERHEAD_S,
        facts.weight_bytes / DISK_READ_BYTES_S,
        "measured device",
        f"analytic, measured on {where}: {flops / 1e9:,.0f} GFLOP/s "
        f"({str(dtype).removeprefix('torch.')} {n}x{n} product), {bandwidth / 1e9:,.1f} GB/s copy, "
        f"{LAYER_OVERHEAD_S * 1e3:.1f} ms per layer and call",
    )


def device_available(device: str) -> bool:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.is_available()
    return device in ("cpu", "auto") or device.startswith("cpu")


def probe(spec, facts) -> Speed:
    """Load the model as the sweep does and time a forward and a few decode steps through evalkit's paths."""
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
    return probe_model(lm, facts, load_seconds=time.perf_counter() - start)


def probe_model(lm, facts, load_seconds: float = 0.0) -> Speed:
    """Time a forward and a few decode steps of an already loaded model (a ``LoadedModel``) through
    evalkit's paths; :func:`probe` after loading, and ``gpu_check`` on the model it built."""
    import torch

    from evalkit.evals.decode.loop import decode_logits
    from evalkit.integration.install import quantized_kv

    load = load_seconds
    model = lm.model
    device = lm.device
    vocab = model.get_output_embeddings().out_features
    ids = (torch.arange(PROBE_TOKENS + PROBE_STEPS + 1, device=device)[None] * 7919 + 11) % vocab
    head = model.get_output_embeddings()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with torch.inference_mode(), quantized_kv(model, PROBE_SCHEME) as session:
        model.base_model(input_ids=ids[:, :32], use_cache=False)  # warm-up (first-call allocations)
        sync()
        t_prefill = float("inf")
        for _ in range(PROBE_REPEATS):  # the quickest: a busy machine's stalls are not the model's speed
            start = time.perf_counter()
            hidden = model.base_model(input_ids=ids[:, :PROBE_TOKENS], use_cache=False).last_hidden_state
            head(hidden).float()
            sync()
            t_prefill = min(t_prefill, time.perf_counter() - start)
        prefill = 16
        steps = decode_logits(
            model,
            lambda h: head(h).float(),
            session,
            ids[:, : prefill + PROBE_STEPS + 1].clone(),
            torch.ones(1, prefill + PROBE_STEPS + 1, dtype=torch.long, device=device),
            prefill,
        )
        next(steps)  # the prefill's prediction
        sync()
        start = time.perf_counter()
        n = sum(1 for _ in steps)
        sync()
        t_step = (time.perf_counter() - start) / max(n, 1)
    flops = _flops(facts, PROBE_TOKENS) / t_prefill
    compute_step = _flops(facts, 1, prefill + PROBE_STEPS / 2) / flops
    bandwidth = facts.weight_bytes / max(t_step - compute_step, t_step * 0.1)
    del lm, model
    return Speed(
        flops,
        bandwidth,
        0.0,
        load,
        "probe",
        f"probe on {device.type} under {PROBE_SCHEME}: forward of {PROBE_TOKENS} tokens {t_prefill * 1e3:.0f} ms "
        f"({PROBE_TOKENS / t_prefill:,.0f} tokens/s), decode step {t_step * 1e3:.0f} ms at batch 1, model load {load:.1f} s",
    )
