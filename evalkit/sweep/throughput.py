"""How fast a model runs on a device, for sizing a sweep: a short measured probe, or an analytic estimate.

A :class:`Speed` prices the forward calls of :mod:`evalkit.sweep.workload` (``calls`` of ``rows`` x
``length`` new tokens after ``context`` cached ones) in two parts, each a roofline:

* the products over the weights: ``t_lin = max(2 x params x tokens / flops, weights / bandwidth)``;
* attention: ``t_att = max(4 x layers x heads x head_dim x tokens x (context + (length + 1) / 2) / flops,
  K/V traffic / bandwidth)``. The K/V traffic is ``rows x cached tokens x layers x 2 x kv_width``
  elements times :func:`kv_traffic` bytes: attention reads the model-dtype K/V, and transformers'
  ``sdpa`` writes and reads them again expanded to the query heads (``repeat_kv``); a quantized cache
  is read as codes and dequantized into a model-dtype scratch first; an eager cache that grows by
  concatenation copies itself every step.

and the path the call takes (printed with every estimate):

* **eager** (every prefill; decode steps with ``compiled=False``, the default on CPU): the host
  launches :data:`KERNELS_PER_LAYER` x layers kernels, :data:`LAUNCH_S` each (``overhead``). On a GPU
  the launches run ahead of the kernels they queue and hide the products but not attention's long
  kernels: ``max(overhead, t_lin) + t_att``. On a CPU nothing overlaps: ``overhead + t_lin + t_att``.
* **compiled** (decode steps with ``compiled=True``, the default on CUDA: a static cache,
  ``torch.compile`` and CUDA graphs): the graph replays without the host, each kernel costing
  :data:`GRAPH_S` besides its bytes (``graph_overhead``): ``t_lin + t_att + graph_overhead``, with
  attention over the whole preallocated cache (``Forwards.cache``).

A quantized scheme's decode step is not priced from bytes alone: the storage path's step is measured
(:data:`DECODE_COSTS`, ``decode_costs.json``: per device kind and path, the ratio of a scheme's step to
the plain step, the first compile's seconds, each with the measurement and command that made it and
its error). A decode step under a quantized scheme costs the plain step priced here times that ratio
(:func:`step_ratio`; a scheme not measured takes the named stand-in's); a run on the compiled path
pays one first compile (:func:`compile_seconds`). The dry run prints the sources (:func:`cost_lines`).

Three ways to get the numbers, the first that applies (the dry run prints which):

* ``probe`` (:func:`evalkit.sweep.speed_probe.probe`): the model and its device are here. It is loaded as the sweep loads it and
  timed through evalkit's paths under :data:`~evalkit.sweep.speed_probe.PROBE_SCHEME`, every loop warmed first: a forward of
  :data:`~evalkit.sweep.speed_probe.PROBE_TOKENS` tokens (on a GPU :data:`~evalkit.sweep.speed_probe.PROBE_TOKENS_CUDA`, so that the products, not the
  launches, set its time) gives the FLOP/s; a timed copy the bandwidth; the median of
  :data:`~evalkit.sweep.speed_probe.PROBE_STEPS` warm eager decode steps at batch 1 the host ``overhead``. It does not time a
  compiled step: that path is priced from the probe's bandwidth and :data:`GRAPH_S`.
* ``datasheet`` (``--assume-device h100|h200|a100``, :data:`DEVICES`): the datasheet's peaks times
  :data:`FLOPS_UTILISATION` and :data:`BANDWIDTH_UTILISATION`, and the constants above.
* ``measured device`` (:func:`evalkit.sweep.speed_probe.measured_device`): a timed product and copy on this machine's device, scaled to what a
  forward reaches (:data:`MATMUL_UTILISATION`, :data:`COPY_UTILISATION`), and the constants above.

The constants were measured on an NVIDIA H200 SXM with random Llama-3.1-8B weights in bf16 (torch
2.11, transformers 5.17, 8k context): a forward of 8,192 tokens 0.32 s (4,096: 0.128 s); decode per
step at batch 1 / 16: warm eager 22.7 ms / -, ``generate()`` eager 28.4 / 104.8 ms, static cache and
``torch.compile`` 11.4 / 47.6 ms; ~1,040 kernels per eager step; a device copy 4.3 TB/s; an 8192^3
bf16 product 790 TFLOP/s. Each constant's comment says which figure fixed it; the others are checked
against the estimate in ``tests/sweep/test_throughput.py`` (within 1.5x). They are one machine's and
one model family's: other GPUs are priced from their datasheets with the same fractions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DISK_READ_BYTES_S = 2e9  # loading weights from a local disk (analytic estimates)

FLOPS_UTILISATION = 0.50  # of the dense BF16 peak in a prefill: the H200's 8k forward reached 0.47, its 4k 0.55
BANDWIDTH_UTILISATION = 0.75  # of the HBM peak in a decode step: the compiled batch-16 step, 171 GB in 47.6 ms
KERNELS_PER_LAYER = 32.5  # kernels one eager forward launches per decoder layer: ~1,040 for 32 layers (profiled)
LAUNCH_S = 18.7e-6  # host seconds per eager kernel: the warm step (22.7 ms) less its attention (3.3 ms), / 1,040
GRAPH_S = 4.1e-6  # seconds per replayed kernel besides bytes: the compiled batch-1 step (11.4 ms) less 7.1 ms, / 1,040
MATMUL_UTILISATION = 0.80  # a large bf16 product (8192^3) of the peak: 790 of 989 TFLOP/s
COPY_UTILISATION = 0.90  # a device-to-device copy of the peak bandwidth: 4.3 of 4.8 TB/s


DECODE_COSTS = Path(__file__).with_name("decode_costs.json")


@cache
def decode_costs(device_type: str) -> dict:
    """The measured decode-step costs for a device kind (``cuda``, else the CPU's)."""
    data = json.loads(DECODE_COSTS.read_text(encoding="utf-8"))
    return data["cuda" if device_type == "cuda" else "cpu"]


def step_ratio(device_type: str, compiled: bool, scheme: str) -> tuple[float, str]:
    """(a decode step under ``scheme`` / the plain step, the scheme whose measurement it is)."""
    entry = decode_costs(device_type)["compiled_step" if compiled else "eager_step"]
    table = entry["ratio_to_plain"]
    key = scheme if scheme in table else entry["default"]
    return float(table[key]), key


def compile_seconds(device_type: str) -> float:
    """A compiled run's first compile, seconds (measured; see :data:`DECODE_COSTS`)."""
    return float(decode_costs(device_type)["first_compile_s"]["value"])


def cost_lines(device_type: str, compiled: bool) -> list[str]:
    """What prices a quantized decode step and a compile on this path: the figures, their sources and errors."""
    costs = decode_costs(device_type)
    step = costs["compiled_step" if compiled else "eager_step"]
    ratios = ", ".join(f"{k} {v:g}x" for k, v in step["ratio_to_plain"].items())
    lines = [
        f"{'compiled' if compiled else 'eager'} storage decode step on {device_type}: the plain step x {ratios} "
        f"(others as {step['default']}); source: {step['source']}; command: {step['command']}; error: {step['error']}"
    ]
    if compiled:
        first = costs["first_compile_s"]
        lines.append(
            f"first compile {first['value']:g} s a run; source: {first['source']}; command: {first['command']}; "
            f"error: {first['error']}"
        )
    return lines


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
    flops: float  # sustained FLOP/s of a forward's products and attention
    bandwidth: float  # bytes/s of a decode step's weight and K/V traffic
    overhead: float  # host seconds per eager forward call (kernel launches, Python)
    load_seconds: float  # loading the model once
    kind: str  # probe | datasheet | measured device
    description: str  # one line for the output
    compiled: bool = False  # decode steps take the compiled path (static cache, CUDA graphs)
    graph_overhead: float = 0.0  # seconds per compiled decode step besides its bytes
    overlap: bool = True  # the host's launches run ahead of the device (CUDA); False: one after the other (CPU)
    device_type: str = "cuda"  # whose measured decode-step costs apply (DECODE_COSTS): cuda or cpu

    @property
    def path(self) -> str:
        return "compiled" if self.compiled else "eager"

    @property
    def compile_seconds(self) -> float:
        """A run's first compile on the compiled path (measured), 0 on the eager one."""
        return compile_seconds(self.device_type) if self.compiled else 0.0

    def seconds(self, f, facts, stored_bytes: float | None = None, scheme: str | None = None) -> float:
        """Wall time of a :class:`~evalkit.sweep.workload.Forwards` on a model of these ``facts``, its
        cache holding ``stored_bytes`` per element (None: the model's dtype, a plain cache). A decode
        step under a quantized ``scheme`` is the plain step times its measured ratio (:func:`step_ratio`)."""
        if f.length == 1 and stored_bytes is not None and scheme is not None:
            ratio, _ = step_ratio(self.device_type, self.compiled, scheme)
            return ratio * self._seconds(f, facts, None)
        return self._seconds(f, facts, stored_bytes)

    def _seconds(self, f, facts, stored_bytes: float | None) -> float:
        compiled = self.compiled and f.length == 1
        cached = max(f.cache, f.context) if compiled else f.context
        t_lin = max(f.rows * f.length * 2 * facts.params / self.flops, facts.weight_bytes / self.bandwidth)
        kv = f.rows * cached * facts.layers * 2 * facts.kv_width * kv_traffic(facts, stored_bytes, grows=not compiled)
        t_att = max(f.rows * _attention_flops(facts, f.length, f.context) / self.flops, kv / self.bandwidth)
        if compiled:
            one = t_lin + t_att + self.graph_overhead
        elif self.overlap:
            one = max(self.overhead, t_lin) + t_att
        else:
            one = self.overhead + t_lin + t_att
        return f.calls * one


def kv_traffic(facts, stored_bytes: float | None = None, grows: bool = False) -> float:
    """Bytes one forward moves per cached K/V element: attention reads it in the model's dtype, and
    transformers' ``sdpa`` writes and reads it once more per query head of its group when it expands
    grouped K/V (``repeat_kv``: with any attention mask, which a static cache always passes); a
    quantized cache (``stored_bytes`` per element) is read as codes and written into a model-dtype
    scratch first; a cache that ``grows`` by concatenation is read and written whole every step."""
    d = facts.dtype_bytes
    group = facts.attn_width / facts.kv_width if facts.kv_width else 1.0
    attention = d * (1 + 2 * group) if group > 1 else d
    stored = d if stored_bytes is None else stored_bytes
    dequantize = 0.0 if stored_bytes is None else stored + d
    return attention + dequantize + (2 * stored if grows else 0.0)


def stored_bytes(scheme: str, facts) -> float | None:
    """Bytes per cached element under ``scheme`` (codes and scales); None for the model's own dtype
    (the identity) or a scheme evalkit cannot size here (an engine profile's name)."""
    from evalkit.errors import EvalkitError
    from evalkit.kv.memory import bytes_per_element
    from evalkit.kv.scheme import parse_scheme

    try:
        parsed = parse_scheme(scheme)
    except (EvalkitError, ValueError):
        return None
    return None if parsed.is_unscaled else bytes_per_element(parsed, facts.head_dim or 128)


def forward_flops(facts, tokens: int, context: float = 0.0) -> float:
    """FLOPs of one row's forward of ``tokens`` new tokens after ``context`` cached ones."""
    return tokens * 2 * facts.params + _attention_flops(facts, tokens, context)


def _attention_flops(facts, tokens: int, context: float = 0.0) -> float:
    """Attention's FLOPs for one row (scores and weighted values, causal over the new tokens)."""
    return tokens * 4 * facts.layers * facts.attn_width * (context + (tokens + 1) / 2)


def default_compiled(device: str) -> bool:
    """The decode path the evaluations take by default: compiled on CUDA, eager elsewhere."""
    return str(device).startswith("cuda")


def path_text(compiled: bool, kernels: float, launch: float, graph: float) -> str:
    """The decode path a speed prices, in words (every estimate prints it)."""
    if compiled:
        return f"decode path compiled (static cache, CUDA graphs: {graph * 1e3:.1f} ms a step besides its bytes)"
    return f"decode path eager ({kernels:,.0f} kernels a forward, {launch * 1e3:.1f} ms of host time)"


def datasheet(facts, device: str, compiled: bool | None = None) -> Speed:
    """The estimate for ``device`` (:data:`DEVICES`) from its datasheet; ``compiled``: the decode path
    (None: compiled, the default on these GPUs)."""
    d = DEVICES[device]
    compiled = default_compiled("cuda") if compiled is None else compiled
    kernels = KERNELS_PER_LAYER * facts.layers
    return Speed(
        d.bf16_flops * FLOPS_UTILISATION,
        d.bandwidth * BANDWIDTH_UTILISATION,
        kernels * LAUNCH_S,
        facts.weight_bytes / DISK_READ_BYTES_S,
        "datasheet",
        f"analytic, {d.name} datasheet ({d.bf16_flops / 1e12:.0f} TFLOP/s BF16 x {FLOPS_UTILISATION:.0%}, "
        f"{d.bandwidth / 1e12:.2f} TB/s x {BANDWIDTH_UTILISATION:.0%}); "
        + path_text(compiled, kernels, kernels * LAUNCH_S, kernels * GRAPH_S),
        compiled,
        kernels * GRAPH_S,
        True,
    )
