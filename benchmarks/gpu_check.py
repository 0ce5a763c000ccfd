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

Modules: this file is the entry (set-up, the order of the sections, the JSON); the sections and what they share
live beside it, imported from this folder: gpu_check_budget (the budget and the report), gpu_check_models
(configs, sizes, the models built from them), gpu_check_storage (1, 3), gpu_check_casts (2),
gpu_check_decode (4, 5), gpu_check_estimator (6), gpu_check_vllm_dtypes (7), gpu_check_vllm (8, 9).

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
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sections: the gpu_check_*.py beside it
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from evalkit.runtime import numerics

numerics.configure()  # as the command line: batch-invariant BLAS on CPU, before the first matrix product

import torch
from gpu_check_budget import Plan, Report, Section, run_sections
from gpu_check_casts import casts
from gpu_check_estimator import estimator
from gpu_check_models import Context, ensure_real, sizes_for, unique_params
from gpu_check_storage import identity, schemes_through_storage
from gpu_check_vllm_dtypes import vllm_dtypes


# -- 4. decode speed on the real-size model ------------------------------------------------------
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
