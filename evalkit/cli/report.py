"""`evalkit report DIR`: the publishable table, plots and a recommendation from a results store.

    python -m evalkit report results/default                       # Markdown table + recommendation
    python -m evalkit report results/default --format latex --out table.tex --plots figures/

Reads the store only (runs with a completion record); nothing is re-evaluated. Notes under the
table say what a reader needs: the scale file of each static scheme, the baseline's dtype, columns
that do not separate the schemes, and a MIXED CODE warning when the counted runs were computed by
more than one version of evalkit's code (the report still prints the table; resuming the sweep
recomputes the older runs). Under the table a ``Platform:`` line says what computed the numbers
besides evalkit's code (CPU, BLAS mode, torch and transformers, the engine where one was used), with
a WARNING when that differs from the published store's (:mod:`evalkit.report.platform`).
``--columns kl`` adds the per-token KL percentiles (median, 99th, 99.9th, maximum) of perplexity
runs that recorded them; a store made before they existed says so instead. CSV keeps raw values
(the percentiles included, where present) and prints its notes to stderr.

It reads what evalkit writes, one folder or several (``report DIR1 DIR2``):

- results stores (``sweep``, ``run --out``), several as one table (:func:`evalkit.report.results.load_stores`:
  a run found in two stores counts once, differing numbers are a CONFLICT note, different parameters
  for one evaluation are refused); a run a crash cut off (a torn last line) is a WARNING naming it,
  with the command that re-runs it;
- capacity folders (``capacity --engine vllm --out``: ``serving.jsonl``), their rows on the engine's lines;
- conformance folders (``conformance --out``: ``conformance.json``), whose "Does it match the engine?"
  section follows the recommendation, or, alone, is printed as ``conformance --from DIR`` prints it.

Every engine row shows the emulation under ``--engine-profile`` (default vllm-cuda): the prediction
for the engine the user serves with (:mod:`evalkit.report.prediction`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evalkit.cli import COMMANDS
from evalkit.errors import EvalkitError


def add_parser(sub):
    p = sub.add_parser("report", help=COMMANDS["report"])
    p.add_argument(
        "folders",
        nargs="+",
        type=Path,
        metavar="FOLDER",
        help="what evalkit wrote: results stores (`sweep`, `run --out`; several are reported as one table), "
        "conformance folders (`conformance --out`) and capacity folders (`capacity --engine vllm --out`)",
    )
    p.add_argument("--format", choices=["md", "latex", "csv"], default="md", help="table format (default md)")
    p.add_argument("--out", type=Path, default=None, help="write the table to this file instead of stdout")
    p.add_argument("--plots", type=Path, default=None, help="folder for PNG and SVG plots")
    p.add_argument(
        "--columns",
        default="",
        metavar="GROUPS",
        help="optional column groups, comma-separated: kl (per-token KL median, p99, p99.9, max; "
        "perplexity runs that recorded them)",
    )
    p.add_argument(
        "--sensitivity",
        type=Path,
        default=None,
        help="rows.jsonl (or its folder) of `evalkit sensitivity --out DIR`, for the per-layer plot",
    )
    p.add_argument(
        "--engine-profile",
        default="vllm-cuda",
        metavar="PROFILE",
        help="the engine you serve with: each engine row shows the emulation under its profile, the prediction "
        "for that engine (default vllm-cuda: CUDA vLLM, nearest-even rounding)",
    )
    _add_budget_arguments(p)
    p.set_defaults(handler=run)


# the recommendation's quality budget (evalkit.report.budget.Budget, whose defaults these equal: a test
# holds them together; not imported here, so `report --help` and argparse errors need no pandas)
BUDGET_DEFAULTS = {
    "max_ppl_rel": 0.01,
    "max_kl": 0.02,
    "max_dp_drop": 0.005,
    "min_top1": None,
    "max_retrieval_drop": 0.02,
    "max_flip_rate": 0.05,
    "max_task_drop": None,
    "max_failure_rate": None,
}
BUDGET_HELP = {
    "max_ppl_rel": "|Δppl|/ppl at most this (default 0.01: Q5_K_M weights cost Llama-3-8B +0.9 %% in llama.cpp)",
    "max_kl": "mean KL(baseline || scheme) in nats at most this (default 0.02: between llama.cpp's Q5_K_M 0.011 "
    "and Q4_K_M 0.031 on Llama-3-8B)",
    "max_dp_drop": "mean change of the correct token's probability at least minus this (default 0.005 = 0.5 points: "
    "between Q5_K_M's -0.11 %% and Q4_K_M's -0.60 %%)",
    "min_top1": "top-1 agreement at least this (default none: even FP8 E4M3 agrees on ~95 %% of tokens)",
    "max_retrieval_drop": "retrieval accuracy drop at most this (default 0.02 = 2 points)",
    "max_flip_rate": "lm-eval answers changed at most this share, per task (default 0.05: one in twenty)",
    "max_task_drop": "generation task accuracy drop at most this, paired at 95 %% (default none; 0.01 = one point)",
    "max_failure_rate": "generation failure-gate rate per task (repeats, collapse, runaway, first-token EOS, invalid "
    "UTF-8 where the baseline had none) at most this, at 95 %% (default none; 0.01 = one item-sample in 100)",
}


def _budget_value(text: str):
    if text.strip().lower() in ("none", "off"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (or none to turn the criterion off)") from None


def _add_budget_arguments(p) -> None:
    g = p.add_argument_group(
        "quality budget of the recommendation (a number, or none to turn a criterion off; see "
        "docs/report.md#the-quality-budget)"
    )
    for name, text in BUDGET_HELP.items():
        g.add_argument(
            f"--{name.replace('_', '-')}",
            type=_budget_value,
            default=BUDGET_DEFAULTS[name],
            metavar="X",
            help=text,
        )


def run(args: argparse.Namespace) -> int:
    from evalkit.sweep.preflight import check_writable

    check_writable(args.out, "--out", kind="file")  # before reading the store: nothing written, nothing half-done
    check_writable(args.plots, "--plots")
    from evalkit.report import Budget, format_table, recommend, summary_frame
    from evalkit.report.plots import all_plots
    from evalkit.report.tables import COLUMN_GROUPS

    columns = tuple(c.strip() for c in args.columns.split(",") if c.strip())
    unknown = [c for c in columns if c not in COLUMN_GROUPS]
    if unknown:
        raise EvalkitError(f"--columns {','.join(unknown)}: unknown column group; use {', '.join(COLUMN_GROUPS)}")
    from evalkit.engines.registry import get_profile

    get_profile(args.engine_profile)  # an unknown profile: one line, before anything is read
    results, conformance = _sources(args.folders)
    if results is None:  # conformance folders only
        return _conformance_only(conformance, args)
    if args.sensitivity:
        from evalkit.report.results import add_rows_file

        add_rows_file(results, args.sensitivity)
    frame = summary_frame(results, engine_profile=args.engine_profile)
    text = format_table(frame, args.format, columns)
    from evalkit.report.platform import report_lines
    from evalkit.report.provenance import cut_off_warnings

    about = report_lines(results) + cut_off_warnings(results) + _absent_columns(frame, columns, results.folder)
    if args.format == "csv":  # CSV holds raw values only: its notes (mixed code, constant columns...) go to stderr
        from evalkit.report.tables import table_notes

        for note in table_notes(frame):
            print(f"note: {note}", file=sys.stderr)
    budget = Budget(**{name: getattr(args, name) for name in BUDGET_HELP})
    lines = list(recommend(frame, budget, engine=args.engine_profile).values())
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"table written to {args.out}")
    else:
        print(text, end="")
    prefix = "% " if args.format == "latex" and not args.out else ""
    if args.format == "csv" and not args.out:  # stdout holds the CSV alone
        for line in about:
            print(f"note: {line}", file=sys.stderr)
    else:
        print()
        for line in about:
            print(prefix + line)
    if args.format != "csv" or args.out:
        print()
        for line in lines:
            print(prefix + "Recommendation: " + line)
    if conformance and args.format == "md" and not args.out:
        from evalkit.engines.vllm.conformance_report import load_report, render_markdown

        for folder in conformance:
            print("\n## Does it match the engine?\n")
            print(render_markdown(load_report(folder)), end="")
    if args.plots:
        paths = all_plots(results, frame, args.plots)
        from evalkit.report.pareto import pareto_data

        if any(p.stem == "pareto" for p in paths):  # the points of the Pareto plot, with what each stands for
            pareto_data(frame).to_csv(args.plots / "pareto.csv", index=False)
            paths.append(args.plots / "pareto.csv")
        print(f"{len(paths)} plot files written to {args.plots}")
    return 0


WRITTEN = {  # what evalkit writes into a folder -> the command that wrote it
    "results.jsonl": "a results store: `sweep`, `run --out`",
    "conformance.json": "`conformance --out`",
    "serving.jsonl": "`capacity --engine vllm --out`",
}


def _sources(paths):
    """(one Results of every results store and capacity folder, or None; the conformance folders), in
    the order given. A folder may hold several of them; a file evalkit wrote stands for its folder."""
    from evalkit.report.results import add_serving_rows, load_stores

    stores, conformance, capacity = [], [], []
    for path in paths:
        folder = path.parent if path.name in WRITTEN and path.is_file() else path
        if not folder.is_dir():
            raise EvalkitError(f"{path} does not exist: give a folder evalkit wrote ({'; '.join(WRITTEN.values())})")
        found = [name for name in WRITTEN if (folder / name).is_file()]
        if not found:
            raise EvalkitError(
                f"{folder} holds nothing evalkit writes (no "
                + ", ".join(f"{name} from {what}" for name, what in WRITTEN.items())
                + "): give such a folder"
            )
        for name, group in zip(WRITTEN, (stores, conformance, capacity)):
            if name in found and folder not in group:
                group.append(folder)
    results = load_stores(stores) if stores else None
    for folder in capacity:
        results = add_serving_rows(results, folder)
    return results, conformance


def _conformance_only(folders, args) -> int:
    """``report`` of conformance folders alone: what ``conformance --from DIR`` prints, md or csv."""
    from evalkit.engines.vllm.conformance_report import FORMATS, load_report

    if args.format == "latex":
        raise EvalkitError("a conformance folder prints as md or csv, not latex: use --format md or --format csv")
    if args.plots or args.sensitivity:
        raise EvalkitError(
            "--plots and --sensitivity need a results store; a conformance folder has no figures: drop them"
        )
    text = "".join(FORMATS[args.format](load_report(folder)) for folder in folders)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"conformance written to {args.out}")
    else:
        sys.stdout.write(text)
    return 0


def _absent_columns(frame, columns: tuple[str, ...], folder) -> list[str]:
    """A line for each asked-for column group the store has no numbers for (older runs did not record them)."""
    from evalkit.report.tables import COLUMN_GROUPS

    return [
        f"--columns {group}: no run of this store recorded {', '.join(COLUMN_GROUPS[group])} (runs of an older evalkit); "
        f"resume the sweep with the current code (`python -m evalkit sweep GRID --out {folder}`) to compute them"
        for group in columns
        if not any(c in frame for c in COLUMN_GROUPS[group])
    ]
