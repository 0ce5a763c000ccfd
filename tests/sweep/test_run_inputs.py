"""Run ids see what decides the numbers besides the spec: the model's weights and the static scale
table a scheme reads, by content (:mod:`evalkit.sweep.run_inputs`). A checkpoint re-trained in place
or a table rewritten under the same path is a new run; a resumed sweep re-runs exactly those."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import transformers as tf

from evalkit.cli import main
from evalkit.kv.scale_table import ScaleTable, save_scale_table
from evalkit.models.info import config_hash
from evalkit.sweep.run_inputs import model_weights_fingerprint
from evalkit.sweep.spec import ModelSpec, RunSpec
from evalkit.sweep.store import ResultStore

from tests.tiny_models import make_model_dir


def spec(model: str, scheme: str = "auto") -> RunSpec:
    return RunSpec(ModelSpec(model), scheme, "toy", "{}")


def test_a_weight_changed_in_place_changes_the_run_id(tmp_path, tiny_tokenizer_dir):
    folder = make_model_dir(tmp_path / "m", "llama", tiny_tokenizer_dir)
    before = spec(str(folder)).run_id
    model = tf.AutoModelForCausalLM.from_pretrained(folder)
    model.save_pretrained(folder)  # the same weights saved again: the same run
    assert spec(str(folder)).run_id == before
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[3, 5] += 0.25  # one weight re-trained
    model.save_pretrained(folder)
    after = spec(str(folder)).run_id
    assert after != before
    copy = shutil.copytree(folder, tmp_path / "copy")  # the same weights elsewhere: the fingerprint follows content
    assert model_weights_fingerprint(str(copy)) == model_weights_fingerprint(str(folder))


def test_the_embedded_model_has_a_stable_content_fingerprint():
    first = model_weights_fingerprint("embedded")
    assert first.startswith("sha256:") and model_weights_fingerprint("smollm2-135m") == first
    assert spec("embedded").run_id == spec("embedded").run_id


def table(path: Path, value: float, chash: str) -> Path:
    save_scale_table(
        path, ScaleTable(torch.full((2,), value), torch.full((2,), value), {"format": "fp8_e4m3", "config_hash": chash})
    )
    return path


def test_a_rewritten_scale_table_reruns_its_runs_only(tmp_path, tiny, tiny_llama_dir, toy_eval, capsys):
    chash = config_hash(tiny.model.config)
    a, b = table(tmp_path / "a.safetensors", 0.01, chash), table(tmp_path / "b.safetensors", 0.02, chash)
    schemes = [f"fp8_e4m3/tensor/static+scales={a}", f"fp8_e4m3/tensor/static+scales={b}", "fp8_e4m3/tensor/dynamic"]
    grid = tmp_path / "g.yaml"
    grid.write_text(
        f"name: scales\nmodels: ['{tiny_llama_dir}']\nschemes:\n"
        + "".join(f"  - '{s}'\n" for s in schemes)
        + "evals:\n  toy: {max_tokens: 16}\n"
    )
    out = tmp_path / "out"
    argv = ["sweep", str(grid), "--out", str(out), "--no-progress", "--cache-dir", str(tmp_path / "cache")]
    assert main(argv) == 0
    first = ResultStore(out).read().complete
    assert len(first) == 3
    assert main(argv) == 0 and "0 completed now" in capsys.readouterr().out  # nothing changed: all skipped
    table(a, 0.05, chash)  # same path, new content
    assert main(argv) == 0
    assert "1 completed now" in capsys.readouterr().out
    now = ResultStore(out).read().complete
    (new,) = set(now) - set(first)
    assert now[new]["scheme"] == schemes[0]
    rows = ResultStore(out).read().rows
    nll = {r["run_id"]: r["value"] for r in rows if r["metric"] == "nll" and not r["labels"]}
    (old,) = [i for i, rec in first.items() if rec["scheme"] == schemes[0]]
    assert nll[new] != nll[old]  # the new table's numbers, not the stale ones


def test_editing_config_or_chat_template_changes_the_run_id(tmp_path, tiny_tokenizer_dir):
    import json

    from evalkit.sweep.run_inputs import model_files_fingerprint

    folder = make_model_dir(tmp_path / "m", "llama", tiny_tokenizer_dir)
    weights = model_weights_fingerprint(str(folder))
    ids = [spec(str(folder)).run_id]
    config = folder / "config.json"
    cfg = json.loads(config.read_text())
    cfg["max_position_embeddings"] = int(cfg.get("max_position_embeddings", 2048)) * 2  # a longer context claimed
    config.write_text(json.dumps(cfg))
    ids.append(spec(str(folder)).run_id)
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    ids.append(spec(str(folder)).run_id)
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    )
    ids.append(spec(str(folder)).run_id)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    ids.append(spec(str(folder)).run_id)
    assert len(set(ids)) == len(ids), ids  # each edit a new run
    assert model_weights_fingerprint(str(folder)) == weights  # the weights did not move: the model files did
    copy = shutil.copytree(folder, tmp_path / "copy")
    assert model_files_fingerprint(str(copy)) == model_files_fingerprint(str(folder))  # content, not place


def test_the_embedded_model_adds_no_model_files_key():
    from evalkit.sweep.run_inputs import run_inputs

    # its GGUF (hashed as its weights) holds its config, tokenizer and chat template: run ids as before
    assert "model_files" not in run_inputs("embedded", "auto")
