"""The command line: `python -m evalkit COMMAND ...`.

Each command lives in its own module under ``evalkit.cli`` with ``add_parser(subparsers)``
registering its options and a handler. User errors (:class:`EvalkitError`) print one line to
stderr and exit with code 2; nothing else is caught, so real bugs keep their traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from evalkit.errors import EvalkitError

COMMANDS = ["schemes", "models", "run", "sweep", "merge", "calibrate", "sensitivity", "capacity", "report"]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own usage errors: one line, exit 2
        self.exit(2, f"evalkit: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m evalkit", description="Quality cost of FP8/INT KV caches, against the memory saved.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        importlib.import_module(f"evalkit.cli.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["sweep"]  # the main job: the default sweep on the embedded model
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except EvalkitError as exc:
        print(f"evalkit: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("evalkit: interrupted", file=sys.stderr)
        return 130
