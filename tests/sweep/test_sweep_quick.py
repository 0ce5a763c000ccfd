"""The shipped quick grid with the real perplexity eval, on a tiny model: the sweep's rows equal
what `evalkit run` computes for the same scheme (same numbers through either entry point), and
`python -m evalkit sweep --quick` is wired to sweeps/quick.yaml."""

from __future__ import annotations

import json

import pytest
import yaml

from evalkit.cli import main
from evalkit.evals.perplexity.evaluation import PerplexityParams  # evalkit's own: a broken import fails, never skips
from evalkit.sweep.grid import parse_grid, resolve_grid
from evalkit.sweep.store import ResultStore


@pytest.mark.slow
def test_quick_grid_on_tiny_model_matches_run(tmp_path, tiny_llama_dir, capsys):
    grid = yaml.safe_load(resolve_grid("quick").read_text())
    grid["models"] = [str(tiny_llama_dir)]
    grid["schemes"] = grid["schemes"][:3]
    (tmp_path / "q.yaml").write_text(yaml.safe_dump(grid))
    out = tmp_path / "out"
    assert (
        main(
            ["sweep", str(tmp_path / "q.yaml"), "--out", str(out), "--no-progress", "--cache-dir", str(tmp_path / "c")]
        )
        == 0
    )
    assert f"results: {out / 'results.jsonl'}" in capsys.readouterr().out
    view = ResultStore(out).read()
    assert len(view.complete) == 3 and not view.failed
    params = grid["evals"]["perplexity"]  # the same parameters through run's --perplexity-<key> flags
    scheme = grid["schemes"][1]
    argv = [
        "run",
        "--model",
        str(tiny_llama_dir),
        "--eval",
        "perplexity",
        "--schemes",
        scheme,
        "--json",
        "--cache-dir",
        str(tmp_path / "c"),
    ] + [x for k, v in params.items() for x in (PerplexityParams.flag(k), str(v))]
    assert main(argv) == 0
    ran = [r for r in json.loads(capsys.readouterr().out) if r["scheme"] == scheme]
    swept = [r for r in view.rows if r["scheme"] == scheme]
    key = lambda r: (r["metric"], json.dumps(r["labels"], sort_keys=True))  # noqa: E731
    assert ran and sorted((key(r), r["value"], r["ci_low"], r["ci_high"]) for r in ran) == sorted(
        (key(r), r["value"], r["ci_low"], r["ci_high"]) for r in swept
    )
    ppl = {r["scheme"]: r["value"] for r in view.rows if r["metric"] == "ppl" and not r["labels"]}
    assert set(ppl) == set(grid["schemes"]) and all(v > 1 for v in ppl.values())


def test_quick_flag_selects_quick_grid(tmp_path, capsys):
    g = parse_grid(resolve_grid("quick"))
    assert g.name == "quick" and 1 < len(g.runs) <= 8
    assert main(["sweep", "quick.yaml", "--quick"]) == 2
    assert "either a grid or --quick" in capsys.readouterr().err
