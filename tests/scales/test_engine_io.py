"""vLLM / llm-compressor checkpoint interchange: names, shapes, dtypes and the kv_cache_scheme
as the engines read them; export -> import gives the same table, scheme and logits; bad input."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from evalkit import parse_scheme, quantized_kv
from evalkit.errors import EvalkitError
from evalkit.kv.scale_table import load_scale_table, save_scale_table
from evalkit.scales.calibrate import calibrate
from evalkit.scales.vllm_io import SCALES_FILE, export_vllm, import_vllm


@pytest.fixture(scope="module")
def tables(tiny):
    return {
        g: calibrate(tiny, samples=2, seq_len=48, granularity=g, method="amax", eval_corpus=None)
        for g in ("tensor", "head")
    }


def config_of(lm) -> dict:
    return json.loads(lm.model.config.to_json_string())


@pytest.mark.parametrize("granularity", ["tensor", "head"])
def test_export_writes_what_vllm_loads(tiny, tables, tmp_path, granularity):
    table = tables[granularity]
    out = export_vllm(table, tmp_path / "ckpt", config_of(tiny))
    H, L = tiny.layout.num_kv_heads, tiny.layout.num_layers
    with safe_open(str(out / SCALES_FILE), framework="pt") as fh:
        names = set(fh.keys())
        assert names == {f"model.layers.{i}.self_attn.{w}_scale" for i in range(L) for w in "kv"}
        for i in range(L):
            k = fh.get_tensor(f"model.layers.{i}.self_attn.k_scale")
            assert k.dtype == torch.float32
            assert k.shape == ((1,) if granularity == "tensor" else (H, 1, 1))  # compressed-tensors shapes
            assert torch.equal(k.flatten(), table.k_scale[i].flatten())
    cfg = json.loads((out / "config.json").read_text())
    q = cfg["quantization_config"]
    assert q["quant_method"] == "compressed-tensors"
    scheme = q["kv_cache_scheme"]
    assert (scheme["num_bits"], scheme["type"], scheme["symmetric"], scheme["dynamic"]) == (8, "float", True, False)
    assert scheme["strategy"] == {"tensor": "tensor", "head": "attn_head"}[granularity]
    assert cfg["num_key_value_heads"] == H


@pytest.mark.parametrize("granularity", ["tensor", "head"])
def test_round_trip_gives_the_same_table_scheme_and_logits(tiny, tables, tmp_path, granularity):
    table = tables[granularity]
    original = tmp_path / "orig.safetensors"
    save_scale_table(original, table)
    export_vllm(table, tmp_path / "ckpt", config_of(tiny))
    imported = import_vllm(tmp_path / "ckpt")
    assert imported.granularity == granularity
    assert torch.equal(imported.k_scale, table.k_scale) and torch.equal(imported.v_scale, table.v_scale)
    assert imported.meta["config_hash"] == tiny.config_hash  # validates against the same model
    back = tmp_path / "back.safetensors"
    save_scale_table(back, imported)
    s1 = parse_scheme(f"fp8_e4m3/{granularity}/static+scales={original}")
    s2 = parse_scheme(f"fp8_e4m3/{granularity}/static+scales={back}")
    assert (s1.format, s1.granularity, s1.scales) == (s2.format, s2.granularity, s2.scales)
    load_scale_table(back, tiny.layout, granularity=granularity, config_hash=tiny.config_hash)
    ids = torch.randint(0, len(tiny.tokenizer), (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        with quantized_kv(tiny.model, s1):
            a = tiny.model(input_ids=ids).logits
        with quantized_kv(tiny.model, s2):
            b = tiny.model(input_ids=ids).logits
        base = tiny.model(input_ids=ids).logits
    assert torch.equal(a, b) and not torch.equal(a, base)


def test_import_llm_compressor_modelopt_and_legacy_names(tiny, tmp_path):
    """Checkpoints as other tools write them: bf16 (1,) scales, ModelOpt k_proj.k_scale, one kv_scale."""
    L = tiny.layout.num_layers
    cfg = config_of(tiny)
    values = torch.tensor([0.03125, 0.0625, 0.5, 0.25])  # exact in bf16
    layouts = {
        "llmc": lambda i: {
            f"model.layers.{i}.self_attn.k_scale": values[i : i + 1].bfloat16(),
            f"model.layers.{i}.self_attn.v_scale": values[i + 2 : i + 3].bfloat16(),
        },
        "modelopt": lambda i: {
            f"model.layers.{i}.self_attn.k_proj.k_scale": values[i].reshape(()),
            f"model.layers.{i}.self_attn.v_proj.v_scale": values[i + 2].reshape(()),
        },
        "legacy": lambda i: {f"model.layers.{i}.self_attn.kv_scale": values[i : i + 1]},
    }
    for name, make in layouts.items():
        folder = tmp_path / name
        folder.mkdir()
        tensors = {"model.embed_tokens.weight": torch.zeros(4, 4)}
        for i in range(L):
            tensors.update(make(i))
        save_file(tensors, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(cfg))
        table = import_vllm(folder)
        assert table.granularity == "tensor" and table.k_scale.dtype == torch.float32
        assert torch.equal(table.k_scale, values[:L])
        assert torch.equal(table.v_scale, values[:L] if name == "legacy" else values[2 : 2 + L])


def test_bad_checkpoints_are_one_clear_error(tiny, tables, tmp_path):
    cfg = config_of(tiny)
    empty = tmp_path / "noscales"
    empty.mkdir()
    save_file({"model.embed_tokens.weight": torch.zeros(2, 2)}, str(empty / "model.safetensors"))
    (empty / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EvalkitError, match="no k_scale/v_scale tensors.*scale 1.0"):
        import_vllm(empty)
    with pytest.raises(EvalkitError, match="no config.json"):
        import_vllm(tmp_path / "missing")
    partial = tmp_path / "partial"
    partial.mkdir()
    save_file(
        {"model.layers.0.self_attn.k_scale": torch.ones(1), "model.layers.0.self_attn.v_scale": torch.ones(1)},
        str(partial / "model.safetensors"),
    )
    (partial / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EvalkitError, match=r"lacks k_scale or v_scale for layers \[1\]"):
        import_vllm(partial)
    out = export_vllm(tables["tensor"], tmp_path / "ckpt", cfg)
    with pytest.raises(EvalkitError, match="not empty"):
        export_vllm(tables["tensor"], out, cfg)
    export_vllm(tables["head"], out, cfg, force=True)
    assert import_vllm(out).granularity == "head"
    wrong = json.loads((out / "config.json").read_text())
    wrong["quantization_config"]["kv_cache_scheme"]["strategy"] = "tensor"
    (out / "config.json").write_text(json.dumps(wrong))
    with pytest.raises(EvalkitError, match="strategy 'tensor'"):
        import_vllm(out)


def test_cli_import_export(tiny_llama_dir, tmp_path, capsys):
    from evalkit.cli import main

    out = tmp_path / "s.safetensors"
    assert (
        main(
            [
                "calibrate",
                "--model",
                str(tiny_llama_dir),
                "--samples",
                "1",
                "--seq-len",
                "32",
                "--granularity",
                "head",
                "--out",
                str(out),
                "--export-vllm",
                str(tmp_path / "ckpt"),
                "--with-weights",
            ]
        )
        == 0
    )
    assert (tmp_path / "ckpt" / "model.safetensors").is_file() and (tmp_path / "ckpt" / SCALES_FILE).is_file()
    back = tmp_path / "back.safetensors"
    assert main(["calibrate", "--import-vllm", str(tmp_path / "ckpt"), "--out", str(back)]) == 0
    assert f"fp8_e4m3/head/static+scales={back}" in capsys.readouterr().out
    a, b = load_scale_table(out), load_scale_table(back)
    assert torch.equal(a.k_scale, b.k_scale) and torch.equal(a.v_scale, b.v_scale)
    assert (
        main(
            [
                "calibrate",
                "--model",
                str(tiny_llama_dir),
                "--scales",
                str(out),
                "--export-vllm",
                str(tmp_path / "ckpt2"),
            ]
        )
        == 0
    )
    again = import_vllm(tmp_path / "ckpt2")
    assert torch.equal(again.k_scale, a.k_scale) and torch.equal(again.v_scale, a.v_scale)
    capsys.readouterr()
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_text((tmp_path / "ckpt" / "config.json").read_text())
    assert main(["calibrate", "--import-vllm", str(tmp_path / "bare"), "--out", str(tmp_path / "x.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no k_scale/v_scale" in err
