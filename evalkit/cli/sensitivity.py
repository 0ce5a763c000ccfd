"""`evalkit sensitivity`: rank layers by what quantizing them costs, and say which to keep in BF16.

    python -m evalkit sensitivity --model embedded --scheme fp8_e4m3/tensor/dynamic \\
        --perplexity-window 256 --perplexity-max-windows 8 --target-kl 0.002 --context 8192 --out results/sens

The quality measure is the perplexity eval (same options: --perplexity-corpus, --perplexity-window,
... every ``--perplexity-<parameter>`` of ``evalkit run``). Prints the ranking and
the recommendation; with ``--out DIR`` writes sensitivity.csv, rows.jsonl (``labels.layer``),
recommendation.json and sensitivity.png. Before the layer sweep it prints what the sweep will
take (estimated from the first, all-layers evaluation), progress bars follow it, and the
recommendation carries a WARNING when its sample is too small to support the set it keeps
(:func:`evalkit.planning.sensitivity.sample_warnings`). A bad ``--perplexity-corpus`` is refused before the
model loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from evalkit.cli import COMMANDS
from evalkit.cli.common import add_model_arguments, load_from_args
from evalkit.cli.scales_flags import add_scales_arguments, with_declared
from evalkit.errors import EvalkitError


def add_parser(sub):
    p = sub.add_parser("sensitivity", help=COMMANDS["sensitivity"])
    add_model_arguments(p)
    p.add_argument(
        "--scheme", required=True, help="the quantized scheme to study (without +skip=), e.g. fp8_e4m3/tensor/dynamic"
    )
    add_scales_arguments(p)  # a static scheme's bare scale table: what it was made for
    p.add_argument("--layers", default=None, help="only these layers, e.g. 0,1,29 (default: all)")
    p.add_argument(
        "--target-kl",
        dest="target_kl",
        type=float,
        default=None,
        help="mean KL (nats/token) the kept-BF16 set must reach",
    )
    p.add_argument(
        "--target-kl-fraction",
        dest="target_kl_fraction",
        type=float,
        default=None,
        help="target KL as a fraction of the all-layers KL, e.g. 0.5 to halve it",
    )
    p.add_argument("--max-keep", dest="max_keep", type=int, default=None, help="keep at most this many layers in BF16")
    p.add_argument(
        "--target-ppl-rel",
        dest="target_ppl_rel",
        type=float,
        default=None,
        help="relative perplexity change to reach, e.g. 0.001",
    )
    p.add_argument("--context", type=int, default=8192, help="sequence length for the memory cost (default 8192)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for sensitivity.csv, rows.jsonl, recommendation.json, sensitivity.png",
    )
    p.add_argument("--cache-dir", type=Path, default=None, help="where tokenized data and the baseline are cached")
    from evalkit.evals.perplexity.evaluation import PerplexityEval

    PerplexityEval.add_arguments(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from evalkit.evals.perplexity.evaluation import PerplexityEval
    from evalkit.integration.binding import BoundScheme
    from evalkit.planning.sensitivity import check_scheme, layer_table, metric_rows, perplexity_measure, plot, recommend

    scheme = with_declared([check_scheme(args.scheme)], args)[0]  # --scales-model/--scales-format on a static one
    layers = None
    if args.layers:
        try:
            layers = [int(x) for x in args.layers.split(",")]
        except ValueError:
            raise EvalkitError(f"--layers {args.layers!r}: give layer indices like 0,1,29") from None
    if args.target_kl is not None and args.target_kl < 0:
        raise EvalkitError(f"--target-kl must be >= 0, got {args.target_kl}")
    if args.target_kl_fraction is not None and not 0 <= args.target_kl_fraction <= 1:
        raise EvalkitError(f"--target-kl-fraction must be in [0, 1], got {args.target_kl_fraction}")
    if args.target_kl is not None and args.target_kl_fraction is not None:
        raise EvalkitError("give --target-kl or --target-kl-fraction, not both")
    if args.context <= 0:
        raise EvalkitError(f"--context must be positive, got {args.context}")
    if args.out and (args.out / "sensitivity.csv").exists():
        raise EvalkitError(f"{args.out} already holds a sensitivity result: choose another --out")
    params = PerplexityEval.params_from_args(args)
    PerplexityEval(params)  # validate before loading the model
    from evalkit.data.corpus_check import check_corpus_params

    check_corpus_params(params, "sensitivity")  # a bad --corpus: one line, not after the model load
    from evalkit.models.loading import cache_root
    from evalkit.sweep.preflight import check_model_device, check_writable

    check_writable(args.out, "--out")
    check_writable(args.cache_dir or cache_root() / "work", "--cache-dir")
    check_model_device(args)
    lm = load_from_args(args)
    BoundScheme(scheme, lm.layout, lm.config_hash)  # static scales: validate the table now
    measure = perplexity_measure(lm, params, args.cache_dir)
    table, full = layer_table(lm, scheme, measure, layers, progress=True)
    shown = table[[c for c in table.columns if not c.endswith(("_lo", "_hi"))]]
    print(
        f"all layers quantized: KL {full['kl_mean'][0]:.4g} nats/token, perplexity change {full['ppl_delta_rel'][0]:+.3%}"
    )
    print(shown.to_markdown(index=False, floatfmt=".4g"))
    rec = None
    target_kl = args.target_kl
    if args.target_kl_fraction is not None:
        target_kl = args.target_kl_fraction * full["kl_mean"][0]
    if target_kl is not None or args.target_ppl_rel is not None:
        rec = recommend(
            lm,
            scheme,
            measure,
            table,
            full,
            target_kl=target_kl,
            target_ppl_rel=args.target_ppl_rel,
            context=args.context,
            max_keep=args.max_keep,
            progress=True,
        )
        print()
        print(rec.summary())
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out / "sensitivity.csv", index=False)
        with open(args.out / "rows.jsonl", "w") as fh:
            for row in metric_rows(table):
                fh.write(
                    json.dumps({**row, "model": lm.name, "scheme": str(scheme), "eval": "sensitivity"}, sort_keys=True)
                    + "\n"
                )
        if rec is not None:
            (args.out / "recommendation.json").write_text(
                json.dumps(dataclasses.asdict(rec), indent=1, default=str) + "\n"
            )
        plot(table, args.out / "sensitivity.png", title=f"{lm.name}: {scheme}")
        print(f"\nwritten to {args.out}")
    return 0
