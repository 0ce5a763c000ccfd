"""The dry run's speed model (evalkit.sweep.throughput): the H200 datasheet estimate against the figures
measured on an H200, its formula against a hand computation, the decode path as an input that every
estimate prints, warm timing, and the CPU probe on the embedded model."""

from __future__ import annotations

import math
import re

import pytest

from evalkit.evals.sizing import Forwards
from evalkit.models.facts import ModelFacts, model_facts
from evalkit.sweep import speed_probe as P
from evalkit.sweep import throughput as T
from evalkit.sweep.estimate import estimate_sweep
from evalkit.sweep.grid import parse_grid

# Measured on an NVIDIA H200 SXM, random Llama-3.1-8B weights in bf16, torch 2.11 cu130, transformers 5.17
# (issue 39). Seconds. Decode steps at 8k context; each estimate must land within 1.5x of every figure
# listed for it. Eager, batch 1: transformers' generate() 28.4 ms, and gpu_check's plain DynamicCache loop
# warm (6 warm-up steps) 22.7 ms; eager, batch 16: generate() 104.8 ms (noisy), gpu_check's loop 56.0 ms.
# Compiled: generate() with a static cache and torch.compile. Not held: gpu_check's first plain loop of
# the process at batch 1 (71.6 ms, cold: 56.8 ms after 3 warm-up steps) and the storage path of that
# time (70.0 / 65.6 ms, host-bound by synchronisations inside the step, which issue 39 removes).
H200 = [
    ("prefill of 8,192 tokens", None, Forwards(1, 1, 8192), (0.32,)),
    ("prefill of 4,096 tokens", None, Forwards(1, 1, 4096), (0.128,)),
    ("eager decode step, batch 1", False, Forwards(1, 1, 1, 8192), (28.4e-3, 22.7e-3)),
    ("eager decode step, batch 16", False, Forwards(1, 16, 1, 8192), (104.8e-3, 56.0e-3)),
    ("compiled decode step, batch 1", True, Forwards(1, 1, 1, 8192, 8192), (11.4e-3,)),
    ("compiled decode step, batch 16", True, Forwards(1, 16, 1, 8192, 8192), (47.6e-3,)),
]


@pytest.fixture(scope="module")
def llama8b() -> ModelFacts:
    facts = model_facts("meta-llama/Llama-3.1-8B-Instruct", "bfloat16", "cuda")
    # the model's own facts (its evalkit preset, or its config if cached here), nothing typed in this test
    assert facts.layers == 32 and facts.attn_width == 4096 and facts.kv_width == 1024 and facts.dtype_bytes == 2
    assert 8.0e9 < facts.params < 8.1e9
    return facts


@pytest.mark.parametrize(("what", "compiled", "forwards", "measured"), H200, ids=[row[0] for row in H200])
def test_the_h200_datasheet_estimate_lands_within_1_5x_of_the_measured_figures(
    llama8b, what, compiled, forwards, measured
):
    for path in [compiled] if compiled is not None else [False, True]:  # a prefill is eager on either path
        speed = T.datasheet(llama8b, "h200", compiled=path)
        estimate = speed.seconds(forwards, llama8b)
        for figure in measured:
            assert 1 / 1.5 <= estimate / figure <= 1.5, f"{what} ({speed.path}): {estimate:.4f} s vs {figure} s"


def test_the_decode_paths_order_as_measured(llama8b):
    """Compiled beats eager at both batches; eager at batch 1 is host-bound (its time is the launches plus a
    small attention), and batch 16's extra time is the K/V traffic."""
    eager, compiled = T.datasheet(llama8b, "h200", compiled=False), T.datasheet(llama8b, "h200", compiled=True)
    for batch in (1, 16):
        step = Forwards(1, batch, 1, 8192, 8192)
        assert compiled.seconds(step, llama8b) < eager.seconds(step, llama8b)
    assert (
        eager.overhead == pytest.approx(32.5 * 32 * 18.7e-6) and eager.overhead > llama8b.weight_bytes / eager.bandwidth
    )


TOY = ModelFacts("toy", params=1e9, layers=10, attn_width=1024, kv_width=256, head_dim=64, dtype_bytes=2.0)


def toy_speed(compiled: bool, overlap: bool = True) -> T.Speed:
    return T.Speed(1e14, 1e12, 0.010, 0.0, "datasheet", "toy", compiled, 0.002, overlap)


def test_the_formula_against_a_hand_computation():
    """A model of 1e9 parameters (2 GB in bf16), 10 layers, 4 query heads per K/V head; 100 TFLOP/s,
    1 TB/s, 10 ms of launches per eager call, 2 ms per compiled step."""
    step = Forwards(1, 8, 1, 1000, 1500)  # batch 8, 1,000 tokens cached, a static cache of 1,500
    weights_s = 2e9 / 1e12  # 2 ms: the products of 8 tokens (1.6e10 FLOPs, 0.16 ms) are bound by the weights
    elements = 8 * 1000 * 10 * 2 * 256  # K and V of every layer, per step
    # eager: the cache read (2 B), 4 expanded copies written and read (16 B), the growing cache copied (4 B)
    eager_kv_s = elements * (2 + 2 * 4 * 2 + 2 * 2) / 1e12
    assert toy_speed(False).seconds(step, TOY) == pytest.approx(max(0.010, weights_s) + eager_kv_s, rel=1e-3)
    # on a CPU the launches and the work add up
    assert toy_speed(False, overlap=False).seconds(step, TOY) == pytest.approx(0.010 + weights_s + eager_kv_s, rel=1e-3)
    # compiled: the whole static cache (1,500 tokens), no growth copy, 2 ms of graph overhead
    static = 8 * 1500 * 10 * 2 * 256
    assert toy_speed(True).seconds(step, TOY) == pytest.approx(weights_s + static * 18 / 1e12 + 0.002, rel=1e-3)
    # an FP8 cache (1 B per element): its codes read and dequantized into a bf16 scratch (1 + 2 B) first
    assert toy_speed(True).seconds(step, TOY, stored_bytes=1.0) == pytest.approx(
        weights_s + static * (18 + 3) / 1e12 + 0.002, rel=1e-3
    )
    # a prefill: 3 calls of 2 rows x 512 tokens, compute-bound, the same on both paths
    prefill = Forwards(3, 2, 512)
    products = 2 * 512 * 2 * 1e9 / 1e14  # 20.5 ms, longer than the launches
    attention = 2 * 512 * 4 * 10 * 1024 * (513 / 2) / 1e14
    for compiled in (False, True):
        assert toy_speed(compiled).seconds(prefill, TOY) == pytest.approx(3 * (products + attention), rel=1e-6)


def test_kv_traffic_per_cached_element():
    mha = ModelFacts("mha", params=1e9, layers=1, attn_width=512, kv_width=512, dtype_bytes=2.0)
    assert T.kv_traffic(mha) == 2  # no expansion: attention reads the cache once
    assert T.kv_traffic(mha, grows=True) == 6  # plus the concatenation's read and write
    assert T.kv_traffic(TOY) == 2 * (1 + 2 * 4)
    assert T.kv_traffic(TOY, stored_bytes=0.5625, grows=True) == pytest.approx(18 + 0.5625 + 2 + 2 * 0.5625)


def test_stored_bytes_of_a_scheme():
    facts = ModelFacts("toy", head_dim=128)
    assert T.stored_bytes("auto", facts) is None  # the model's own dtype: a plain cache
    assert T.stored_bytes("fp8_e4m3/tensor/dynamic", facts) == 1.0
    assert T.stored_bytes("nvfp4", facts) == 0.5 + 1 / 16
    assert T.stored_bytes("not a scheme at all", facts) is None


GRID = """name: paths
models:
  - {name: meta-llama/Llama-3.1-8B-Instruct, dtype: bfloat16, device: cuda}
schemes: [auto, fp8_e4m3/tensor/dynamic]
evals:
  decode: {prefill: 2048, decode: 256, sequences: 4, batch_size: 8}
"""


def test_the_decode_path_is_an_input_and_every_estimate_prints_it(tmp_path):
    grid = parse_grid(tmp_path / "g.yaml", GRID)
    totals, compiles = {}, {}
    for compiled, words in ((True, "decode path compiled"), (False, "decode path eager")):
        est = estimate_sweep(grid, grid.runs, tmp_path, tmp_path, assume_device="h200", compile_decode=compiled)
        assert words in est.speeds[0] and words in est.text()
        totals[compiled] = est.seconds
        compiles[compiled] = sum("compile" in r.extras for r in est.runs) * T.compile_seconds("cuda")
    default = estimate_sweep(grid, grid.runs, tmp_path, tmp_path, assume_device="h200")
    assert default.seconds == totals[True]  # compiled: the default on CUDA
    assert compiles[False] == 0 and compiles[True] > 0  # a compiled run pays its first compile (measured)
    assert totals[True] - compiles[True] < totals[False]  # its steps are quicker


def test_timing_leaves_the_warm_up_out(monkeypatch):
    """The first calls of a loop (here 0.2 s each, on a fake clock) are not timed; each timed call
    (0.01 s) is synchronised. No wall clock: the machine's load cannot move the answer."""
    from types import SimpleNamespace

    calls, synced, clock = [], [], [0.0]

    def step():
        calls.append(1)
        clock[0] += 0.2 if len(calls) <= 3 else 0.01

    monkeypatch.setattr(P, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    times = P.timed(step, lambda: synced.append(1), warmup=3, repeats=5)
    assert len(calls) == 8 and len(synced) == 6
    assert times == pytest.approx([0.01] * 5)


def test_measured_device_prices_the_grids_device_path():
    facts = model_facts("embedded", "float32", "cpu")
    cpu = P.measured_device(facts, "cpu", facts.dtype_bytes)
    assert not cpu.compiled and not cpu.overlap and "decode path eager" in cpu.description
    assert cpu.flops > 0 and cpu.bandwidth > 0 and cpu.overhead == pytest.approx(32.5 * facts.layers * 18.7e-6)
    forced = P.measured_device(facts, "cpu", facts.dtype_bytes, compiled=True)
    assert forced.compiled and "decode path compiled" in forced.description


@pytest.mark.slow
def test_the_cpu_probe_on_the_embedded_model_reproduces_its_warm_step():
    from evalkit.models.loading import load_model

    facts = model_facts("embedded", "auto", "cpu")
    speed = P.probe_model(load_model("embedded", device="cpu"), facts)
    assert speed.kind == "probe" and speed.path == "eager" and not speed.overlap
    assert all(math.isfinite(x) and x > 0 for x in (speed.flops, speed.bandwidth)) and speed.overhead >= 0
    assert f"forward of {P.PROBE_TOKENS} tokens" in speed.description and "decode path eager" in speed.description
    step_ms = float(re.search(r"warm decode step ([\d.]+) ms at batch 1", speed.description).group(1))
    context = P.PROBE_PREFILL + P.PROBE_WARMUP + P.PROBE_STEPS / 2
    priced = speed.seconds(Forwards(1, 1, 1, context), facts, T.stored_bytes(P.PROBE_SCHEME, facts))
    assert priced * 1e3 == pytest.approx(step_ms, rel=0.02, abs=0.1)  # what it timed is what it prices
