"""The command line: `python -m evalkit COMMAND ...`.

Each command lives in its own module under ``evalkit.cli`` with ``add_parser(subparsers)``
registering its options and a handler. Only the chosen command's module is imported; the others
appear in ``--help`` by the one-line help in :data:`COMMANDS`, so ``--help``, ``schemes``,
``models`` and ``capacity`` start in a fraction of a second instead of loading torch,
transformers and lm-eval (``benchmarks/bench_startup.py`` measures it). ``run``'s parser takes the
evaluations' flags from their light declarations (:func:`evalkit.evals.registry.flag_declarations`), so
``run --help`` imports no torch either; where an installed plugin declares none, its module is imported
for them, and ``run`` is parsed first without them (:func:`light_check`), so a mistyped option is
refused before torch is imported. User errors
(:class:`EvalkitError`) print one line to stderr and exit with code 2; nothing else is caught, so
real bugs keep their traceback. Commands check the machine first (:mod:`evalkit.sweep.preflight`: the
folders they will write, the ``--device`` they will use) so that such a problem is one of these lines,
before any model loads and with nothing written.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from evalkit.errors import EvalkitError

# command -> its one-line help, written only here: `--help` shows it without importing the command,
# and each module's add_parser passes help=COMMANDS[name]
COMMANDS = {
    "schemes": "list KV formats, granularities, scale sources and dtypes, and named schemes",
    "models": "list the embedded offline models, where their files are, and evalkit's cache",
    "run": "run one evaluation for several KV schemes on one model",
    "sweep": "run a grid of models x schemes x evals into a results folder",
    "merge": "combine the results folders of sweep shards",
    "calibrate": "static K/V scales from calibration text, or imported from a vLLM checkpoint",
    "sensitivity": "per-layer KV quantization sensitivity and which layers to keep in BF16",
    "capacity": "KV tokens and concurrent sequences that fit, per KV scheme",
    "report": "tables, plots and a recommendation from a results folder",
    "conformance": "evalkit's KV codes held against a real engine's own KV store (vLLM on CPU)",
    "doctor": "check this environment (embedded model, vLLM and its companions) and print each fix",
}
MODEL_COMMANDS = ("run", "calibrate", "sensitivity")  # they take --model (evalkit.cli.common)

# What Ctrl-C leaves behind, said in the one line it prints. A sweep writes a run's completion record
# last and skips completed runs, so the same command resumes; the other commands start over, reusing
# what they cache once it is complete (tokenized corpora, baselines: published into place whole).
RESUME = {
    "sweep": "run the same command again to resume (completed runs are kept and skipped; the interrupted run starts over)"
}
RESUME_OTHER = "run the same command again to start over (cached tokenization and baselines are reused)"


# Packages only some evaluations use (the core, the storage path and gpu_check never import them):
# a command that reaches one that is missing says which and how to install it.
OPTIONAL_PACKAGES = {
    "lm_eval": ("lm-eval", 'pip install "lm-eval[hf]>=0.4.9,<0.5"'),
    "datasets": ("datasets", 'pip install "datasets>=3.0"'),
    "gguf": ("gguf (to read the embedded model's GGUF file)", 'pip install "gguf>=0.10"'),
    "ray": ("ray", 'pip install "ray>=2.9" (or pip install -e ".[ray]")'),
    "tabulate": ("tabulate (to print tables)", 'pip install "tabulate>=0.9"'),
}


def _missing_optional(exc: BaseException | None):
    """(package, install line) when ``exc`` (or what caused it: pandas wraps a missing tabulate)
    is a missing optional package; else None."""
    while exc is not None:
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            return OPTIONAL_PACKAGES.get(exc.name.split(".")[0])
        exc = exc.__cause__ or exc.__context__
    return None


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own usage errors: one line, exit 2
        self.exit(2, f"evalkit: error: {message} (see --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command's options, or (``command`` given) with only that command's:
    the others are listed by name and help without importing their modules."""
    parser = _Parser(
        prog="python -m evalkit", description="Quality cost of FP8/INT KV caches, against the memory saved."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, text in COMMANDS.items():
        if command is None or name == command:
            importlib.import_module(f"evalkit.cli.{name}").add_parser(sub)
        else:
            sub.add_parser(name, help=text)
    return parser


_NUMBER = re.compile(r"^-\d|^-\.\d")


def light_check(command: str, argv: list[str]) -> None:
    """argparse's errors before the command's heavy imports: a command module with ``light_parser(sub)``
    (``run``: its options without the evaluations', whose modules import torch) is parsed with that
    first; an unknown flag outside the prefixes it leaves to the full parser exits 2 at once."""
    if not command or {"-h", "--help"} & set(argv):
        return
    module = importlib.import_module(f"evalkit.cli.{command}")
    light = getattr(module, "light_parser", None)
    if light is None:
        return
    parser = _Parser(prog="python -m evalkit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    later = light(sub)
    if later is None:
        return
    _, rest = parser.parse_known_args(argv)  # errors on the command's own options: one line, exit 2
    stray = [a for a in rest if a.startswith("-") and not _NUMBER.match(a) and not a.startswith(later)]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")


def _chosen(argv: list[str]) -> str:
    """The command named on the command line ('' for none: `--help` alone imports no command)."""
    first = next((a for a in argv if not a.startswith("-")), "")
    return first if first in COMMANDS else ""


def main(argv: list[str] | None = None) -> int:
    from evalkit.runtime import numerics

    numerics.configure()  # before the first matrix product: batch-invariant, reproducible BLAS (evalkit.runtime.numerics)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["sweep"]  # the main job: the default sweep on the embedded model
    command = _chosen(argv)
    try:
        if command in MODEL_COMMANDS and not {"-h", "--help"} & set(argv):
            from evalkit.cli.common import check_model_first

            check_model_first(argv)  # a bad --model fails before the command's heavy imports
        light_check(command, argv)  # argparse's errors in a fraction of a second, before torch is imported
        parser = build_parser(command)
        args = parser.parse_args(argv)
        if not getattr(args, "handler", None):
            parser.print_help()
            return 2
        return int(args.handler(args) or 0)
    except EvalkitError as exc:
        print(f"evalkit: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except ImportError as exc:
        needed = _missing_optional(exc)
        if needed is None:
            raise
        print(f"evalkit: error: this command needs {needed[0]}, which is not installed: {needed[1]}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"evalkit: interrupted: {RESUME.get(command, RESUME_OTHER)}", file=sys.stderr)
        return 130
