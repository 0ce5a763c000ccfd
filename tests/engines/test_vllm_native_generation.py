"""``run --engine vllm --eval generation`` and ``--eval longcontext`` are engine-native, with the noise floor row.

Run in the vLLM environment (``VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1
/work/envs/vllm/bin/python -m pytest -q tests/engines/test_vllm_native_generation.py``); elsewhere it skips,
saying why. Both evaluations send their requests through lm-eval's own vLLM model
(:mod:`evalkit.engines.vllm.lmeval`), one engine start per run and one for each prepared baseline.

* The command: ``run --engine vllm`` loads no transformers weights and prints the baseline, the scheme and
  ``auto (noise floor)``, whose stored rows carry ``info["noise_floor"]`` (five engine starts).
* Today's path: the scheme's run of the same grid through the sweep's runner (what ``run`` hands it) with the
  runner given the loaded model (what ``run`` gave the engine before it became weightless), as
  tests/engines/test_vllm_native.py computes it for perplexity, against the weightless handle: the run's
  per-item records (its artifact: ``generation_items.json``, ``longcontext_items.json``) and rows are the same
  both ways (two engine starts each way).

Prompts are few and short: two arithmetic items with 16 output tokens; one RULER needle item at each of the
stand-in's two lengths (about 220 and 450 tokens).
"""

from __future__ import annotations

import json

import pytest

from evalkit.cli import main

from tests.engines.vllm_env import needs_vllm

COMMON = ["run", "--engine", "vllm", "--model", "embedded", "--schemes", "fp8_e4m3/tensor/unit", "--no-progress"]
CASES = {
    "generation": (
        ["--generation-limit", "2", "--generation-max-gen-toks", "16"],
        "{limit: 2, max_gen_toks: 16}",
        "generation_items.json",
        ("tasks", "traces"),
    ),
    "longcontext": (
        ["--longcontext-tasks", "longctx_ruler_niah_single_1", "--longcontext-limit", "1"],
        "{tasks: [longctx_ruler_niah_single_1], limit: 1}",
        "longcontext_items.json",
        ("items", "baseline"),
    ),
}


def _store(folder):
    """run id -> (its scheme as ``run`` shows it, its metric rows, its per-item artifact), from a results store."""
    records = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    out = {}
    for r in records:
        if r["type"] == "complete":
            floor = bool(r["spec"].get("engine_options", {}).get("noise_floor"))
            rows = [m for m in records if m["type"] == "metric" and m["run_id"] == r["run_id"]]
            out[r["run_id"]] = (r["scheme"] + (" (noise floor)" if floor else ""), rows)
    return out


def _items(folder, run_id, artifact, keys):
    data = json.loads((folder / "runs" / run_id[:16] / artifact).read_text())
    return {k: data[k] for k in keys}


def _values(rows):
    return {
        (m["metric"], json.dumps(m["labels"], sort_keys=True)): (m["value"], m["ci_low"], m["ci_high"]) for m in rows
    }


def _refuse_weights(monkeypatch) -> list:
    """transformers' from_pretrained and evalkit's loader raise; returns the list of attempts."""
    import transformers.modeling_utils

    import evalkit.models.loading as loading

    loads = []

    def refuse(*args, **kwargs):
        loads.append(args)
        raise AssertionError("transformers weights were loaded in an engine run")

    monkeypatch.setattr(transformers.modeling_utils.PreTrainedModel, "from_pretrained", classmethod(refuse))
    monkeypatch.setattr(loading, "load_model", refuse)
    return loads


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("eval_name", sorted(CASES))
def test_run_engine_vllm_is_native_and_prints_its_noise_floor(eval_name, tmp_path, capsys, monkeypatch):
    flags, _, _, _ = CASES[eval_name]
    loads = _refuse_weights(monkeypatch)
    out = tmp_path / "native"
    capsys.readouterr()
    assert main([*COMMON, "--eval", eval_name, *flags, "--cache-dir", str(tmp_path / "c"), "--out", str(out)]) == 0
    table = [line.split("|")[1].strip() for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert loads == []
    assert table[1:] == ["auto", "fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz", "auto (noise floor)"]
    runs = _store(out)
    assert sorted(shown for shown, _ in runs.values()) == sorted(table[1:])
    for shown, rows in runs.values():
        assert rows and {m["info"]["backend"] for m in rows} == {runs[next(iter(runs))][1][0]["info"]["backend"]}
        assert all(bool(m["info"].get("noise_floor")) == shown.endswith("(noise floor)") for m in rows), shown


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("eval_name", sorted(CASES))
def test_per_item_results_equal_todays_engine_path(eval_name, tmp_path, monkeypatch):
    import dataclasses

    import evalkit.models.handle as handle
    import evalkit.models.loading as loading
    from evalkit.sweep.grid import parse_grid
    from evalkit.sweep.one_model import run_model
    from evalkit.sweep.store import ResultStore

    _, params, artifact, keys = CASES[eval_name]  # the grid's parameters of the command's flags
    path = tmp_path / "g.yaml"
    path.write_text(
        f"models: [embedded]\nschemes: [fp8_e4m3/tensor/unit]\nengine: vllm\nevals: {{{eval_name}: {params}}}\n"
    )
    grid = parse_grid(path)
    (run,) = [r for r in grid.runs if not r.engine_options.get("noise_floor")]  # the scheme's run, as run makes it
    grid = dataclasses.replace(grid, runs=(run,))
    with monkeypatch.context() as m:  # today's path: evalkit loads the weights and hands them to the engine
        m.setattr(handle, "open_model_with", loading.load_model_with)
        run_model(grid, ResultStore(tmp_path / "loaded"), tmp_path / "w1")
    loads = _refuse_weights(monkeypatch)
    run_model(grid, ResultStore(tmp_path / "native"), tmp_path / "w2")
    assert loads == []
    native, loaded = _store(tmp_path / "native"), _store(tmp_path / "loaded")
    assert list(native) == list(loaded) == [run.run_id]
    (_, rows), (_, before) = native[run.run_id], loaded[run.run_id]
    assert rows and _values(rows) == _values(before)
    assert {m["info"]["backend"] for m in rows} == {m["info"]["backend"] for m in before}
    mine = _items(tmp_path / "native", run.run_id, artifact, keys)
    assert mine == _items(tmp_path / "loaded", run.run_id, artifact, keys)
    assert any(mine.values())  # per-item records were compared, not two empty lists
