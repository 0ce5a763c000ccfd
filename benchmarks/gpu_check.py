"""One prepared check of evalkit's storage path on a lent CUDA GPU: run it as it is, offline, within a budget.

    python benchmarks/gpu_check.py                  # on the GPU machine, from the repository root
    python benchmarks/gpu_check.py --device cpu     # the same code at tiny sizes: tests this script
    python benchmarks/gpu_check.py --budget-s 300 --out results/gpu_check.json

What it needs, and all it needs: Python, torch, transformers and safetensors (numpy comes with
torch), plus evalkit's own core and storage path, imported from this checkout (the script puts the
repository root first on ``sys.path``, so evalkit need not be installed). It imports nothing from
lm-eval, datasets or gguf (``tests/benchmarks/test_gpu_check.py`` runs it with those blocked), reads no model
weights, no tokenizer and no corpus, and never touches the network: every model is built from a
config with seeded random weights (``AutoModelForCausalLM.from_config``, under the device as the
default device, so the real-size model is initialised on the GPU), and token ids are random. Files
it reads: the shipped static scale tables in ``calibration/``.

Models. "embedded": the architecture of the embedded model, SmolLM2-135M (llama, 30 layers, 9
query / 3 KV heads, head_dim 64), bf16; "real-size": Llama-3.1-8B's architecture
(``evalkit.models.presets`` "llama-3.1-8b" plus the fields that preset does not need: vocabulary, MLP
width, RoPE), bf16 (~16 GB). ``--device cpu`` runs a 2-layer embedded model (bf16) and a
scaled-down real-size stand-in (4 layers, float32: see :func:`sizes_for`) at 256 and 1k context, in
well under two minutes on two cores; speed is not judged there.

Sections, in priority order (each gets a share of ``--budget-s``, default 560 s, and is skipped,
with the reason, when the time left is below what it needs; a section past its share stops between
items and reports the rest as skipped):

1. identity: under ``bf16`` the logits of a padded batch and a greedy ``generate()`` equal the
   plain model's bit for bit;
2. float8 rounding: for every FP8 format, the device's own cast (nearest even) against evalkit's
   emulation on the device, the same emulation on the CPU, and an independent reference (float64
   nearest-neighbour search over the format's full table of values), on every value, midpoint and
   the floats next to them plus random values over the whole range: same bits. The other rounding
   modes of ``evalkit.kv.rounding`` (toward zero, ties away), for which CUDA has no cast: emulation
   on the device against the emulation on the CPU and the reference. FP4 E2M1 likewise (no cast);
3. every scale source through storage (dynamic / static from the shipped calibration tables /
   unit, over tensor, head, block16, token, group32, the 4-bit formats and the named schemes): a
   padded teacher-forced decode runs, every tensor the cache keeps is on the device, the stored
   bytes decode to what attention reads, the logits are finite and close to the baseline's;
4. decode: the storage path's compiled decode step (static storage cache, ``torch.compile`` with CUDA
   graphs; the probe scheme) against what a user would run instead: transformers' static-cache step
   compiled as ``generate()`` compiles it, at 8k and 32k context, batch 1 and 16, each loop warmed
   (its compiling step, then ``warmup`` steps) before each step is timed; the median, the GPU-busy
   time of a profiled step and the HBM floor (weights and cache read once at the measured copy
   bandwidth) beside it; target: storage <= 1.25 x the reference. The eager arms (DynamicCache and
   the dynamic storage cache) at the first context and batch; 128k context at batch 1 under the
   probe scheme. Caches are filled by writing seeded random K/V through the cache (a prefill's write,
   without its compute) (benchmarks/gpu_check_decode.py);
5. memory: each storage run holds at most the engine's bytes plus one layer's K/V (no full-precision
   copy), and every FP8 scheme's decode peak over the weights is at most 0.6 x the reference's;
6. the sweep dry run's estimator (``evalkit.sweep.throughput``, ``evalkit.sweep.speed_probe``): its real probe, run on the
   real-size model in memory, and its ``--assume-device h200`` datasheet estimate, against the
   prefill and decode times measured here (judged on an H200 only);
7. vLLM kv_cache_dtypes (``vllm:<dtype>``, :mod:`evalkit.kv.codecs.vllm`; the per-tensor FP8 ones are
   sections 2 and 3): seeded K and V (outlier channels, an all-zero token; the MLA rows on a 512-value
   latent and 64-value RoPE key) encoded by evalkit's emulation on the device and on the CPU: the
   stored bytes, the scales beside them and the dequantized values must be equal. Every FP8/FP4 cast
   the emulation makes is recorded as it runs (float32 -> float8 ``Tensor.to``, and the E2M1 rounding
   of ``evalkit.kv.microscaling``) and compared with the hardware rule (PTX ``cvt.rn.satfinite``:
   nearest even, saturating; the float64 table search of section 2) and, for FP8, with the CPU's cast
   of the same inputs; the emulation's FP8 cast is torch's, so on the GPU it is the device's own
   conversion. torch has no float32 -> FP4 conversion (its ``float4_e2m1fn_x2`` has no cast kernel):
   the section says so in its figures, and the E2M1 codes are held to the rule alone. Dtypes without
   an FP8/FP4 cast (INT8, INT4, TurboQuant's codebooks, UltraQuant's own E2M1 snap) are compared
   byte for byte with the CPU (float32 log2, exp2 and rotations included);
8. the vLLM engine path, where vLLM is importable (benchmarks/gpu_check_vllm.py): its build and
   version, the API evalkit uses, the engine's cache write against evalkit's quantizer, its Triton
   stores, and prompt log-probs through the engine; skipped with the reason where vLLM is absent;
9. the engine-native run, where vLLM is importable (benchmarks/gpu_check_vllm.py ``native_section``): a
   random llama run as ``evalkit run --engine vllm`` runs it (baseline, FP8 and the noise floor run) with
   evalkit's weight loader and transformers' ``from_pretrained`` refusing, its peak memory beside the
   weights' bytes; skipped with the reason in one line where vLLM is absent (the GPU image has none).

Output: one JSON file (``--out``; default ``$OUT/gpu_check.json`` when ``OUT`` is set, else
``gpu_check.json`` here) with every check's name, status (pass / fail / skipped), figures and
timings, each section's status, and the versions (python, torch, transformers, CUDA, device),
rewritten after every section (``"complete": false`` until the end, so a run killed midway still
leaves what it measured); a short summary on stdout. Exit code: the number of failed checks. No CUDA device with ``--device
cuda``: one line, one failed check, every section skipped.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()  # the budget counts from here: imports included

import argparse
import json
import math
import os
import platform
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_check_decode, gpu_check_vllm: its sections
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from evalkit.runtime import numerics

numerics.configure()  # as the command line: batch-invariant BLAS on CPU, before the first matrix product

import torch

GiB = 2**30

# The embedded model's architecture: SmolLM2-135M-Instruct as evalkit converts it (its dense copy's
# config.json; tests/benchmarks/test_gpu_check.py compares them where that copy exists). evalkit defines it
# nowhere else in full: evalkit.models.loading describes the embedded model only in words.
EMBEDDED_CONFIG = dict(
    model_type="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    hidden_act="silu",
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
    tie_word_embeddings=True,
    attention_bias=False,
    mlp_bias=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
    initializer_range=0.02,
)

REAL_PRESET = "llama-3.1-8b"
# What Llama-3.1-8B's config.json has beyond the KV fields of evalkit.models.presets' "llama-3.1-8b".
REAL_EXTRA = dict(
    vocab_size=128256,
    intermediate_size=14336,
    head_dim=128,
    hidden_act="silu",
    rms_norm_eps=1e-5,
    rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    tie_word_embeddings=False,
    attention_bias=False,
    mlp_bias=False,
    bos_token_id=128000,
    eos_token_id=128001,
    initializer_range=0.02,
)
# --device cpu: the real-size model scaled down (same family and RoPE, 4 layers, GQA 4:1).
REAL_STANDIN = dict(
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    hidden_size=256,
    head_dim=32,
    intermediate_size=768,
    vocab_size=4096,
    bos_token_id=1,
    eos_token_id=2,
)

CALIBRATION = {"tensor": "smollm2-135m-tensor-amax.safetensors", "head": "smollm2-135m-head-amax.safetensors"}
KL_LIMIT = 0.5  # nats: mean KL(baseline || scheme) over the real positions of the storage section
ESTIMATE_FACTOR = 1.5  # the datasheet estimate within this factor of the measured time (judged on an H200)


@dataclass(frozen=True)
class Sizes:
    """Everything that differs between the GPU run and the CPU self-test."""

    embedded_layers: int
    batch: int
    seq: int
    decode: int  # teacher-forced steps of section 3
    generate: int  # greedy tokens of section 1
    cast_values: int  # random values per format and rounding in section 2
    real: dict  # the real-size model's config
    real_dtype: torch.dtype
    contexts: tuple[int, ...]
    batches: tuple[int, ...]
    steps: int  # timed decode steps per run
    warmup: int  # warm steps after the first (compiling) one, before the timed ones
    prefill: int  # tokens of the measured prefill (section 6)
    min_s: dict  # per section: the least time it needs to start
    share_s: dict  # per section: its share of the budget
    vllm_tokens: int = 16  # tokens per row of section 7's K and V (batch rows x 8 heads, or 1 MLA latent)
    long_context: int = 131072  # section 4's long run: batch 1 under the probe scheme


SHARES = dict(
    identity=20,
    casts=30,
    storage=60,
    speed=330,
    memory=50,
    estimator=30,
    vllm_dtypes=20,
    vllm_engine=150,
    vllm_native=200,
)  # seconds; 540 of the default 560 before sections 8 and 9, which take ~0 s where vLLM is absent


def real_config(cpu: bool) -> dict:
    from evalkit.models.presets import get_preset

    fields = {**get_preset(REAL_PRESET)["config"], **REAL_EXTRA}
    if cpu:
        fields.update(REAL_STANDIN)
    return fields


def sizes_for(device: str) -> Sizes:
    """GPU: the sizes the issue asks for. CPU: tiny, and the real-size stand-in in float32 (this
    CPU's bf16 matrix-vector products are ~20x slower than float32's: 12 against 0.6 ms for a
    1 x 256 x 4096 product, which would time the CPU's bf16 kernel instead of the storage path)."""
    if not device.startswith("cuda"):
        return Sizes(
            2,
            4,
            24,
            3,
            6,
            2**16,
            real_config(True),
            torch.float32,
            (256, 1024),
            (1, 4),
            4,
            2,
            256,
            dict(
                identity=1.5,
                casts=1.0,
                storage=3.0,
                speed=3.0,
                memory=0.1,
                estimator=2.0,
                vllm_dtypes=1.0,
                vllm_engine=1.0,
                vllm_native=1.0,
            ),
            SHARES,
            8,
            2048,
        )
    return Sizes(
        30,
        4,
        96,
        8,
        16,
        4 * 2**20,
        real_config(False),
        torch.bfloat16,
        (8192, 32768),
        (1, 16),
        16,
        6,
        8192,
        dict(
            identity=10,
            casts=5,
            storage=15,
            speed=60,
            memory=5,
            estimator=15,
            vllm_dtypes=5,
            vllm_engine=0.1,
            vllm_native=0.1,
        ),
        SHARES,
        512,
        131072,
    )


# -- results ------------------------------------------------------------------------------------
class Report:
    def __init__(self):
        self.checks: list[dict] = []
        self.sections: list[dict] = []

    def add(
        self,
        section: str,
        name: str,
        status: str,
        figures: dict | None = None,
        reason: str = "",
        seconds: float | None = None,
    ) -> None:
        entry = {"section": section, "name": name, "status": status, "figures": figures or {}}
        if reason:
            entry["reason"] = reason
        if seconds is not None:
            entry["seconds"] = round(seconds, 4)
        self.checks.append(entry)
        mark = {"pass": "PASS", "fail": "FAIL", "skipped": "SKIP"}[status]
        print(f"{mark}  {name}" + (f"  ({reason})" if reason else ""), flush=True)

    def count(self, status: str) -> int:
        return sum(c["status"] == status for c in self.checks)


class Section:
    """One section while it runs: its checks, and the time it may still take."""

    def __init__(self, report: Report, key: str, title: str, deadline: float, clock):
        self.report, self.key, self.title, self.deadline, self.clock = report, key, title, deadline, clock
        self.started = clock()

    def left(self) -> float:
        return self.deadline - self.clock()

    def fits(self, seconds: float) -> bool:
        return self.left() >= seconds

    def check(self, name: str, ok: bool, figures: dict | None = None, reason: str = "", seconds: float | None = None):
        self.report.add(self.key, name, "pass" if ok else "fail", figures, reason, seconds)
        return ok

    def skip(self, name: str, reason: str, figures: dict | None = None) -> None:
        self.report.add(self.key, name, "skipped", figures, reason)

    def cut(self, names, why: str = "") -> None:
        for name in names:
            self.skip(name, why or f"cut: section {self.title!r} reached the end of its share of the budget")


@dataclass
class Plan:
    key: str
    title: str
    run: object  # callable(Section)
    min_s: float
    share_s: float
    needs: object = None  # callable() -> reason to skip (str) or None


def run_sections(
    plans: list[Plan], report: Report, end: float, budget_s: float, clock=time.perf_counter, after=None
) -> None:
    """Run ``plans`` in order within the budget ending at ``end`` (a ``clock`` time).

    A section starts only when at least its ``min_s`` is left; it may run until its share is used or
    until only the minimums of the later sections that can still start are left, whichever comes
    first (never less than its own minimum), and checks ``Section.left()`` between items."""
    for i, plan in enumerate(plans):
        now = clock()
        left = end - now
        reserve = 0.0
        for later in plans[i + 1 :]:  # the later sections that would still start after this one's minimum
            if later.min_s <= left - plan.min_s - reserve:
                reserve += later.min_s
        entry = {"key": plan.key, "name": plan.title, "share_s": plan.share_s, "min_s": plan.min_s}
        print(f"\n== {plan.title}", flush=True)
        reason = plan.needs() if plan.needs else None
        if reason is None and left < plan.min_s:
            reason = (
                f"budget: {max(left, 0):.1f} s left of {budget_s:g} s, this section needs at least {plan.min_s:g} s"
            )
        if reason is not None:
            report.add(plan.key, plan.title, "skipped", reason=reason)
            report.sections.append({**entry, "status": "skipped", "reason": reason, "seconds": 0.0})
            if after:
                after()
            continue
        deadline = min(end, max(now + plan.min_s, min(now + plan.share_s, end - reserve)))
        section = Section(report, plan.key, plan.title, deadline, clock)
        first = len(report.checks)
        try:
            plan.run(section)
        except Exception as exc:  # noqa: BLE001 - one failing section must not hide the others
            traceback.print_exc()
            section.check(
                f"{plan.title}: runs",
                False,
                reason=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            )
        mine = report.checks[first:]
        status = (
            "fail"
            if any(c["status"] == "fail" for c in mine)
            else "pass"
            if any(c["status"] == "pass" for c in mine)
            else "skipped"
        )
        seconds = clock() - now
        over = " (over its share)" if seconds > plan.share_s else ""
        entry.update(
            status=status, seconds=round(seconds, 3), cut=any(c["status"] == "skipped" for c in mine), checks=len(mine)
        )
        if status == "skipped":
            entry["reason"] = "; ".join(dict.fromkeys(c.get("reason", "") for c in mine)) or "nothing to check"
        report.sections.append(entry)
        print(f"   {plan.title}: {status}, {seconds:.1f} s{over}", flush=True)
        if after:
            after()


# -- shared state -------------------------------------------------------------------------------
class Context:
    def __init__(self, device: str, sizes: Sizes):
        self.device, self.sizes = torch.device(device), sizes
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.device.index is None:  # tensors report cuda:N, and torch.device("cuda") != cuda:0
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._embedded = None
        self.real = None  # the real-size model, built by section 4, freed after section 6
        self.real_error: str | None = None
        self.real_build_s = 0.0
        self.speed_runs: list[dict] = []  # section 4's runs, read by sections 5 and 6

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def embedded(self):
        if self._embedded is None:
            cfg = {**EMBEDDED_CONFIG, "num_hidden_layers": self.sizes.embedded_layers}
            self._embedded = build_model(cfg, self.device, torch.bfloat16, seed=0)
        return self._embedded

    def padded_batch(self, vocab: int):
        s = self.sizes
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(10, vocab, (s.batch, s.seq), generator=g)
        mask = torch.ones_like(ids)
        mask[1, : s.seq // 10] = 0  # left padding of different lengths
        mask[3 % s.batch, : s.seq // 3] = 0
        return ids.to(self.device), mask.to(self.device)


def build_model(fields: dict, device: torch.device, dtype: torch.dtype, seed: int):
    """A causal LM from a config with seeded random weights, built directly on ``device``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**fields)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    if any(p.device != device for p in model.parameters()):  # a release that builds elsewhere: move it (slower)
        model.to(device)
    model.eval()
    return model


def unique_params(model) -> int:
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen.setdefault(id(p), p.numel())
    return sum(seen.values())


# -- 1. identity --------------------------------------------------------------------------------
def identity(sec: Section, ctx: Context) -> None:
    from evalkit import quantized_kv

    model = ctx.embedded()
    ids, mask = ctx.padded_batch(model.config.vocab_size)
    n = ctx.sizes.generate
    kwargs = dict(attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=2)
    with torch.inference_mode():
        t = time.perf_counter()
        ref = model(ids, attention_mask=mask).logits
        gen = model.generate(ids, **kwargs)
        with quantized_kv(model, "bf16"):
            out = model(ids, attention_mask=mask).logits
            gen2 = model.generate(ids, **kwargs)
        ctx.sync()
        t = time.perf_counter() - t
    shape = {
        "batch": ids.shape[0],
        "tokens": ids.shape[1],
        "padded_rows": int((mask == 0).any(-1).sum()),
        "layers": model.config.num_hidden_layers,
        "dtype": "bfloat16",
    }
    diff = float((ref.float() - out.float()).abs().max())
    sec.check(
        "identity: logits of a padded batch bit-exact under bf16",
        torch.equal(ref, out),
        {**shape, "max_abs_diff": diff},
        seconds=t,
    )
    sec.check(
        f"identity: greedy generate() of {n} tokens bit-exact under bf16",
        torch.equal(gen, gen2),
        {**shape, "new_tokens": n, "tokens_differing": int((gen != gen2).sum())},
    )


# -- 2. float8 rounding -------------------------------------------------------------------------
def rounding_modes() -> list:
    """The rounding modes evalkit.kv.rounding has now (nearest even always; rtz / rna where present)."""
    from evalkit.kv import rounding

    modes = getattr(rounding, "Rounding", None)
    return list(modes) if modes is not None else ["rne"]


def mode_name(mode) -> str:
    return getattr(mode, "value", str(mode))


def format_table(fmt) -> tuple[torch.Tensor, torch.Tensor]:
    """Every finite value of ``fmt`` (float64, ascending, zero once) and whether its code is even."""
    if fmt.torch_dtype is not None and fmt.torch_dtype.is_floating_point and fmt.bits == 8:
        codes = torch.arange(128, dtype=torch.uint8)
        mags = codes.view(fmt.torch_dtype).to(torch.float64)
    else:  # FP4 E2M1: codes 0..7 are these magnitudes
        mags = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
        codes = torch.arange(8, dtype=torch.uint8)
    keep = torch.isfinite(mags)
    mags, even = mags[keep], (codes[keep] % 2 == 0)
    values = torch.cat([-mags[1:].flip(0), mags])
    evens = torch.cat([even[1:].flip(0), even])
    return values, evens


def reference_round(x: torch.Tensor, fmt, mode) -> torch.Tensor:
    """The independent reference: the value of ``fmt`` that ``mode`` picks among the two table
    values around each (clamped, float32) ``x``, by float64 comparisons; float32 out."""
    values, evens = format_table(fmt)
    x64 = x.detach().to("cpu", torch.float64)
    idx = torch.searchsorted(values, x64).clamp(1, len(values) - 1)
    lo, hi = values[idx - 1], values[idx]
    d_lo, d_hi = x64 - lo, hi - x64
    name = mode_name(mode)
    if name == "rtz":
        pick = torch.where(x64 >= 0, lo, hi)
    else:
        tie = torch.where(evens[idx - 1], lo, hi) if name == "rne" else torch.where(x64 >= 0, hi, lo)
        pick = torch.where(d_lo < d_hi, lo, torch.where(d_hi < d_lo, hi, tie))
    pick = torch.where(lo == x64, lo, torch.where(hi == x64, hi, pick))
    out = pick.to(torch.float32)
    zero = out == 0
    signed = torch.copysign(torch.zeros_like(out), x.detach().cpu()) if fmt.negative_zero else torch.zeros_like(out)
    return torch.where(zero, signed, out)


def cast_inputs(fmt, n: int, device: torch.device, seed: int) -> torch.Tensor:
    """Every table value, every midpoint, the float32 neighbours of both, ±0, float32 subnormals,
    and ``n`` random values log-uniform over the format's whole range with random signs; clamped."""
    values, _ = format_table(fmt)
    v = values.to(torch.float32)
    mid = ((values[1:] + values[:-1]) / 2).to(torch.float32)
    pts = torch.cat([v, mid])
    inf = torch.tensor(float("inf"))
    edges = torch.cat(
        [
            pts,
            torch.nextafter(pts, inf),
            torch.nextafter(pts, -inf),
            torch.tensor([0.0, -0.0, 1e-40, -1e-40, 1e-30, -1e-30, fmt.max, -fmt.max]),
        ]
    )
    g = torch.Generator(device=device).manual_seed(seed)
    smallest = math.log2(float(values[values > 0].min()))
    e = torch.rand(n, device=device, generator=g) * (math.log2(fmt.max) + 1 - smallest + 3) + smallest - 3
    sign = torch.where(torch.rand(n, device=device, generator=g) < 0.5, -1.0, 1.0)
    x = torch.cat([edges.to(device), sign * torch.exp2(e)])
    return x.clamp(-fmt.max, fmt.max)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, int, str]:
    a, b = a.detach().cpu(), b.detach().cpu()
    diff = a.view(torch.int32) != b.view(torch.int32)
    n = int(diff.sum())
    first = ""
    if n:
        i = int(diff.nonzero()[0, 0])
        first = f"first at index {i}: {float(a[i])!r} vs {float(b[i])!r}"
    return n == 0, n, first


def casts(sec: Section, ctx: Context) -> None:
    from evalkit.kv import rounding as R
    from evalkit.kv.formats import FORMATS

    formats = [f for f in FORMATS.values() if f.kind.value == "float"]  # the FP8 formats and FP4 E2M1
    items = [(f, m) for f in formats for m in rounding_modes()]

    def label(fmt, mode) -> str:
        cast = "device cast == " if fmt.bits == 8 and mode_name(mode) == "rne" else ""
        return f"{fmt.name} {mode_name(mode)}: {cast}emulation ({ctx.device.type}) == emulation (cpu) == reference"

    last = 0.0
    for i, (fmt, mode) in enumerate(items):
        if not sec.fits(last):
            sec.cut([label(f, m) for f, m in items[i:]])
            return
        t = time.perf_counter()
        name, fp8 = mode_name(mode), fmt.bits == 8
        x = cast_inputs(fmt, ctx.sizes.cast_values, ctx.device, seed=i)
        if name == "rne":
            emu, emu_cpu = R.round_to_fp8_emulated(x, fmt), R.round_to_fp8_emulated(x.cpu(), fmt)
        else:
            emu, emu_cpu = R.round_to_grid(x, fmt, mode), R.round_to_grid(x.cpu(), fmt, mode)
        ref = reference_round(x, fmt, mode)
        results = {"emulation_vs_cpu_emulation": same_bits(emu, emu_cpu), "emulation_vs_reference": same_bits(emu, ref)}
        if fp8:  # what the storage path calls: the cast or the emulation by size (nearest even), or the grid
            bound = fmt.with_rounding(mode) if hasattr(fmt, "with_rounding") else fmt
            results["storage_rounding_vs_reference"] = same_bits(R.round_to_fp8(x, bound), ref)
            if name == "rne":
                results["device_cast_vs_reference"] = same_bits(R.round_to_fp8_by_cast(x, fmt), ref)
        ctx.sync()
        ok = all(r[0] for r in results.values())
        figures = {
            "values": x.numel(),
            "device": ctx.device.type,
            **{k: {"mismatches": r[1], **({"first": r[2]} if r[2] else {})} for k, r in results.items()},
        }
        last = time.perf_counter() - t
        sec.check(
            label(fmt, mode),
            ok,
            figures,
            "" if ok else "; ".join(f"{k}: {r[1]} differ ({r[2]})" for k, r in results.items() if not r[0]),
            seconds=last,
        )


# -- 3. every scale source through storage ------------------------------------------------------
def storage_schemes() -> list[str]:
    from evalkit.kv.scheme import NAMED_SCHEMES, parse_scheme

    schemes = [
        "fp8_e4m3/tensor/dynamic",
        "fp8_e4m3/head/dynamic",
        "fp8_e4m3/block16/dynamic",
        "fp8_e4m3/token/dynamic",
        "fp8_e5m2/group32/dynamic",
        "fp8_e4m3/tensor/unit",
        "fp8_e4m3/head/unit",
        "fp8_e4m3/block16/unit",
        f"fp8_e4m3/tensor/static+scales=calibration/{CALIBRATION['tensor']}",
        f"fp8_e4m3/head/static+scales=calibration/{CALIBRATION['head']}",
        "int8/token/dynamic",
        "int4_asym/group32/dynamic",
        "fp8_e4m3fnuz/head/dynamic",
        "fp8_e4m3/head/dynamic+attn=fa3",
        "fp4_e2m1/group16/dynamic",
        *NAMED_SCHEMES,
        "fp8_e4m3/tensor/dynamic+rounding=rtz",
        "fp8_e5m2/head/dynamic+rounding=rna",
        "int8/token/dynamic+rounding=rtz",
    ]
    usable = []
    for s in schemes:
        try:
            parse_scheme(s)
            usable.append(s)
        except Exception:  # noqa: BLE001 - a format or option this version does not have
            pass
    return usable


def shipped_table(scheme, layout):
    """The shipped static table a scheme names, cut to the model's layers (the 2-layer CPU model)."""
    from evalkit.data.resources import resolve_calibration_file
    from evalkit.kv.scale_table import ScaleTable, load_scale_table

    path = resolve_calibration_file(scheme.static_path)
    table = load_scale_table(path, granularity=scheme.granularity.kind.value)
    n = layout.num_layers
    return ScaleTable(table.k_scale[:n].clone(), table.v_scale[:n].clone(), table.meta), path


def scheme_label(text: str) -> str:
    return (text.split("+scales=")[0] + ("+scales=<shipped table>" if "+scales=" in text else "")) + ": through storage"


def schemes_through_storage(sec: Section, ctx: Context) -> None:
    from evalkit import quantized_kv
    from evalkit.integration.hf_compat import cache_inputs, output_cache
    from evalkit.kv.scheme import ScaleSource, parse_scheme
    from evalkit.models.info import kv_layout

    model = ctx.embedded()
    layout = kv_layout(model.config)
    ids, mask = ctx.padded_batch(model.config.vocab_size)
    prefill = ids.shape[1] - ctx.sizes.decode
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        ref = model(ids, attention_mask=mask, position_ids=pos).logits.float()
    real = mask.bool()
    schemes = storage_schemes()
    last = 0.0
    for i, text in enumerate(schemes):
        if not sec.fits(last):
            sec.cut([scheme_label(s) for s in schemes[i:]])
            return
        t = time.perf_counter()
        try:
            scheme = parse_scheme(text)
            table, extra = None, {}
            if scheme.scales is ScaleSource.STATIC:
                table, path = shipped_table(scheme, layout)
                extra = {"table": path.name, "table_layers_used": layout.num_layers}
            with torch.inference_mode(), quantized_kv(model, scheme, scale_table=table):
                out = model(
                    ids[:, :prefill], attention_mask=mask[:, :prefill], position_ids=pos[:, :prefill], use_cache=True
                )
                cache, logits = output_cache(out), [out.logits.float()]
                for step in range(prefill, ids.shape[1]):
                    out = model(
                        ids[:, step : step + 1],
                        attention_mask=mask[:, : step + 1],
                        position_ids=pos[:, step : step + 1],
                        **cache_inputs(model, cache),
                    )
                    logits.append(out.logits.float())
            logits = torch.cat(logits, dim=1)
            stores = [st for layer in cache.storage_layers() for st in (layer.k, layer.v)]
            devices = sorted(
                {
                    tt.device.type
                    for st in stores
                    for tt in (st.codes, st.values, st.scale, st.zero, st.fixed, st.tensor_scale)
                    if tt is not None
                }
            )
            exact = True
            for st in stores:
                sel = real[:, None, -st.values.shape[2] :, None].expand_as(st.values)
                exact &= torch.equal(st.decoded().to(st.values.dtype)[sel], st.values[sel])
            lp, lq = torch.log_softmax(ref[real].double(), -1), torch.log_softmax(logits[real].double(), -1)
            kl = float((lp.exp() * (lp - lq)).sum(-1).mean())
            top1 = float((ref[real].argmax(-1) == logits[real].argmax(-1)).double().mean())
            finite = bool(torch.isfinite(logits[real]).all())
            ctx.sync()
            ok = devices == [ctx.device.type] and exact and finite and kl < KL_LIMIT
            last = time.perf_counter() - t
            sec.check(
                scheme_label(text),
                ok,
                {
                    "devices": devices,
                    "decoded_equals_values": bool(exact),
                    "finite": finite,
                    "mean_kl_nats": kl,
                    "kl_limit": KL_LIMIT,
                    "top1_agreement": top1,
                    "engine_bytes": cache.nbytes(),
                    "prefill": prefill,
                    "decode_steps": ctx.sizes.decode,
                    **extra,
                },
                "" if ok else f"devices {devices}, decoded == values: {bool(exact)}, finite: {finite}, KL {kl:.4f}",
                seconds=last,
            )
        except Exception as exc:  # noqa: BLE001 - report and go on
            traceback.print_exc()
            last = time.perf_counter() - t
            sec.check(scheme_label(text), False, reason=f"{type(exc).__name__}: {exc}", seconds=last)


# -- 4. decode speed on the real-size model ------------------------------------------------------
def real_model_needs(ctx: Context) -> str | None:
    """Why the real-size model cannot be built here (one line), or None."""
    if not ctx.cuda:
        return None
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(AutoConfig.for_model(**ctx.sizes.real), dtype=torch.bfloat16)
    need = unique_params(meta) * 2 + 4 * GiB
    free, total = torch.cuda.mem_get_info(ctx.device)
    if free < need:
        return (
            f"too little GPU memory for the real-size model: {free / GiB:.1f} GiB free of {total / GiB:.1f}, "
            f"it needs {need / GiB:.1f} GiB (bf16 weights + 4 GiB)"
        )
    return None


def ensure_real(ctx: Context):
    if ctx.real is None and ctx.real_error is None:
        reason = real_model_needs(ctx)
        if reason:
            ctx.real_error = reason
            print(reason, flush=True)
        else:
            t = time.perf_counter()
            ctx.real = build_model(ctx.sizes.real, ctx.device, ctx.sizes.real_dtype, seed=1)
            ctx.sync()
            ctx.real_build_s = time.perf_counter() - t
            print(f"   real-size model built on {ctx.device} in {ctx.real_build_s:.1f} s", flush=True)
    return ctx.real


def speed(sec: Section, ctx: Context) -> None:
    """Section 4 (benchmarks/gpu_check_decode.py): the storage path's compiled decode step against
    transformers' compiled static-cache step, with the HBM floor and the GPU-busy time; the eager arms."""
    import gpu_check_decode as decode

    from evalkit.sweep.speed_probe import PROBE_SCHEME

    model = ensure_real(ctx)
    if model is None:
        sec.skip("real-size model: decode speed", ctx.real_error)
        return
    fields = ctx.sizes.real
    sec.check(
        "real-size model built from its config with random weights, on the device",
        all(p.device == ctx.device for p in model.parameters()),
        {
            "config": {
                k: fields[k]
                for k in (
                    "num_hidden_layers",
                    "hidden_size",
                    "num_attention_heads",
                    "num_key_value_heads",
                    "head_dim",
                    "intermediate_size",
                    "vocab_size",
                )
            },
            "dtype": str(model.dtype).removeprefix("torch."),
            "parameters": unique_params(model),
            "build_s": round(ctx.real_build_s, 3),
        },
        seconds=ctx.real_build_s,
    )
    decode.decode_speed(sec, ctx, model, PROBE_SCHEME)


# -- 5. memory ----------------------------------------------------------------------------------
def memory(sec: Section, ctx: Context) -> None:
    """Section 5 (benchmarks/gpu_check_decode.py): held bytes against the engine's bytes, and every FP8
    scheme's peak against the reference's."""
    import gpu_check_decode as decode

    decode.memory(sec, ctx, ctx.real)


# -- 6. the dry run's estimator -----------------------------------------------------------------
def real_facts(ctx: Context, model):
    """The dry run's facts (evalkit.models.facts: the parameter count from the config on the meta
    device) for the real-size config, loaded as here."""
    from evalkit.models.facts import ModelFacts, _from_config

    facts = ModelFacts(
        name=f"{REAL_PRESET} (random weights{'' if ctx.cuda else ', CPU stand-in'})",
        dtype_bytes=float(model.dtype.itemsize),
        weights_local=True,
        source="gpu_check's model in memory",
    )
    _from_config(facts, dict(ctx.sizes.real))
    return facts


def estimator(sec: Section, ctx: Context) -> None:
    from evalkit.integration.install import quantized_kv
    from evalkit.models import loading as models
    from evalkit.models.info import config_hash, kv_layout
    from evalkit.models.presets import get_preset
    from evalkit.sweep import speed_probe as P
    from evalkit.sweep import throughput as T
    from evalkit.sweep.workload import Forwards

    model = ensure_real(ctx)
    if model is None:
        sec.skip("dry-run estimate vs measured", ctx.real_error)
        return
    facts = real_facts(ctx, model)
    built = unique_params(model)
    figures = {
        "params": facts.params,
        "layers": facts.layers,
        "attn_width": facts.attn_width,
        "kv_width": facts.kv_width,
        "params_of_built_model": built,
    }
    ok = facts.params == built and facts.layers == model.config.num_hidden_layers
    if ctx.cuda:  # the preset's published count, which the dry run uses for a model that is not cached
        published = get_preset(REAL_PRESET)["params"]
        figures["preset_published_params"] = published
        ok &= abs(built / published - 1) < 0.01
    sec.check("dry-run facts of the real-size model match the built model", ok, figures)
    if not sec.fits(1.0):
        sec.cut(["dry-run estimate (probe and --assume-device h200) vs measured"])
        return
    # the dry run's real probe, on the model in memory
    loaded = models.LoadedModel(
        model, None, facts.name, "in memory", config_hash(model.config), kv_layout(model.config)
    )
    t = time.perf_counter()
    probes = {c: P.probe_model(loaded, facts, compiled=c) for c in (False, True)}  # both decode paths
    probe_s = time.perf_counter() - t
    sheets = {c: T.datasheet(facts, "h200", compiled=c) for c in (False, True)}
    probe, sheet = probes[True], sheets[True]
    # measured prefill: one forward of the prefill length under the probe's scheme, timed as the probe times its own
    head = model.get_output_embeddings()
    g = torch.Generator(device=ctx.device).manual_seed(5)
    ids = torch.randint(10, head.out_features, (1, ctx.sizes.prefill), device=ctx.device, generator=g)
    with torch.inference_mode(), quantized_kv(model, P.PROBE_SCHEME):
        model.base_model(input_ids=ids, use_cache=False)  # warm-up at the full length (the first call is not warm)
        ctx.sync()
        t = time.perf_counter()
        hidden = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
        for chunk in hidden.split(1024, dim=1):  # the head over every position (the estimator counts its FLOPs), in
            head(chunk).float()  # pieces so that no (tokens x vocabulary) tensor is held at once
        ctx.sync()
        t_prefill = time.perf_counter() - t
        del hidden
    measured = [("prefill", Forwards(1, 1, ctx.sizes.prefill, 0.0), t_prefill, False, None)]
    for run in ctx.speed_runs:  # every decode arm: the compiled ones priced on the compiled path
        compiled = "compiled" in run["arm"]
        length = run["context"] + ctx.sizes.warmup + ctx.sizes.steps + 4
        stored = None
        if run.get("scheme"):
            from evalkit.kv.memory import bytes_per_element
            from evalkit.kv.scheme import parse_scheme

            stored = bytes_per_element(parse_scheme(run["scheme"]), facts.head_dim or 128)
        measured.append(
            (
                f"{run['arm']}: step at {run['context']} context, batch {run['batch']}",
                Forwards(1, run["batch"], 1, run["context"] + ctx.sizes.warmup + ctx.sizes.steps / 2, length),
                run["step_ms"] / 1e3,
                compiled,
                stored,
            )
        )
    device_name = torch.cuda.get_device_name(ctx.device) if ctx.cuda else "cpu"
    judged = ctx.cuda and "H200" in device_name
    rows = []
    for what, fw, secs, compiled, stored in measured:
        p_sheet = sheets[compiled].seconds(fw, facts, stored)
        p_probe = probes[compiled].seconds(fw, facts, stored)
        rows.append(
            {
                "what": what,
                "measured_s": secs,
                "datasheet_h200_s": p_sheet,
                "probe_s": p_probe,
                "datasheet_vs_measured": p_sheet / secs,
                "probe_vs_measured": p_probe / secs,
            }
        )
    finite = all(
        math.isfinite(r["datasheet_h200_s"]) and math.isfinite(r["probe_s"]) and r["probe_s"] > 0 for r in rows
    )
    within = all(1 / ESTIMATE_FACTOR <= r["datasheet_vs_measured"] <= ESTIMATE_FACTOR for r in rows)
    ok = finite and (within or not judged)
    reason = "" if judged else f"not judged: the datasheet estimate is for an H200, this is {device_name}"
    if judged and not within:
        reason = f"the datasheet estimate is off by more than {ESTIMATE_FACTOR:g}x somewhere"
    for r in rows:
        print(
            f"      {r['what']:38s} measured {r['measured_s'] * 1e3:10.2f} ms, h200 datasheet {r['datasheet_h200_s'] * 1e3:10.2f} ms, "
            f"probe {r['probe_s'] * 1e3:10.2f} ms",
            flush=True,
        )
    sec.check(
        "dry-run estimate (probe and --assume-device h200) vs measured",
        ok,
        {
            "rows": rows,
            "judged": judged,
            "factor": ESTIMATE_FACTOR,
            "device": device_name,
            "probe": {
                "description": probe.description,
                "flops": probe.flops,
                "bandwidth": probe.bandwidth,
                "seconds": probe_s,
            },
            "datasheet": {
                "description": sheet.description,
                "flops": sheet.flops,
                "bandwidth": sheet.bandwidth,
                "overhead_s": sheet.overhead,
            },
        },
        reason,
    )


# -- 7. vLLM kv_cache_dtypes on the device ------------------------------------------------------
# Per ``vllm:<kv_cache_dtype>`` evalkit models (evalkit.kv.codecs.vllm) beyond the per-tensor FP8
# ones (sections 2 and 3 cover those): K and V of seeded random values (outlier channels, an
# all-zero token) encoded by evalkit's emulation on the device and on the CPU, and every FP8/FP4
# cast the emulation makes, recorded as it runs, against the device's own conversion and the
# hardware rule (PTX cvt.rn.satfinite: nearest even, saturating; the float64 table search).
PER_TENSOR = ("fp8", "fp8_e4m3", "fp8_e5m2")  # per-tensor FP8: sections 2 and 3
FLOAT8_DTYPES = {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}


def vllm_dtype_items() -> list[tuple[str, object, bool]]:
    """(dtype name, scheme, is MLA) for every modelled vLLM dtype this checkout has (none if it has none)."""
    try:
        from evalkit.kv.codecs.vllm.dtypes import VLLM_DTYPES, Arch, Status
        from evalkit.kv.codecs.vllm.family import vllm_scheme
    except ImportError:
        return []
    items = []
    for name, d in VLLM_DTYPES.items():
        if d.status is Status.MODELLED and name not in PER_TENSOR:
            items.append((name, vllm_scheme(name), d.arch is Arch.MLA))
    return items


class CastRecorder:
    """Records, while active, every float32 -> float8 ``Tensor.to`` (a TorchFunctionMode) and every
    E2M1 rounding (``evalkit.kv.microscaling.round_to_grid`` for FP4, replaced inside this block
    only and restored on exit): (format name, input, output)."""

    def __init__(self):
        self.casts: list[tuple[str, torch.Tensor, torch.Tensor]] = []

    def __enter__(self):
        from torch.overrides import TorchFunctionMode

        from evalkit.kv import microscaling

        recorder = self

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func is torch.Tensor.to and isinstance(out, torch.Tensor) and out.dtype in FLOAT8_DTYPES:
                    src = args[0]
                    if src.dtype not in FLOAT8_DTYPES:
                        recorder.casts.append((FLOAT8_DTYPES[out.dtype], src.detach().float(), out.detach()))
                return out

        self._mx, self._grid = microscaling, microscaling.round_to_grid

        def grid(y, fmt, *args, **kwargs):
            out = self._grid(y, fmt, *args, **kwargs)
            if fmt.bits == 4:
                recorder.casts.append(("fp4_e2m1", y.detach().float(), out.detach()))
            return out

        microscaling.round_to_grid = grid
        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        self._mx.round_to_grid = self._grid
        return False


def vllm_inputs(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Seeded float32 K or V (CPU): normal values, four outlier channels (x20), one all-zero token."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    x[..., : min(4, shape[-1])] *= 20.0
    x[:, :, 0] = 0.0
    return x


def device_float4_cast(device: torch.device) -> str:
    """Whether torch converts float32 to FP4 on ``device`` (one line: why not, where it does not)."""
    dt = getattr(torch, "float4_e2m1fn_x2", None)
    if dt is None:
        return f"torch {torch.__version__} has no float4 dtype"
    try:
        torch.zeros(2, device=device).to(dt)
    except Exception as exc:  # noqa: BLE001 - the reason is the figure
        return f"torch {torch.__version__} has no float32 -> float4_e2m1fn_x2 conversion ({type(exc).__name__})"
    return "available"


def encode_both(x: torch.Tensor, scheme, role: str, device: torch.device):
    """evalkit's emulation of one side (K or V) on ``device`` (casts recorded) and on the CPU."""
    from evalkit.kv.quantize import quantize

    fmt, gran = scheme.kv_format, scheme.granularity
    with CastRecorder() as rec:
        q_dev = quantize(x.to(device), fmt, gran, role=role)
    q_cpu = quantize(x, fmt, gran, role=role)
    return q_dev, q_cpu, rec.casts


def _bytes(q, fmt) -> torch.Tensor:
    from evalkit.kv.quantize import encode_quantized

    stored = encode_quantized(q, fmt).detach().cpu().contiguous()
    return stored.view(torch.uint8) if stored.element_size() == 1 else stored.view(torch.uint8).reshape(-1)


def vllm_label(name: str, ctx: Context) -> str:
    return f"vllm:{name}: emulation ({ctx.device.type}) == emulation (cpu), its casts == device conversion == rule"


def vllm_dtypes(sec: Section, ctx: Context) -> None:
    from evalkit.kv.formats import FORMATS
    from evalkit.kv.quantize import dequantize

    items = vllm_dtype_items()
    if not items:
        sec.skip("vLLM dtypes", "this checkout has no evalkit.kv.codecs.vllm")
        return
    s = ctx.sizes
    fp4 = device_float4_cast(ctx.device)
    last = 0.0
    for i, (name, scheme, mla) in enumerate(items):
        if not sec.fits(last):
            sec.cut([vllm_label(n, ctx) for n, _, _ in items[i:]])
            return
        t = time.perf_counter()
        dims = (("k", 512), ("v", 64)) if mla else (("k", 64), ("v", 64))
        heads = 1 if mla else 8
        figures: dict = {"shape": None, "device": ctx.device.type, "roles": {}}
        ok = True
        for role, d in dims:
            shape = (s.batch, heads, s.vllm_tokens, d)
            figures["shape"] = [s.batch, heads, s.vllm_tokens]
            x = vllm_inputs(shape, seed=1000 * i + (role == "v"))
            q_dev, q_cpu, casts = encode_both(x, scheme, role, ctx.device)
            b_dev, b_cpu = _bytes(q_dev, scheme.kv_format), _bytes(q_cpu, scheme.kv_format)
            byte_diff = int((b_dev != b_cpu).sum()) if b_dev.shape == b_cpu.shape else -1
            v_dev = dequantize(q_dev, torch.float32).cpu()
            value_same = same_bits(v_dev.reshape(-1), dequantize(q_cpu, torch.float32).reshape(-1))
            entry = {
                "values": x.numel(),
                "stored_bytes": b_dev.numel(),
                "stored_bytes_differing_from_cpu": byte_diff,
                "dequantized_differing_from_cpu": value_same[1],
                "casts": {},
            }
            scale_same = (True, 0, "")
            if q_dev.scale is not None and q_dev.scale.numel():  # scales kept beside the codes (per-token-head)
                scale_same = same_bits(q_dev.scale.float().reshape(-1), q_cpu.scale.float().reshape(-1))
                entry["scales_differing_from_cpu"] = scale_same[1]
            ok &= byte_diff == 0 and value_same[0] and scale_same[0]
            for fmt_name in dict.fromkeys(c[0] for c in casts):
                fmt = FORMATS[fmt_name]
                ins = torch.cat([c[1].reshape(-1).cpu() for c in casts if c[0] == fmt_name])
                outs = torch.cat([c[2].float().reshape(-1).cpu() for c in casts if c[0] == fmt_name])
                rule = reference_round(ins.clamp(-fmt.max, fmt.max), fmt, "rne")
                got = {"emulation_vs_rule": same_bits(outs, rule)}
                if fmt.bits == 8:  # the emulation's cast is torch's: on the device, the device's conversion
                    got["device_cast_vs_cpu_cast"] = same_bits(outs, ins.to(fmt.torch_dtype).float())
                    conversion = f"torch's {fmt.torch_dtype} cast on {ctx.device.type}"
                else:
                    conversion = f"evalkit's E2M1 rounding; device float4 conversion: {fp4}"
                entry["casts"][fmt_name] = {
                    "count": ins.numel(),
                    "inputs_beyond_max": int((ins.abs() > fmt.max).sum()),  # the rule saturates them
                    "conversion": conversion,
                    **{k: {"mismatches": r[1], **({"first": r[2]} if r[2] else {})} for k, r in got.items()},
                }
                ok &= all(r[0] for r in got.values())
            if not casts:
                entry["casts"] = "none: no FP8/FP4 cast on this side (integer, codebook, UE8M0 or 16-bit arithmetic)"
            figures["roles"][role] = entry
        last = time.perf_counter() - t
        reason = "" if ok else "the device's bytes or casts differ: see figures"
        sec.check(vllm_label(name, ctx), ok, figures, reason, seconds=last)


# -- 8. the vLLM engine path --------------------------------------------------------------------------
def vllm_engine(sec: Section, ctx: Context) -> None:
    """Section 8 (benchmarks/gpu_check_vllm.py): vLLM on this device as evalkit's engine, when importable."""
    import gpu_check_vllm

    gpu_check_vllm.engine_section(sec, ctx)


# -- 9. the engine-native run -------------------------------------------------------------------------------------
def vllm_native(sec: Section, ctx: Context) -> None:
    """Section 9 (benchmarks/gpu_check_vllm.py): an engine-native run through vLLM, when importable."""
    import gpu_check_vllm

    gpu_check_vllm.native_section(sec, ctx)


# -- main -----------------------------------------------------------------------------------------
def versions(ctx: Context) -> dict:
    import transformers

    import evalkit

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "evalkit": evalkit.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "device": torch.cuda.get_device_name(ctx.device) if ctx.cuda else (platform.processor() or platform.machine()),
        "platform": platform.platform(),
    }


def default_out() -> Path:
    return Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else Path("gpu_check.json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default), or cpu: the same checks at tiny sizes")
    ap.add_argument(
        "--budget-s", type=float, default=560.0, help="wall-time budget in seconds, imports included (default 560)"
    )
    ap.add_argument(
        "--out", type=Path, default=None, help="the JSON file (default $OUT/gpu_check.json, else ./gpu_check.json)"
    )
    args = ap.parse_args(argv)
    start = T0 if argv is None else time.perf_counter()
    end = start + args.budget_s
    out = args.out or default_out()
    report = Report()
    want_cuda = args.device.startswith("cuda")
    no_cuda = want_cuda and not torch.cuda.is_available()
    device = "cpu" if no_cuda else args.device
    sizes = sizes_for(args.device)
    ctx = Context(device, sizes)
    if want_cuda and not no_cuda:
        torch.cuda.set_device(ctx.device)
    info = versions(ctx)
    print(
        f"gpu_check on {info['device']}: python {info['python']}, torch {info['torch']} (CUDA {info['cuda']}), "
        f"transformers {info['transformers']}; budget {args.budget_s:g} s",
        flush=True,
    )
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # random configs make transformers talk (generation flags, token ids)
    if no_cuda:
        print(
            "no CUDA device: the GPU checks cannot run here (python benchmarks/gpu_check.py --device cpu tests the script)"
        )
        report.add("setup", "a CUDA device is present", "fail", reason="torch.cuda.is_available() is False")

    def needs_device():
        return "no CUDA device" if no_cuda else None

    def needs_real():
        return needs_device() or ctx.real_error

    def needs_runs():
        return needs_real() or (None if ctx.speed_runs else "section 4 made no decode runs to measure")

    m, sh = sizes.min_s, sizes.share_s
    plans = [
        Plan(
            "identity",
            "1. identity bit-exact in bf16",
            lambda s: identity(s, ctx),
            m["identity"],
            sh["identity"],
            needs_device,
        ),
        Plan(
            "casts",
            "2. float8 rounding: device cast and emulation vs reference",
            lambda s: casts(s, ctx),
            m["casts"],
            sh["casts"],
            needs_device,
        ),
        Plan(
            "storage",
            "3. every scale source through storage",
            lambda s: schemes_through_storage(s, ctx),
            m["storage"],
            sh["storage"],
            needs_device,
        ),
        Plan(
            "speed",
            "4. decode step: storage path (compiled) vs transformers' compiled static cache, the HBM floor (real-size model)",
            lambda s: speed(s, ctx),
            m["speed"],
            sh["speed"],
            needs_real,
        ),
        Plan(
            "memory",
            "5. memory: held vs the engine's bytes, every FP8 scheme's peak vs the reference's",
            lambda s: memory(s, ctx),
            m["memory"],
            sh["memory"],
            needs_runs,
        ),
        Plan(
            "estimator",
            "6. dry-run probe and --assume-device h200 estimate vs measured",
            lambda s: estimator(s, ctx),
            m["estimator"],
            sh["estimator"],
            needs_real,
        ),
        Plan(
            "vllm_dtypes",
            "7. vLLM kv_cache_dtypes: emulation on the device vs the CPU, FP8/FP4 casts vs the device's conversion",
            lambda s: vllm_dtypes(s, ctx),
            m["vllm_dtypes"],
            sh["vllm_dtypes"],
            needs_device,
        ),
        Plan(
            "vllm_engine",
            "8. vLLM engine path (when vLLM is importable here)",
            lambda s: vllm_engine(s, ctx),
            m["vllm_engine"],
            sh["vllm_engine"],
            needs_device,
        ),
        Plan(
            "vllm_native",
            "9. engine-native run through vLLM: no transformers weights, peak memory (when vLLM is importable here)",
            lambda s: vllm_native(s, ctx),
            m["vllm_native"],
            sh["vllm_native"],
            needs_device,
        ),
    ]

    def write(complete: bool) -> dict:
        """The JSON, rewritten after every section, so that a run cut short still leaves what it measured."""
        result = {
            "script": "benchmarks/gpu_check.py",
            "device": args.device,
            "mode": "gpu" if want_cuda else "cpu self-test",
            "complete": complete,
            "budget_s": args.budget_s,
            "wall_s": round(time.perf_counter() - start, 3),
            "versions": info,
            "passed": report.count("pass"),
            "failed": report.count("fail"),
            "skipped": report.count("skipped"),
            "sections": report.sections,
            "checks": report.checks,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
        tmp.replace(out)
        return result

    try:
        run_sections(plans, report, end, args.budget_s, after=lambda: write(False))
    finally:
        ctx.real = ctx._embedded = None
        hf_logging.set_verbosity(verbosity)
    result = write(True)
    wall, failed = result["wall_s"], result["failed"]
    print(
        f"\n{result['passed']} passed, {failed} failed, {result['skipped']} skipped in {wall:.1f} s "
        f"(budget {args.budget_s:g} s); sections: "
        + ", ".join(f"{s['key']} {s['status']}" for s in report.sections)
        + f"; JSON: {out}"
    )
    for c in report.checks:
        if c["status"] == "fail":
            print(f"  FAILED: {c['name']}" + (f" ({c['reason']})" if c.get("reason") else ""))
    return min(failed, 125)


if __name__ == "__main__":
    sys.exit(main())
