"""`evalkit run`: one evaluation, several schemes, one model, a table on stdout.

    python -m evalkit run --model M --schemes auto,fp8_e4m3/head/dynamic --eval perplexity ...

`run` is a one-model, one-eval grid: this module turns the flags into the grid's description once (the keys
and values a grid file holds, ``--schemes`` as written: the grid path parses it, once) and prints the rows;
:func:`evalkit.sweep.one_model.run_one` makes the grid by the sweep's own grid path
(:func:`evalkit.sweep.grid.grid_from_data`), checks it with the sweep's pre-flight checks and hands it to the
sweep's runner (:func:`evalkit.sweep.runner.run_sweep`, with ``run``'s one-model executor, which alone loads
the model and prepares the evaluation), which writes the store. With ``--engine`` it loads no weights at all: the engine loads its own,
and evalkit reads the model's config and tokenizer (:mod:`evalkit.models.handle`).
The baseline (auto) is always evaluated first, whether listed or not. Without ``--schemes`` it runs
:data:`DEFAULT_SCHEMES`: the baseline and ``fp8_e4m3/tensor/unit`` (vLLM's ``kv_cache_dtype=fp8`` with
no scales), a scheme engines run rather than a hypothetical one. With ``--out DIR`` the
rows also go to a results store, the one ``evalkit sweep`` writes (DIR/results.jsonl through
:class:`evalkit.sweep.store.ResultStore`: a run per scheme, the same run ids and completion records,
artifacts under DIR/runs/<id16>/), so ``evalkit report DIR`` reads it; running the same command
again adds a new attempt of each run, a folder holding other runs is refused. ``--json`` prints the
rows as JSON instead of the table. The evaluation's options are its own ``--<eval>-<field>`` flags
(``python -m evalkit run --help``). Before the model loads, every problem is listed, one line each (exit 2),
as a sweep lists them: first the grid's (a scheme that does not parse or that the engine profile or the
engine's plan refuses, a bad option or parameter, a corpus file that cannot load), then, for a grid without
any, the pre-flight checks' (:mod:`evalkit.sweep.preflight`): scale files, the model's architecture (read from
its config), whether the engine can start here and can run the evaluation. The table is
:mod:`evalkit.sweep.run_table`'s.
``--engine-profile NAME`` (:mod:`evalkit.engines.profiles`) runs
each scheme as that engine's KV kernels do (e.g. ``vllm-cpu``: rounding toward zero). ``--engine vllm`` has
vLLM itself compute the log-probs (:mod:`evalkit.engines.vllm.backend`): the schemes map through the
vllm-cpu profile, the baseline is vLLM's unquantized run, and the KL row is the top-k lower bound.
Every eval runs through it (perplexity, decode, retrieval, and lm-eval, generation and longcontext via
lm-eval's own vllm model); each row's ``info["backend"]`` names who produced it. An engine that declares a
``noise_floor`` option (vLLM) gets its noise floor run beside the schemes, as a grid does
(:func:`evalkit.sweep.grid.noise_floor_runs`): ``auto`` against a second realisation of ``auto`` (the next seed,
other batch compositions), printed as ``auto (noise floor)``, stored with ``info["noise_floor"]``, and read by
the report's decision rule (:mod:`evalkit.report.noise_floor`). A run estimated at over 10 min on this machine
(:mod:`evalkit.sweep.run_size`, ``sweep --dry-run``'s estimator, a step of the runner) says so on stderr before
its first evaluation, with the flags of the sizes a CPU runs in minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evalkit.cli import COMMANDS
from evalkit.cli.common import add_model_arguments, model_spec
from evalkit.cli.scales_flags import add_scales_arguments, declared
from evalkit.errors import EvalkitError
from evalkit.evals.registry import flag_declarations

# --schemes left out: the baseline and FP8 E4M3 with unit scales, what vLLM's kv_cache_dtype=fp8 stores when a
# checkpoint has no scales (vllm-cuda, sglang, tensorrt-llm run it; evalkit.report.engine_fit), not a
# hypothetical scheme no engine runs
DEFAULT_SCHEMES = ("auto", "fp8_e4m3/tensor/unit")


def add_parser(sub):
    flags = flag_declarations()  # the evaluations' flags without importing their classes (no torch)
    _add(sub, list(flags), flags)


def light_parser(sub) -> tuple[str, ...] | None:
    """``run``'s own options without the evaluations' (a plugin that declares no light flags is imported for
    them, and may import torch): argparse's errors on them come in a fraction of a second
    (:func:`evalkit.cli.light_check`). Returns the prefixes of the
    flags left to the full parser (``--<eval>-``, ``--no-<eval>-``), or None when evaluations are
    registered through EVALKIT_EVALS (their names are known only once imported)."""
    import os

    from evalkit.evals.base import ENTRY_POINTS, PLUGINS_ENV, _builtin

    if os.environ.get(PLUGINS_ENV, "").strip():
        return None
    from importlib.metadata import entry_points

    names = list(_builtin())
    try:
        names += [ep.name for ep in entry_points(group=ENTRY_POINTS) if ep.name not in names]
    except Exception:  # noqa: BLE001  (broken metadata: the full parser decides)
        return None
    _add(sub, names)
    return tuple(f"--{pre}{name}-" for name in names for pre in ("", "no-"))


def _add(sub, names: list[str], flags: dict[str, type] | None = None):
    p = sub.add_parser("run", help=COMMANDS["run"])
    add_model_arguments(p)
    p.add_argument(
        "--schemes",
        default=",".join(DEFAULT_SCHEMES),
        help="comma-separated scheme strings (see `evalkit schemes`); default: %(default)s, the baseline and what "
        "vLLM's kv_cache_dtype=fp8 stores without scales (schemes engines run, not hypothetical ones)",
    )
    p.add_argument("--eval", dest="eval_name", default="perplexity", choices=names)
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results store folder (results.jsonl, as `evalkit sweep --out` writes; `evalkit report DIR` reads it) "
        "with each run's artifacts under DIR/runs/",
    )
    p.add_argument("--json", action="store_true", help="print rows as JSON instead of a table")
    p.add_argument("--cache-dir", type=Path, default=None, help="where tokenized data and baselines are cached")
    p.add_argument(
        "--engine",
        default="emulation",
        help="who computes the numbers: evalkit's emulation (default) or a real engine itself (vllm: schemes map "
        "through the vllm-cpu profile on --device cpu, vllm-cuda on --device cuda; llamacpp: llamacpp:<type> "
        "schemes; evalkit.engines.registry)",
    )
    p.add_argument(
        "--engine-option",
        dest="engine_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an engine's scale-out option, in the run id (vllm: tensor_parallel_size=2, "
        "distributed_executor_backend=ray, ...; llamacpp: n_threads=4, n_ctx=4096); repeat for more",
    )
    p.add_argument(
        "--engine-profile",
        dest="engine_profile",
        default=None,
        metavar="NAME",
        help="run the schemes as this engine's KV kernels do, refusing what it cannot run "
        "(vllm-cpu, vllm-cuda, vllm-rocm, sglang, tensorrt-llm)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    add_scales_arguments(p)
    for eval_flags in (flags or {}).values():
        eval_flags.add_arguments(p)
    # each evaluation's flags: destination -> parameter, so the flags become a grid's evals: entry as they are
    p.set_defaults(handler=run, eval_flag_dests={name: f.flag_dests() for name, f in (flags or {}).items()})


def run(args: argparse.Namespace) -> int:
    """Turn the flags into a one-model, one-eval grid description (:func:`run_description`: what a grid file
    would hold) and hand it to :func:`evalkit.sweep.one_model.run_one`, which makes the grid by the sweep's
    grid path (the scheme strings parsed there, once), checks everything that can be checked before a model
    loads (one line each, exit 2) and runs it with the sweep's runner; print the rows it returns."""
    if getattr(args, "no_progress", False):
        import os

        os.environ["EVALKIT_PROGRESS"] = "0"  # the evaluations' and the engine's bars
    scales = declared(args)  # --scales-model/--scales-format: on every static scheme
    data = run_description(args)
    from evalkit.sweep.one_model import run_one

    ran = run_one(data, out=args.out, cache_dir=args.cache_dir, scales=scales)
    if ran is None:
        return 2  # the pre-flight report is on stderr
    if args.json:  # the rows, or a table of the evaluation's summary metrics
        json.dump(ran.rows(), sys.stdout, indent=1)
        print()
    else:
        print(ran.table())
        if args.out:
            print(f"\nresults store: {args.out / 'results.jsonl'} (see: python -m evalkit report {args.out})")
    for log in ran.logs:
        print(f"{log.stem}'s messages are in {log}", file=sys.stderr)
    return 0


def run_description(args: argparse.Namespace) -> dict:
    """``run``'s flags as a grid description, the keys and values a grid file holds: one model, the baseline
    (``auto``, first) and ``--schemes`` as written (the grid path parses them), one evaluation with the
    ``--<eval>-*`` flags given (None: the parameter's default), the engine, its options as given and the
    engine profile. One line (EvalkitError) for a flag that says nothing or cannot be read."""
    from dataclasses import asdict

    if not args.schemes.replace(",", "").strip():  # an empty list would run the baseline alone and look like a result
        raise EvalkitError(
            f"--schemes {args.schemes!r} names no scheme: give at least one, e.g. --schemes fp8_e4m3/tensor/dynamic "
            "(the auto baseline is always added; `python -m evalkit schemes` lists them)"
        )
    given = engine_options_given(args)
    dests = args.eval_flag_dests[args.eval_name]  # set by the parser with the evaluation's flags
    data = {
        "name": f"run-{args.eval_name}",
        "models": [asdict(model_spec(args))],
        "schemes": ["auto", args.schemes],  # the baseline first; the grid lists each scheme once
        "evals": {args.eval_name: {name: getattr(args, dest, None) for dest, name in dests.items()}},
        "engine": args.engine,
    }
    if given:
        data["engine_options"] = {args.engine: given}
    if getattr(args, "engine_profile", None):
        data["engine_profile"] = args.engine_profile
    return data


def engine_options_given(args: argparse.Namespace) -> dict:
    """``--engine-option KEY=VALUE`` flags as written (values read as JSON where they are; the engine types
    and checks them, :func:`evalkit.sweep.one_model.run_one`); one line for a flag that is not KEY=VALUE, or
    for options without an engine."""
    given = {}
    for text in getattr(args, "engine_options", None) or []:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise EvalkitError(
                f"--engine-option {text!r}: write KEY=VALUE, e.g. --engine-option tensor_parallel_size=2"
            )
        try:
            given[key] = json.loads(value)
        except ValueError:
            given[key] = value
    if args.engine == "emulation" and given:
        raise EvalkitError("--engine-option sets a real engine's options: add --engine NAME, or drop it")
    return given
