"""``calibrate --import-modelopt DIR``: the k/v scales of a folder shaped as ModelOpt 0.47's Hugging Face export
writes it (hf_quant_config.json, config.json's quantization_config, ``<attn>.k_proj.k_scale`` = amax / 448),
made here; the presets whose scales are not a table (cast, NVFP4, affine, none) refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from evalkit.cli import main
from evalkit.errors import EvalkitError
from evalkit.kv.scale_table import load_scale_table
from evalkit.scales.modelopt_io import import_modelopt

AMAX_K = [3.5, 12.25, 0.875, 448.0]  # calibrated amax per layer (exact / 448 in float32: powers of two times 7)
AMAX_V = [7.0, 1.75, 28.0, 56.0]


def _export(folder, tiny_llama_dir, algo="FP8", scales=True, bias=False, where="hf_quant_config"):
    """A folder as ModelOpt's unified HF export leaves it (the parts calibrate reads)."""
    folder.mkdir()
    cfg = json.loads((tiny_llama_dir / "config.json").read_text())
    layers = cfg["num_hidden_layers"]
    quant = {"quant_algo": "FP8", "kv_cache_quant_algo": algo, "exclude_modules": ["lm_head"]}
    if where == "hf_quant_config":
        (folder / "hf_quant_config.json").write_text(
            json.dumps({"producer": {"name": "modelopt", "version": "0.47.0"}, "quantization": quant})
        )
        scheme = {"dynamic": False, "num_bits": 8, "type": "float"} if algo == "FP8" else algo
        cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_scheme": scheme}
    else:  # an older export: kv_cache_quant_algo in config.json's quantization_config only
        cfg["quantization_config"] = {"quant_method": "modelopt", **quant}
    (folder / "config.json").write_text(json.dumps(cfg))
    tensors = {"model.embed_tokens.weight": torch.zeros(4, 4)}
    for i in range(layers):
        prefix = f"model.layers.{i}.self_attn"
        if scales:  # postprocess_state_dict: k_bmm_quantizer._amax -> k_proj.k_scale = amax.float() / 448
            tensors[f"{prefix}.k_proj.k_scale"] = torch.tensor(AMAX_K[i % 4]).float() / 448
            tensors[f"{prefix}.v_proj.v_scale"] = torch.tensor(AMAX_V[i % 4]).float() / 448
        if bias:
            tensors[f"{prefix}.k_proj.k_bias"] = torch.zeros(8)
            tensors[f"{prefix}.v_proj.v_bias"] = torch.zeros(8)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder, layers


@pytest.mark.parametrize("where", ["hf_quant_config", "config.json"])
def test_an_fp8_export_gives_its_amax_over_448_per_layer(tiny_llama_dir, tmp_path, where):
    folder, layers = _export(tmp_path / "ckpt", tiny_llama_dir, where=where)
    table = import_modelopt(folder)
    assert table.granularity == "tensor" and table.meta["format"] == "fp8_e4m3"
    assert table.meta["kv_cache_quant_algo"] == "FP8"
    want_k = [AMAX_K[i % 4] / 448 for i in range(layers)]  # Python float64; every value is exact in float32
    want_v = [AMAX_V[i % 4] / 448 for i in range(layers)]
    assert table.k_scale.tolist() == want_k and table.v_scale.tolist() == want_v
    if layers > 3:
        assert table.k_scale[3].item() == 1.0  # a calibrated amax of 448 is scale 1: read, not filled in


def test_the_cli_writes_the_table_and_names_its_scheme(tiny_llama_dir, tmp_path, capsys):
    folder, layers = _export(tmp_path / "ckpt", tiny_llama_dir)
    out = tmp_path / "imported.safetensors"
    assert main(["calibrate", "--import-modelopt", str(folder), "--out", str(out)]) == 0
    assert f"fp8_e4m3/tensor/static+scales={out}" in capsys.readouterr().out
    table = load_scale_table(out)
    assert table.k_scale.tolist() == [AMAX_K[i % 4] / 448 for i in range(layers)]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"scales": False}, "kv/fp8_cast preset (use_constant_amax) exports none"),
        ({"algo": "NVFP4"}, "kv_cache_quant_algo NVFP4: its k_scale/v_scale are a 4-bit cache's"),
        ({"algo": "NVFP4_AFFINE"}, "kv_cache_quant_algo NVFP4_AFFINE"),
        ({"bias": True}, "k_bias/v_bias (ModelOpt's kv/fp8_affine preset)"),
        ({"algo": None}, "names a kv_cache_quant_algo, so ModelOpt left the KV cache unquantized"),
    ],
)
def test_what_is_not_a_scale_table_is_one_line(tiny_llama_dir, tmp_path, capsys, kwargs, message):
    folder, _ = _export(tmp_path / "ckpt", tiny_llama_dir, **kwargs)
    with pytest.raises(EvalkitError, match=message.replace("(", r"\(").replace(")", r"\)")):
        import_modelopt(folder)
    code = main(["calibrate", "--import-modelopt", str(folder), "--out", str(tmp_path / "x.safetensors")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err


def test_one_source_of_scales_at_a_time(tiny_llama_dir, tmp_path, capsys):
    folder, _ = _export(tmp_path / "ckpt", tiny_llama_dir)
    argv = ["calibrate", "--import-modelopt", str(folder), "--import-vllm", str(folder)]
    assert main([*argv, "--out", str(tmp_path / "x.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "give one of --import-vllm, --import-modelopt, not 2" in err and err.count("\n") == 1
    assert (
        main(["calibrate", "--import-modelopt", str(tmp_path / "nowhere"), "--out", str(tmp_path / "y.safetensors")])
        == 2
    )
    assert "no config.json" in capsys.readouterr().err
