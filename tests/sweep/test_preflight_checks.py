"""The checks made before a model loads (evalkit.sweep.preflight), each held to the run's own verdict:
a scale table the preflight refuses is one the run's loader refuses (and the reverse), and a scheme it
refuses on an architecture is one the run's binding refuses, except vLLM's sparse-MLA rule, which only
vLLM imposes (read in vLLM 0.33's source: see evalkit.sweep.preflight.model_fit).

Models are folders holding only a config.json: nothing here could load a model if it tried.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from evalkit.errors import EvalkitError
from evalkit.kv.scale_table import load_scale_table
from evalkit.kv.scheme import parse_scheme
from evalkit.models.facts import read_config, sparse_attention
from evalkit.models.folder import model_arch
from evalkit.sweep.preflight.engines import check_engine_profiles
from evalkit.sweep.preflight.model_fit import check_model_fit
from evalkit.sweep.preflight.planned import PlannedRun
from evalkit.sweep.preflight.scale_files import check_scale_files
from evalkit.sweep.spec import ModelSpec

REPO = Path(__file__).resolve().parents[2]
HEAD_TABLE = REPO / "calibration" / "smollm2-135m-head-amax.safetensors"  # (30, 3): the embedded model's

LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 64,  # head_dim 16
    "max_position_embeddings": 512,
}
DEEPSEEK = {
    "model_type": "deepseek_v3",
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "hidden_size": 256,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "max_position_embeddings": 4096,
}
SPARSE = {**DEEPSEEK, "index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128}  # DeepSeek V3.2's keys


def model_dir(tmp_path: Path, name: str, config: dict) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def runs(model: str, *schemes: str, **kw) -> list[PlannedRun]:
    return [
        PlannedRun(ModelSpec(model), str(parse_scheme(s)), scheme_key=("schemes", i), **kw)
        for i, s in enumerate(schemes)
    ]


# -- scale files --------------------------------------------------------------------------------------


def table(path: Path, k, v, meta: dict | str | None = None) -> Path:
    save_file({n: t.clone() for n, t in (("k_scale", k), ("v_scale", v)) if t is not None}, str(path))
    if meta is not None:
        Path(str(path) + ".json").write_text(meta if isinstance(meta, str) else json.dumps(meta))
    return path


ONES_30 = torch.ones(30)

TABLE_CASES = {  # name -> (how to make it under tmp, the scheme's granularity, words of the problem)
    "missing": (lambda p: p, "tensor", "does not exist"),
    "a folder": (lambda p: (p.mkdir(), p)[1], "tensor", "does not exist"),
    "not safetensors": (lambda p: (p.write_text("not a table"), p)[1], "tensor", "not a readable safetensors file"),
    "no v_scale": (lambda p: table(p, ONES_30, None), "tensor", "has no v_scale entry"),
    "k and v differ": (lambda p: table(p, ONES_30, torch.ones(29)), "tensor", "differ in shape"),
    "head table, tensor scheme": (
        lambda p: table(p, torch.ones(30, 3), torch.ones(30, 3)),
        "tensor",
        "holds head scales",
    ),
    "another model's": (lambda p: table(p, torch.ones(5), torch.ones(5)), "tensor", "made for another model"),
    "another format": (
        lambda p: table(p, ONES_30, ONES_30, {"format": "fp8_e5m2", "config_hash": "0123456789abcdef"}),
        "tensor",
        "calibrated for fp8_e5m2",
    ),
}


@pytest.mark.parametrize("case", list(TABLE_CASES))
def test_a_broken_table_is_refused_as_the_run_refuses_it(case, tmp_path):
    make, granularity, words = TABLE_CASES[case]
    path = make(tmp_path / "scales.safetensors")
    scheme = f"fp8_e4m3/{granularity}/static+scales={path}"
    (problem,) = check_scale_files(runs("embedded", scheme))
    assert words in problem.message and problem.key == ("schemes", 0) and not problem.note
    arch = model_arch("embedded")
    with pytest.raises(EvalkitError):  # the run's own loader and binding refuse it too
        from evalkit.integration.binding import BoundScheme

        BoundScheme(parse_scheme(scheme), arch.layout)


def test_a_good_table_passes_reading_its_header_only(monkeypatch):
    import safetensors.torch

    import evalkit.kv.scale_table

    def refuse(*a, **k):
        raise AssertionError("tensors were loaded")

    monkeypatch.setattr(safetensors.torch, "load_file", refuse)
    monkeypatch.setattr(evalkit.kv.scale_table, "load_file", refuse)
    good = runs(
        "embedded",
        f"fp8_e4m3/head/static+scales={HEAD_TABLE}",
        "fp8_e4m3/head/static+scales=calibration/" + HEAD_TABLE.name,
    )
    assert check_scale_files(good) == []
    monkeypatch.undo()
    assert tuple(load_scale_table(HEAD_TABLE, model_arch("embedded").layout, "head").k_scale.shape) == (30, 3)


def test_a_sidecar_that_is_not_json_is_a_problem_not_a_traceback(tmp_path):
    path = table(tmp_path / "s.safetensors", ONES_30, ONES_30, "{not json")
    (problem,) = check_scale_files(runs("embedded", f"fp8_e4m3/tensor/static+scales={path}"))
    assert "is not readable JSON" in problem.message


def test_each_file_is_reported_once_per_scheme_entry(tmp_path):
    path = tmp_path / "nope.safetensors"
    planned = runs("embedded", f"fp8_e4m3/tensor/static+scales={path}") + runs(
        "meta-llama/Llama-3.1-8B", f"fp8_e4m3/tensor/static+scales={path}"
    )
    from evalkit.sweep.preflight.planned import find_problems

    assert len(find_problems(planned, [check_scale_files])) == 1


# -- architectures ------------------------------------------------------------------------------------

FIT_CASES = [  # (config, scheme, words of the problem or None)
    (DEEPSEEK, "vllm:fp8", None),
    (DEEPSEEK, "fp8_e4m3/group128/dynamic+rope=bf16", None),
    (DEEPSEEK, "fp8_e4m3/head/dynamic", "use tensor, token or group<N>"),
    (DEEPSEEK, "vllm:int8_per_token_head", "no MLA backend"),
    (LLAMA, "vllm:fp8_ds_mla", "does not apply to standard attention"),
    (LLAMA, "vllm:nvfp4_ds_mla", "does not apply to standard attention"),
    (LLAMA, "vllm:int8_per_token_head", "head_size >= 32, not 16"),
    (LLAMA, "fp8_e4m3/group32/dynamic", "group32 does not divide head_dim 16"),
    (LLAMA, "fp8_e4m3/tensor/dynamic+skip=0,2", "skip=2 but the model has layers 0..1"),
    (LLAMA, "fp8_e4m3/tensor/dynamic+rope=bf16", "+rope=bf16 applies to multi-head latent attention models only"),
    (LLAMA, "fp8_e4m3/tensor/dynamic+skip=0,1", None),
    (LLAMA, "nvfp4", None),
]


@pytest.mark.parametrize("config, scheme, words", FIT_CASES, ids=[f"{c['model_type']}-{s}" for c, s, _ in FIT_CASES])
def test_architecture_verdicts_are_the_runs_own(config, scheme, words, tmp_path):
    from evalkit.integration.binding import BoundScheme

    folder = model_dir(tmp_path, "m", config)
    problems = check_model_fit(runs(folder, scheme))
    if words is None:
        assert problems == []
        BoundScheme(parse_scheme(scheme), model_arch(folder).layout)  # and the run binds it
    else:
        (problem,) = problems
        assert words in problem.message and problem.message.startswith(f"{parse_scheme(scheme)} on {folder} (")
        with pytest.raises(EvalkitError):
            BoundScheme(parse_scheme(scheme), model_arch(folder).layout)


@pytest.mark.parametrize("row", ["vllm:fp8_ds_mla", "vllm:nvfp4_ds_mla"])
def test_ds_mla_rows_run_on_sparse_mla_only(row, tmp_path):
    """Kimi K2 and DeepSeek V3 are dense MLA: vLLM has no backend for the DeepSeek V3.2 rows there, though
    evalkit's emulation could store them; a config with an indexer (index_topk) is V3.2's, and takes them."""
    from evalkit.integration.binding import BoundScheme

    dense, sparse = model_dir(tmp_path, "dense", DEEPSEEK), model_dir(tmp_path, "sparse", SPARSE)
    assert check_model_fit(runs(sparse, row)) == []
    for model in (dense, "moonshotai/Kimi-K2-Instruct", "deepseek-ai/DeepSeek-V3"):
        (problem,) = check_model_fit(runs(model, row))
        assert "dense multi-head latent attention" in problem.message and "this model's MLA is dense" in problem.message
        assert "use vllm:fp8" in problem.message.lower()
    BoundScheme(parse_scheme(row), model_arch(dense).layout)  # the emulation alone would run it


def test_sparse_attention_is_read_as_transformers_configs_carry_it():
    from transformers import DeepseekV3Config, DeepseekV32Config

    assert sparse_attention(DeepseekV32Config().to_dict()) and not sparse_attention(DeepseekV3Config().to_dict())
    assert sparse_attention({"text_config": SPARSE}) and not sparse_attention(DEEPSEEK)


def test_a_model_without_a_config_here_is_a_note_once(tmp_path):
    empty = tmp_path / "weights-only"
    empty.mkdir()
    for model in (str(empty), "example-org/not-cached-anywhere"):
        (note,) = check_model_fit(runs(model, "vllm:fp8_ds_mla", "fp8_e4m3/tensor/dynamic"))
        assert note.note and note.message.startswith(f"model {model}: ") and note.key == ("models",)


def test_a_config_evalkit_cannot_read_or_intercept_is_a_problem(tmp_path):
    broken = model_dir(tmp_path, "broken", {"model_type": "llama", "num_hidden_layers": 2})
    falcon = model_dir(tmp_path, "falcon", {**LLAMA, "model_type": "falcon"})
    (problem,) = check_model_fit(runs(broken, "fp8_e4m3/tensor/dynamic"))
    assert not problem.note and "cannot size its KV cache" in problem.message
    (problem,) = check_model_fit(runs(falcon, "auto"))
    assert not problem.note and "AttentionInterface" in problem.message


def test_the_engine_profiles_head_size_rule_meets_the_model(tmp_path):
    """vllm-cpu's FP8 cache needs head_dim divisible by 32 (its profile's rule): only a config tells."""
    llama = model_dir(tmp_path, "m", LLAMA)
    planned = runs(llama, "fp8_e4m3/tensor/unit", engine_profile="vllm-cpu", profile_applied=False)
    assert check_engine_profiles(planned) == []  # the scheme itself is vllm-cpu's
    (problem,) = check_model_fit(planned)
    assert "needs head_dim divisible by 32" in problem.message and "this model's is 16" in problem.message
    assert (
        check_model_fit(runs("embedded", "fp8_e4m3/tensor/unit", engine_profile="vllm-cpu", profile_applied=False))
        == []
    )


# -- the config, without weights or the network -------------------------------------------------------


def test_configs_come_from_folders_the_hub_cache_and_presets(tmp_path, monkeypatch):
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    snapshot = cache / "models--example-org--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(SPARSE))
    (cache / "models--example-org--cached" / "refs").mkdir()
    (cache / "models--example-org--cached" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    config, source = read_config("example-org/cached")
    assert config == SPARSE and source == "config in the local Hugging Face cache"
    config, source = read_config("meta-llama/Llama-3.1-8B-Instruct")
    assert source == "evalkit preset llama-3.1-8b" and config["num_key_value_heads"] == 8
    assert read_config(model_dir(tmp_path, "m", LLAMA)) == (LLAMA, "local folder")
    assert read_config("example-org/elsewhere")[0] is None


def test_deepseek_v32_is_sparse_and_its_latent_is_never_quantized_as_standard_attention(tmp_path):
    """DeepSeek V3.2's own config (transformers' DeepseekV32Config): sparse, a 512-value latent. Where
    evalkit reads its type as MLA it takes the ds_mla rows; where it does not, every quantized scheme is
    refused in one line that says why (bf16 still runs)."""
    from transformers import DeepseekV32Config

    from evalkit.models.info import MLA_MODEL_TYPES

    v32 = model_dir(tmp_path, "v32", DeepseekV32Config(num_hidden_layers=4).to_dict())
    assert check_model_fit(runs(v32, "auto")) == []
    problems = check_model_fit(runs(v32, "vllm:fp8_ds_mla", "vllm:nvfp4_ds_mla"))
    if "deepseek_v32" in MLA_MODEL_TYPES:
        assert problems == []
    else:
        assert len(problems) == 2
        assert all(
            "kv_lora_rank 512" in p.message and "deepseek_v32 as standard attention" in p.message for p in problems
        )


def test_a_dtype_vllm_cannot_store_on_the_planned_gpu_is_a_problem_for_the_engine_and_a_note_for_the_emulation():
    """NVFP4 on Kimi K2's dense MLA: no MLA backend of vLLM 0.33 stores it (evalkit.planning.kv_backends),
    on an H200 as on a B200; FP8 on the same model is stored by FlashMLA."""
    from evalkit.planning.gpus import get_gpu
    from evalkit.planning.kv_backends import kv_support
    from evalkit.sweep.preflight.gpu_fit import check_gpu_fit

    kimi = ModelSpec(name="kimi-k2")
    assert not kv_support(get_gpu("h200"), "nvfp4", kind="mla").runs
    engine = PlannedRun(kimi, "vllm:nvfp4", engine_profile="vllm-cuda", gpu="h200", here=False)
    emulation = PlannedRun(kimi, "vllm:nvfp4", gpu="h200", here=False)
    fp8 = PlannedRun(kimi, "fp8_e4m3/tensor/unit", engine_profile="vllm-cuda", gpu="h200", here=False)
    unplanned = PlannedRun(kimi, "vllm:nvfp4", engine_profile="vllm-cuda", gpu=None)
    (problem,) = check_gpu_fit([engine])
    assert not problem.note and "H200" in problem.message and "kv_cache_dtype=nvfp4" in problem.message
    (note,) = check_gpu_fit([emulation])
    assert note.note and "the emulation measures it" in note.message
    assert check_gpu_fit([fp8]) == [] and check_gpu_fit([unplanned]) == []
