"""The one-folder rule: an evaluation defined entirely inside the tests (:mod:`tests.evals.plugin_eval`),
loaded through ``EVALKIT_EVALS``, appears in ``evalkit run`` (its own flags), a sweep grid,
``sweep --dry-run`` (a nonzero workload from its own ``workload``) and ``report`` (its declared
column and plot), and ``run --out`` writes the results store ``report`` reads. No package file
names it; every command runs in a fresh interpreter, as a user would run it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = {"EVALKIT_EVALS": "tests.evals.plugin_eval", "EVALKIT_PROGRESS": "0"}
SCHEMES = "auto,fp8_e5m2/tensor/unit"


def evalkit(*args, plugin: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "EVALKIT_EVALS"}
    env.update(PLUGIN if plugin else {"EVALKIT_PROGRESS": "0"})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "evalkit", *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True
    )


def metric_rows(folder: Path) -> list[dict]:
    return [
        r for r in (json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines()) if r["type"] == "metric"
    ]


def test_the_plugin_brings_its_flags_and_nothing_else_knows_it():
    with_plugin, without = evalkit("run", "--help"), evalkit("run", "--help", plugin=False)
    assert with_plugin.returncode == 0 and without.returncode == 0, with_plugin.stderr
    assert "--echo-max-tokens" in with_plugin.stdout and "echo (--eval echo)" in with_plugin.stdout
    assert "--echo-max-tokens" not in without.stdout and "echo" not in without.stdout
    # and every built-in eval's flags carry its name
    for flag in (
        "--perplexity-corpus",
        "--perplexity-batch-size",
        "--perplexity-seed",
        "--retrieval-corpus",
        "--retrieval-chat",
        "--lmeval-tasks",
        "--decode-tokens",
    ):
        assert flag in with_plugin.stdout, flag
    bad = evalkit("run", "--eval", "echo", "--echo-max-tokens", "2")
    assert (
        bad.returncode == 2
        and "echo parameter max_tokens = 2 is too small: use --echo-max-tokens 4 or more" in bad.stderr
    )


def test_a_plugin_module_that_cannot_be_imported_is_one_line():
    env_bad = subprocess.run(
        [sys.executable, "-m", "evalkit", "run", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "EVALKIT_EVALS": "tests.evals.no_such_module"},
    )
    assert env_bad.returncode == 2
    lines = [x for x in env_bad.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "tests.evals.no_such_module" in lines[0] and "EVALKIT_EVALS" in lines[0], env_bad.stderr


@pytest.mark.slow
def test_run_out_writes_a_results_store_that_report_reads(tiny_llama_dir, tmp_path):
    out, plots = tmp_path / "run", tmp_path / "plots"
    res = evalkit(
        "run",
        "--model",
        tiny_llama_dir,
        "--eval",
        "echo",
        "--schemes",
        SCHEMES,
        "--echo-max-tokens",
        12,
        "--out",
        out,
        "--cache-dir",
        tmp_path / "cache",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    rows = metric_rows(out)
    assert {(r["scheme"], r["metric"]) for r in rows} == {
        (s, m) for s in SCHEMES.split(",") for m in ("nll", "nll_delta")
    }
    assert all(r["eval"] == "echo" and r["model"] == str(tiny_llama_dir) for r in rows)
    assert (out / "spec.json").is_file()
    report = evalkit("report", out, "--plots", plots)
    assert report.returncode == 0, report.stderr[-2000:]
    header = next(line for line in report.stdout.splitlines() if line.startswith("|"))
    assert "echo Δnll" in header
    baseline = next(line for line in report.stdout.splitlines() if line.startswith("| baseline"))
    assert baseline.rstrip(" |").endswith("baseline")  # the column's declared baseline cell
    assert (plots / "echo_0.png").is_file() and (plots / "echo_0.svg").is_file()
    # the same command again: a new attempt of each run in the same store, which the report counts once
    again = evalkit(
        "run",
        "--model",
        tiny_llama_dir,
        "--eval",
        "echo",
        "--schemes",
        SCHEMES,
        "--echo-max-tokens",
        12,
        "--out",
        out,
        "--cache-dir",
        tmp_path / "cache",
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert len(metric_rows(out)) == 2 * len(rows)
    table = [line for line in report.stdout.splitlines() if line.startswith("|")]
    assert [line for line in evalkit("report", out).stdout.splitlines() if line.startswith("|")] == table
    # other runs in the same folder are refused before anything loads
    other = evalkit(
        "run", "--model", tiny_llama_dir, "--eval", "echo", "--schemes", SCHEMES, "--echo-max-tokens", 10, "--out", out
    )
    assert other.returncode == 2 and "belongs to a different grid" in other.stderr


@pytest.mark.slow
def test_a_grid_sweeps_sizes_and_reports_the_plugin_eval(tiny_llama_dir, tmp_path):
    grid = tmp_path / "echo.yaml"
    grid.write_text(
        f"name: echo\nmodels: [{tiny_llama_dir}]\nschemes: [{SCHEMES}]\nevals:\n  echo: {{max_tokens: 12}}\n"
    )
    dry = evalkit("sweep", grid, "--dry-run", "--out", tmp_path / "dry", "--cache-dir", tmp_path / "cache")
    assert dry.returncode == 0, dry.stderr[-2000:]
    rows = [
        re.split(r"\s{2,}", line.strip()) for line in dry.stdout.splitlines() if line.startswith(str(tiny_llama_dir))
    ]
    assert [r[2] for r in rows] == ["echo", "echo"]
    tokens = [int(r[3].rstrip("~").replace(",", "")) for r in rows]
    assert tokens == [2 * 12, 12]  # the first run also pays the baseline pass
    assert "cannot size" not in dry.stdout
    out = tmp_path / "sweep"
    sweep = evalkit("sweep", grid, "--out", out, "--cache-dir", tmp_path / "cache", "--no-progress")
    assert sweep.returncode == 0, sweep.stderr[-2000:]
    assert {(r["scheme"], r["metric"]) for r in metric_rows(out)} == {
        (s, m) for s in SCHEMES.split(",") for m in ("nll", "nll_delta")
    }
    report = evalkit("report", out, "--plots", tmp_path / "plots")
    assert report.returncode == 0 and "echo Δnll" in report.stdout, report.stderr[-2000:]
    assert (tmp_path / "plots" / "echo_0.png").is_file()
