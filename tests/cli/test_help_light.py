"""`--help` of the commands a user reads first imports none of the heavy libraries: building ``run``'s parser
takes each evaluation's flags from its folder's ``params.py`` (:func:`evalkit.evals.registry.flag_declarations`),
not from the evaluation classes, whose modules import torch, scipy and pandas. A structural check, in a fresh
interpreter as a user starts one: what ``sys.modules`` holds once the help is printed, never a wall-clock time
(``benchmarks/bench_startup.py`` times it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "scipy", "pandas", "transformers")

PROBE = """
import contextlib, io, json, sys
from evalkit.cli import main

out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print(json.dumps({"help": out.getvalue(), "heavy": [m for m in HEAVY if m in sys.modules]}))
""".replace("HEAVY", repr(HEAVY))


def help_of(*argv: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "EVALKIT_EVALS"}  # the evaluations a user has
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("command", ["run", "sweep", "report", "capacity", "schemes"])
def test_help_imports_no_heavy_library(command):
    probe = help_of(command, "--help")
    assert probe["help"].startswith("usage: python -m evalkit " + command), probe["help"][:200]
    assert probe["heavy"] == [], f"`{command} --help` imported {probe['heavy']}"


def test_run_help_lists_every_evaluation_and_its_flags_without_importing_them():
    probe = help_of("run", "--help")
    assert probe["heavy"] == []
    text = " ".join(probe["help"].split())
    for name, flag in {
        "perplexity": "--perplexity-window",
        "retrieval": "--retrieval-depths",
        "lmeval": "--lmeval-tasks",
        "longcontext": "--longcontext-limits",
        "decode": "--decode-tokens",
        "generation": "--generation-tasks",
        "serving": "--serving-budget-gib",
    }.items():
        assert f"{name} (--eval {name})" in text and flag in text, name
