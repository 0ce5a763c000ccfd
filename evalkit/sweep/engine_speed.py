"""How long a real engine (vLLM on GPUs) takes for a run's requests: a throughput model, for the dry run.

An engine run does not go the emulation's way (one batch of rows at a time through transformers): vLLM
takes every request of the run at once and batches them continuously, up to ``max_num_seqs`` sequences
and as many as its KV cache holds, on ``TP x PP`` GPUs. :class:`EngineSpeed` prices the forward calls of
an evaluation's :class:`~evalkit.evals.sizing.Work` that way:

* **prefill** (a call of ``length > 1`` new tokens): compute-bound, ``FLOPs / (GPUs x peak x``
  :data:`PREFILL_MFU` ``)`` with ``FLOPs = 2 x params x tokens + 4 x layers x query width x tokens x
  (context + (length + 1) / 2)`` (products and causal attention);
* **decode** (one-token calls): ``D`` tokens of ``R`` requests (the run's prefills) generated ``b`` at a
  time, ``b = min(R, max_num_seqs, tokens the cache holds / sequence length)``, ``ceil(D / b)`` steps,
  each ``max(bytes / (GPUs x HBM peak x`` :data:`DECODE_BANDWIDTH` ``), 2 x params x b / (GPUs x peak x
  MFU)) +`` :data:`STEP_S` ``+ 2 x layers x`` :data:`ALLREDUCE_S` (``TP > 1``), the bytes being the
  weights once plus every sequence's cached K/V at the call's mean context at the scheme's stored
  bytes; the GPUs split both.

Tensor parallelism divides each step's bytes and FLOPs by the GPUs and adds two all-reduces per layer;
pipeline stages are counted as GPUs (their bubbles are not modelled). ``max_num_seqs`` is ``vllm
serve``'s default for the GPU (:func:`evalkit.planning.reserve.serve_defaults`); the cache is the one
:mod:`evalkit.planning.engine_fit` sizes for the run's engine options.

Expected error. Checked against the published vLLM figure for Llama-3.1-70B on H100s (LambdaLabsML's
vllm-benchmark, ``benchmark_v0.md``: vLLM 0.6.0, TP 4, 5,000 prompts, ``max-num-seq`` 256,
``max-seq-len`` 2048, 2,291 output tokens/s with one scheduler step, 3,543 with ten): the model gives
:func:`decode_rate` of the same setup within the factor :data:`EXPECTED_ERROR` of those (the test
``tests/sweep/test_engine_speed.py`` holds it). Prefill-decode interference, preemption, chunked-prefill
scheduling, sampling and detokenization are in :data:`STEP_S` only on average: treat an estimate as
right to within that factor, either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PREFILL_MFU = (
    0.40  # of the dense BF16 peak in vLLM's (chunked) prefill; transformers' 8k forward reached 0.47 on an H200
)
DECODE_BANDWIDTH = 0.70  # of the HBM peak in a decode step (the compiled batch-16 step of throughput.py reached 0.75)
STEP_S = 4e-3  # host seconds per engine step besides the GPU's (scheduler, sampling, output processing; vLLM V1)
ALLREDUCE_S = 12e-6  # one all-reduce of a decode step's activations over NVLink (2 per layer at TP > 1)
EXPECTED_ERROR = 2.5  # the factor within which the model meets the published figures (module docstring)


@dataclass(frozen=True)
class EngineSpeed:
    """vLLM on ``gpus`` GPUs of one kind (:data:`evalkit.sweep.throughput.DEVICES`), for one model's facts."""

    device: object  # throughput.Device: name, bf16_flops, bandwidth
    tp: int
    pp: int
    max_seqs: int  # vLLM's max_num_seqs
    kv_tokens: int  # tokens one replica's cache holds (0: not known, no cap)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    def describe(self) -> str:
        d = self.device
        return (
            f"engine model: vLLM on {self.gpus} x {d.name} (TP {self.tp}" + (f" x PP {self.pp}" if self.pp > 1 else "")
            + f"): prefill at {PREFILL_MFU:.0%} of {d.bf16_flops / 1e12:.0f} TFLOP/s BF16 per GPU, decode "
            f"bandwidth-bound at {DECODE_BANDWIDTH:.0%} of {d.bandwidth / 1e12:.2f} TB/s per GPU, batches up to "
            f"{self.max_seqs} sequences and {self.kv_tokens:,} cached tokens, {STEP_S * 1e3:.0f} ms a step on the "
            f"host, {ALLREDUCE_S * 1e6:.0f} us per all-reduce; expected error: within {EXPECTED_ERROR}x either way"
        )  # fmt: skip

    def kv_bytes(self, facts, stored: float | None = None) -> float:
        """:func:`kv_bytes_per_token` (for callers on a lower floor, which cannot import this module)."""
        return kv_bytes_per_token(facts, stored)

    def prefill_seconds(self, f, facts) -> float:
        tokens = f.calls * f.rows * f.length
        flops = tokens * 2 * facts.params + f.calls * f.rows * f.length * 4 * facts.layers * facts.attn_width * (
            f.context + (f.length + 1) / 2
        )
        return flops / (self.gpus * self.device.bf16_flops * PREFILL_MFU)

    def step_seconds(self, facts, batch: int, context: float, kv_bytes_per_token: float) -> float:
        """One decode step of ``batch`` sequences at ``context`` cached tokens each (whole-model bytes per token)."""
        nbytes = facts.weight_bytes + batch * context * kv_bytes_per_token
        memory = nbytes / (self.gpus * self.device.bandwidth * DECODE_BANDWIDTH)
        compute = 2 * facts.params * batch / (self.gpus * self.device.bf16_flops * PREFILL_MFU)
        comms = 2 * facts.layers * ALLREDUCE_S if self.tp > 1 else 0.0
        return max(memory, compute) + STEP_S + comms

    def batch(self, requests: int, sequence: float) -> int:
        """Sequences decoded together: the requests, at most ``max_num_seqs`` and what the cache holds."""
        b = min(max(requests, 1), self.max_seqs)
        if self.kv_tokens and sequence > 0:
            b = min(b, max(1, int(self.kv_tokens // sequence)))
        return b

    def seconds(self, forwards, facts, kv_bytes_per_token: float) -> float:
        """Wall time of one run's forward calls (an evaluation's :class:`~evalkit.evals.sizing.Work` forwards)."""
        requests = sum(f.calls * f.rows for f in forwards if f.length > 1)
        total = 0.0
        for f in forwards:
            if f.length > 1:
                total += self.prefill_seconds(f, facts)
                continue
            tokens = f.calls * f.rows
            b = self.batch(requests or f.rows, max(f.cache, f.context + 1))
            total += math.ceil(tokens / b) * self.step_seconds(facts, b, f.context, kv_bytes_per_token)
        return total


def kv_bytes_per_token(facts, stored: float | None) -> float:
    """Whole-model bytes of one cached token: ``layers x 2 x KV width`` elements at ``stored`` bytes each
    (None: the model's dtype)."""
    return facts.layers * 2 * facts.kv_width * (facts.dtype_bytes if stored is None else stored)


def decode_rate(facts, speed: EngineSpeed, batch: int, context: float, stored: float | None = None) -> float:
    """Output tokens per second of ``batch`` sequences decoding at ``context`` (for the published comparison)."""
    return batch / speed.step_seconds(facts, batch, context, kv_bytes_per_token(facts, stored))


def engine_speed(facts, device_key: str, options: dict, kv_tokens: int = 0) -> EngineSpeed:
    """The model for a run on ``--assume-device`` ``device_key`` with the engine options it sets."""
    from evalkit.planning.gpus import get_gpu
    from evalkit.planning.reserve import serve_defaults
    from evalkit.sweep.throughput import DEVICES

    gpu = get_gpu(device_key)
    _, seqs = serve_defaults(gpu.memory, gpu.name)
    return EngineSpeed(
        DEVICES[device_key],
        int(options.get("tensor_parallel_size") or 1),
        int(options.get("pipeline_parallel_size") or 1),
        seqs,
        kv_tokens,
    )
