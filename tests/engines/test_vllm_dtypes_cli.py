"""`python -m evalkit schemes --engine vllm [--model M] --json`: every kv_cache_dtype of the installed
vLLM (its CacheDType, read from vLLM itself here too), with a scheme or a reason, vLLM's bytes per
token on the model and the kernel source."""

from __future__ import annotations

import json

import pytest

from evalkit.cli import main

from tests.cli_checks import one_line_exit_2
from tests.engines.vllm_env import needs_vllm


def test_model_and_json_need_the_engine(capsys):
    one_line_exit_2(["schemes", "--json"], capsys, "--engine vllm")


@needs_vllm
@pytest.mark.parametrize("model", [None, "deepseek-v3"])
def test_schemes_engine_vllm_json_lists_every_installed_dtype(capsys, model):
    from evalkit.engines.vllm.dtypes import installed_dtypes

    argv = ["schemes", "--engine", "vllm", "--json"] + (["--model", model] if model else [])
    capsys.readouterr()
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["kv_cache_dtype"] for r in out["dtypes"]] == list(installed_dtypes())
    for r in out["dtypes"]:
        assert (r["scheme"] is None) != (r["reason"] is None), r
        assert r["source"] and r["function"]
        if r["scheme"] is not None:
            assert r["vllm_bytes_per_token"] == r["evalkit_bytes_per_token"] > 0, r
    by = {r["kv_cache_dtype"]: r for r in out["dtypes"]}
    if model == "deepseek-v3":
        assert by["fp8_ds_mla"]["vllm_bytes_per_token"] == 656 * 61
        assert by["fp8_per_token_head"]["scheme"] is None
    else:
        assert by["int8_per_token_head"]["scheme"] == "vllm:int8_per_token_head"
        assert by["turboquant_k3v4_nc"]["scheme"] == "vllm:turboquant_k3v4_nc"
