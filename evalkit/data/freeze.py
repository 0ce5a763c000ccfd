"""Make the frozen texts of :mod:`evalkit.data.frozen` from the running interpreter (a maintainer's tool).

    python -m evalkit.data.freeze            # this interpreter's texts against the frozen ones
    python -m evalkit.data.freeze --write    # rewrite evalkit/data/texts/*.json (CPython 3.11.7 only)

The only module of evalkit that reads Python's own ``pydoc_data.topics`` and standard-library
docstrings; evaluations and calibration read the frozen files. It records how the files were made
(the recipe of the ``stdlib-docs`` calibration text is :func:`stdlib_docs_entries`), and the check
mode shows that another interpreter's texts differ (their SHA-256 next to the frozen one). Writing
is refused on any interpreter but the one the files name (``frozen.SOURCE``): changing the texts
changes every number, so it is a deliberate edit of ``SOURCE`` and the pinned hashes, not a side
effect of running on another Python. The JSON is ASCII (non-ASCII characters escaped), one entry
per line, so line-ending conversions cannot change the texts.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import platform
import sys
import warnings

from evalkit.data import frozen
from evalkit.data.corpus import ngrams
from evalkit.errors import EvalkitError

STDLIB_DOC_MODULES = (
    "argparse",
    "logging",
    "subprocess",
    "json",
    "email.message",
    "http.client",
    "unittest.case",
    "collections",
    "functools",
    "itertools",
    "pathlib",
    "typing",
    "dataclasses",
    "enum",
    "asyncio.tasks",
    "threading",
    "socket",
    "zipfile",
    "tarfile",
    "csv",
    "datetime",
    "decimal",
    "fractions",
    "statistics",
    "random",
    "textwrap",
    "string",
    "shutil",
    "tempfile",
    "contextlib",
    "abc",
    "inspect",
    "pickle",
    "sqlite3",
    "xml.etree.ElementTree",
    "urllib.parse",
    "configparser",
    "heapq",
    "bisect",
    "difflib",
    "doctest",
    "pdb",
    "pprint",
    "queue",
    "sched",
    "secrets",
    "shlex",
    "smtplib",
    "tokenize",
    "trace",
    "uuid",
    "wave",
    "weakref",
    "zipimport",
)


def live_topics() -> dict[str, str]:
    """The running interpreter's ``pydoc_data.topics.topics`` (differs by Python version)."""
    from pydoc_data.topics import topics

    return dict(topics)


def stdlib_docs_entries(embedded: str) -> list[dict[str, str]]:
    """``{"object", "doc"}`` per docstring of STDLIB_DOC_MODULES and their public classes and functions
    (defined in the module itself), first occurrence only, minus any sharing a 13-word sequence with
    ``embedded`` (the evaluation text), in module order then member name order."""
    eval_grams = ngrams(embedded)
    entries, seen = [], set()
    with warnings.catch_warnings():  # deprecated aliases (typing.io) warn when touched
        warnings.simplefilter("ignore")
        for name in STDLIB_DOC_MODULES:
            try:
                mod = importlib.import_module(name)
                members = [(n, getattr(mod, n)) for n in sorted(dir(mod)) if not n.startswith("_")]
            except ImportError:  # e.g. a Python built without sqlite3
                continue
            for member, obj in [("", mod), *members]:
                if obj is not mod and (inspect.ismodule(obj) or getattr(obj, "__module__", None) != mod.__name__):
                    continue
                if not (inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isfunction(obj)):
                    continue
                doc = inspect.getdoc(obj)
                if doc and doc not in seen and not (ngrams(doc) & eval_grams):
                    seen.add(doc)
                    entries.append({"object": f"{name}.{member}" if member else name, "doc": doc})
    return entries


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _dump(payload: dict) -> str:
    """JSON with one top-level entry per line (readable diffs), ASCII only."""
    return json.dumps(payload, indent=1, ensure_ascii=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evalkit.data.freeze", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite the frozen files (only on {frozen.SOURCE})")
    args = parser.parse_args(argv)
    here = f"{platform.python_implementation()} {platform.python_version()}"
    topics = live_topics()
    embedded = "\n\n".join(topics.values())
    entries = stdlib_docs_entries(embedded)
    docs = "\n\n".join(e["doc"] for e in entries)
    for name, text, pinned in (
        ("embedded corpus", embedded, frozen.EMBEDDED_SHA256),
        ("stdlib-docs", docs, frozen.STDLIB_DOCS_SHA256),
    ):
        same = "equal to" if _sha(text) == pinned else "DIFFERENT from"
        print(f"{here} {name}: {len(text):,} characters, SHA-256 {_sha(text)} ({same} the frozen {frozen.SOURCE} text)")
    if not args.write:
        return 0
    if here != frozen.SOURCE:
        raise EvalkitError(
            f"--write re-makes the frozen texts from {frozen.SOURCE} only, and this is {here}: run it under "
            f"{frozen.SOURCE} (new texts change every number: edit frozen.SOURCE and the pinned hashes on purpose)"
        )
    frozen.FOLDER.mkdir(parents=True, exist_ok=True)
    frozen.TOPICS_FILE.write_text(_dump({"source": frozen.SOURCE, "topics": topics}), encoding="ascii")
    frozen.STDLIB_DOCS_FILE.write_text(_dump({"source": frozen.SOURCE, "docs": entries}), encoding="ascii")
    print(f"wrote {frozen.TOPICS_FILE} and {frozen.STDLIB_DOCS_FILE}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except EvalkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
