"""`evalkit merge OUT SHARD_DIRS...`: combine the results folders of a sharded sweep into one.

Every counted run of every shard (its rows and completion record, same attempt id, plus its
artifacts) is appended to OUT once; runs that only failed are carried over as failures. All
folders must belong to the same grid; OUT may be new, or an earlier merge of that grid.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from evalkit.cli import COMMANDS


def add_parser(sub):
    p = sub.add_parser("merge", help=COMMANDS["merge"])
    p.add_argument("out", type=Path, help="the merged results folder")
    p.add_argument("shards", type=Path, nargs="+", help="results folders written by `evalkit sweep --shard I/N`")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from evalkit.sweep.preflight import check_writable
    from evalkit.sweep.store import ResultStore, merge_stores

    check_writable(args.out, "OUT", fix="give as OUT a folder you can write")
    counts = merge_stores(args.out, args.shards)
    view = ResultStore(args.out).read()
    print(
        f"merged {counts['shards']} folders: {counts['merged']} runs added, {counts['already_present']} already present, "
        f"{counts['failed']} failures carried over; {len(view.complete)} runs complete in {args.out / 'results.jsonl'}"
    )
    return 1 if view.failed else 0
