"""Model loading (embedded, local folder, remote-code gate) and the core CLI commands."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from evalkit.cli import main
from evalkit.errors import EvalkitError
from evalkit.models import load_model


def test_local_folder_loads_and_identity_is_exact(tiny_llama_dir):
    from evalkit import quantized_kv

    lm = load_model(str(tiny_llama_dir))
    assert lm.layout.num_layers == 2 and lm.layout.num_kv_heads == 2 and lm.tokenizer.pad_token is not None
    ids = lm.tokenizer("The quick brown fox", return_tensors="pt").input_ids
    with torch.no_grad():
        ref = lm.model(ids).logits
        with quantized_kv(lm.model, "bf16"):
            assert torch.equal(lm.model(ids).logits, ref)


def test_missing_model_is_one_line_error(tmp_path):
    with pytest.raises(EvalkitError, match="could not load model"):
        load_model(str(tmp_path / "nowhere"))


def test_remote_code_needs_the_flag(tmp_path, tiny_llama_dir):
    """A config that names custom code is refused unless trust_remote_code is passed."""
    import json
    import shutil

    folder = tmp_path / "custom"
    shutil.copytree(tiny_llama_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "modeling_custom.CustomConfig", "AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"}
    cfg["model_type"] = "custom_remote"
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "modeling_custom.py").write_text("raise RuntimeError('remote code ran')\n")
    with pytest.raises(EvalkitError, match="--trust-remote-code"):
        load_model(str(folder))


@pytest.mark.slow
def test_embedded_model_loads_fast_and_is_sane(embedded):
    t = time.perf_counter()
    again = load_model("embedded")
    elapsed = time.perf_counter() - t
    assert elapsed < 10  # < 2 s on an idle machine; generous here because tests share the CPU
    layout = again.layout
    assert (layout.model_type, layout.num_layers, layout.num_kv_heads, layout.head_dim) == ("llama", 30, 3, 64)
    ids = embedded.tokenizer("The capital of France is Paris. The capital of Italy is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = embedded.model.generate(ids, max_new_tokens=2, do_sample=False)
    assert "Rome" in embedded.tokenizer.decode(out[0, ids.shape[1]:])


def test_schemes_command_lists_bytes(capsys):
    assert main(["schemes"]) == 0
    out = capsys.readouterr().out
    assert "fp8_e4m3" in out and "block<N>" in out and "unit" in out
    assert "1.004" in out  # block16 on head_dim 64: 1 + 4 / (16 * 64)


def test_models_command(capsys):
    assert main(["models"]) == 0
    assert "smollm2-135m" in capsys.readouterr().out


@pytest.mark.parametrize("scheme, fragment", [("fp9/tensor/dynamic", "unknown KV format"), ("fp8_e4m3/block0/dynamic", "positive")])
def test_bad_scheme_at_the_cli_exits_2_with_one_line(scheme, fragment):
    proc = subprocess.run([sys.executable, "-m", "evalkit", "run", "--schemes", scheme], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in proc.stderr
