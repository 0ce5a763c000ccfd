"""``run --engine vllm`` is engine-native: evalkit loads no transformers weights, vLLM loads its own.

Run in the vLLM environment (``VLLM_ENABLE_V1_MULTIPROCESSING=0 /work/envs/vllm/bin/python -m pytest -q
tests/engines/test_vllm_native.py``); elsewhere it skips, saying why. The expected rows are today's
engine path computed in the test: the same command with the runner handed the loaded model (what
``run`` gave the engine before it became weightless, at d9c9f6f) instead of the weightless handle.
"""

from __future__ import annotations

import json

import pytest

from evalkit.cli import main

from tests.engines.vllm_env import needs_vllm

ARGV = [
    "run",
    "--engine",
    "vllm",
    "--model",
    "embedded",
    "--eval",
    "perplexity",
    "--schemes",
    "fp8_e4m3/tensor/unit",
    "--perplexity-max-windows",
    "2",
    "--perplexity-window",
    "64",
    "--perplexity-stride",
    "64",
    "--perplexity-bootstrap-samples",
    "200",
    "--json",
    "--no-progress",
]


def _values(rows):
    return {(r["scheme"], r["metric"], r.get("label")): r["value"] for r in rows}


@needs_vllm
@pytest.mark.slow
def test_run_engine_vllm_loads_no_weights_and_gives_the_loaded_paths_rows(tmp_path, capsys, monkeypatch):
    import transformers.modeling_utils

    import evalkit.models.handle as handle
    import evalkit.models.loading as loading

    argv = [*ARGV, "--cache-dir", str(tmp_path / "cache")]
    with monkeypatch.context() as m:  # today's path: evalkit loads the weights and hands them to the engine
        m.setattr(handle, "open_model_with", loading.load_model_with)
        capsys.readouterr()
        assert main(argv) == 0
        loaded = json.loads(capsys.readouterr().out)

    loads = []

    def refuse(*args, **kwargs):
        loads.append(args)
        raise AssertionError("transformers weights were loaded in an engine run")

    monkeypatch.setattr(transformers.modeling_utils.PreTrainedModel, "from_pretrained", classmethod(refuse))
    monkeypatch.setattr(loading, "load_model", refuse)
    assert main([*argv, "--out", str(tmp_path / "store")]) == 0
    native = json.loads(capsys.readouterr().out)
    assert loads == []
    assert {r["info"]["backend"] for r in native} == {r["info"]["backend"] for r in loaded}
    assert {r["info"]["backend"] for r in native}.pop().startswith("vllm")
    assert len(native) == len(loaded) > 0 and _values(native) == _values(loaded)
    floor = [r for r in native if r["scheme"] == "auto (noise floor)"]  # the engine's auto against auto, beside
    assert floor and all(r["info"]["noise_floor"] for r in floor)
    records = [json.loads(x) for x in (tmp_path / "store" / "results.jsonl").read_text().splitlines()]
    infos = [r["info"] for r in records if r["type"] == "complete"]
    assert len(infos) == 3 and {i["dtype"] for i in infos} == {"float32"}  # auto, the scheme, the noise floor
    assert {i["kv_layout"]["num_kv_heads"] for i in infos} == {3}
