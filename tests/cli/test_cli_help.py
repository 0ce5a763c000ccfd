"""What the command line's --help says holds: every docs page and section it cites exists, no flag's
metavar repeats a word (``--decode-tokens DECODE_DECODE``), and ``run``'s default schemes are ones an
engine runs, as its help and docs/commands.md say."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from evalkit.cli import COMMANDS, build_parser

from tests.report.test_docs import anchors

ROOT = Path(__file__).resolve().parents[2]
DOCS_PATH = re.compile(r"docs/[\w./-]+?\.md(?:#[\w-]+)?")
BARE_DOCS = re.compile(r"(?<![\w/-])docs(?![\w/-])")  # "see the docs' 'Some section'": a citation without a path


def parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """The top-level parser and every command's, with their names."""
    top = build_parser()
    out = [("evalkit", top)]
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            out += [(f"evalkit {name}", sub) for name, sub in action.choices.items()]
    return out


def help_texts(parser: argparse.ArgumentParser) -> list[str]:
    """The raw strings --help shows (unwrapped: argparse wraps at hyphens, which would cut a path):
    description, epilog, group titles and descriptions, each option's help."""
    texts = [parser.description, parser.epilog]
    texts += [t for g in parser._action_groups for t in (g.title, g.description)]
    texts += [a.help for a in parser._actions if isinstance(a.help, str)]
    return [t for t in texts if t]


PARSERS = parsers()


def test_every_command_has_its_parser():
    assert {name for name, _ in PARSERS} == {"evalkit", *(f"evalkit {c}" for c in COMMANDS)}


def test_every_docs_page_and_section_cited_in_help_exists():
    cited, broken = [], []
    for name, parser in PARSERS:
        for text in help_texts(parser):
            for ref in DOCS_PATH.findall(text):
                cited.append(ref)
                path, _, anchor = ref.partition("#")
                page = ROOT / path
                if not page.is_file():
                    broken.append(f"{name}: {ref}: no file {path}")
                elif anchor and anchor not in anchors(page):
                    broken.append(f"{name}: {ref}: no heading #{anchor} in {path}")
            if BARE_DOCS.search(DOCS_PATH.sub("", text)):
                broken.append(f"{name}: cites the docs without a docs/<page>.md#<section> path: {text!r}")
    assert not broken, "\n".join(broken)
    assert "docs/report.md#the-quality-budget" in cited  # the check sees report's budget group


def displayed_metavars(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0:
            continue
        metavar = action.metavar if action.metavar is not None else action.dest.upper()
        yield action.option_strings[-1], metavar


@pytest.mark.parametrize("name, parser", PARSERS, ids=[n for n, _ in PARSERS])
def test_no_metavar_repeats_a_word(name, parser):
    doubled = []
    for flag, metavar in displayed_metavars(parser):
        for mv in metavar if isinstance(metavar, tuple) else (metavar,):
            words = [w for w in re.split(r"[_\W]+", mv) if w]
            if len(words) != len(set(words)):
                doubled.append(f"{flag} {mv}")
    assert not doubled, f"{name}: {doubled}"
    assert re.search(r"\b(\w+)_\1\b", parser.format_help()) is None  # as --help prints it


def test_decode_tokens_metavar_is_named_for_its_flag():
    run = dict(PARSERS)["evalkit run"]
    assert "--decode-tokens DECODE_TOKENS" in run.format_help()


def test_run_defaults_to_schemes_an_engine_runs():
    from evalkit.cli.run import DEFAULT_SCHEMES
    from evalkit.kv.scheme import parse_scheme
    from evalkit.report.engine_fit import HYPOTHETICAL, runs_on

    run = dict(PARSERS)["evalkit run"]
    action = next(a for a in run._actions if "--schemes" in a.option_strings)
    assert action.default == ",".join(DEFAULT_SCHEMES)
    assert f"default: {','.join(DEFAULT_SCHEMES)}" in " ".join(run.format_help().split())  # the help says it
    assert f"Without `--schemes`, `run` evaluates `{','.join(DEFAULT_SCHEMES)}`" in " ".join(
        (ROOT / "docs" / "commands.md").read_text().split()
    )  # and so do the docs
    quantized = [s for s in DEFAULT_SCHEMES if not parse_scheme(s).is_identity]
    assert quantized and parse_scheme(DEFAULT_SCHEMES[0]).is_identity
    for text in quantized:
        cell = runs_on(text)
        assert cell != HYPOTHETICAL and "vllm-cuda" in cell, (text, cell)
