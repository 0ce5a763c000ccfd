"""Model loading (embedded, local folder, remote-code gate) and the core CLI commands."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

from evalkit.cli import main
from evalkit.errors import EvalkitError
from evalkit.models.loading import load_model


def test_local_folder_loads_and_identity_is_exact(tiny_llama_dir):
    from evalkit import quantized_kv

    lm = load_model(str(tiny_llama_dir))
    assert lm.layout.num_layers == 2 and lm.layout.num_kv_heads == 2 and lm.tokenizer.pad_token is not None
    ids = lm.tokenizer("The quick brown fox", return_tensors="pt").input_ids
    with torch.no_grad():
        ref = lm.model(ids).logits
        with quantized_kv(lm.model, "auto"):
            assert torch.equal(lm.model(ids).logits, ref)


def test_missing_model_is_one_line_error(tmp_path):
    with pytest.raises(EvalkitError, match="no such folder: .*nowhere"):
        load_model(str(tmp_path / "nowhere"))


@pytest.mark.parametrize("name", ["./my-model", "~/no-such-evalkit-model", "/no/such/model"])
def test_path_like_model_is_a_folder(name):
    """A --model starting with '.', '/' or '~' is a folder, never an invalid hub id."""
    with pytest.raises(EvalkitError, match=f"^no such folder: {name} ") as info:
        load_model(name)
    assert "\n" not in str(info.value)


def test_existing_file_is_not_a_model_folder(tmp_path, monkeypatch):
    (tmp_path / "weights.bin").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EvalkitError, match="weights.bin is a file, not a model folder"):
        load_model("weights.bin")


@pytest.fixture
def unreachable_hub(monkeypatch):
    """Offline mode cleared and the hub pointed at a host that does not resolve, as on a machine
    without network where the user did not set HF_HUB_OFFLINE."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "https://hub.invalid")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delitem(sys.modules, "datasets", raising=False)  # its own offline flag would answer first


@pytest.mark.parametrize("offline_env", [True, False], ids=["HF_HUB_OFFLINE", "hub-unreachable"])
def test_uncached_hub_id_offline_fails_fast_with_one_line(offline_env, unreachable_hub, network_lookups, monkeypatch):
    if offline_env:
        from huggingface_hub import constants

        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(
        EvalkitError, match="'does/not-exist' is not in the local Hugging Face cache and the hub is unreachable"
    ) as info:
        load_model("does/not-exist")
    assert len(network_lookups) <= (0 if offline_env else 1), network_lookups  # one probe, no retry loop
    assert "\n" not in str(info.value)


def test_cached_hub_id_loads_offline_from_the_cache(tiny_llama_dir, tmp_path, unreachable_hub, monkeypatch):
    """A hub id in the local cache loads without the network (local files only, no retries)."""
    from huggingface_hub import constants

    from evalkit.models.loading import model_source

    snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / ("0" * 40)
    snapshot.parent.mkdir(parents=True)
    shutil.copytree(tiny_llama_dir, snapshot)
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert model_source("acme/tiny") == ("acme/tiny", True)


@pytest.mark.parametrize("command", ["run", "sensitivity"])
def test_bad_model_at_the_cli_is_one_line_and_fast(command, tmp_path):
    """--model is checked before the command imports torch and its evaluations: the whole process,
    interpreter start included, ends in well under 5 s with one line and exit code 2."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    for model, fragment in (
        ("./my-model", "no such folder: ./my-model"),
        ("does/not-exist", "not in the local Hugging Face cache"),
    ):
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "evalkit", command, "--model", model],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
            env=env,
        )
        elapsed = time.perf_counter() - start
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and fragment in lines[0], proc.stderr
        assert "Retrying" not in proc.stderr and elapsed < 5


def test_remote_code_needs_the_flag(tmp_path, tiny_llama_dir):
    """A config that names custom code is refused unless trust_remote_code is passed."""
    import json
    import shutil

    folder = tmp_path / "custom"
    shutil.copytree(tiny_llama_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = {
        "AutoConfig": "modeling_custom.CustomConfig",
        "AutoModelForCausalLM": "modeling_custom.CustomForCausalLM",
    }
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
    assert "Rome" in embedded.tokenizer.decode(out[0, ids.shape[1] :])


def test_schemes_command_lists_bytes(capsys):
    assert main(["schemes"]) == 0
    out = capsys.readouterr().out
    assert "fp8_e4m3" in out and "block<N>" in out and "unit" in out
    assert "1.004" in out  # block16 on head_dim 64: 1 + 4 / (16 * 64)


def test_models_command(capsys, tmp_path, monkeypatch):
    cache = tmp_path / "evalkit-cache"
    (cache / "work").mkdir(parents=True)
    (cache / "work" / "baseline.bin").write_bytes(b"x" * 2500)
    monkeypatch.setenv("EVALKIT_CACHE", str(cache))
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m" in out
    assert f"cache: {cache}  2.4 KiB (work 2.4 KiB)" in out and "EVALKIT_CACHE" in out  # 2500 B, binary units


# ---- start-up: the light commands never import transformers or lm-eval -------------------------

_HEAVY = ("transformers", "lm_eval")


def _imported_after(code: str) -> list[str]:
    probe = f"import sys, contextlib, io\n{code}\nprint(','.join(m for m in {_HEAVY!r} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return [m for m in proc.stdout.strip().splitlines()[-1].split(",") if m] if proc.stdout.strip() else []


def test_parser_builds_without_transformers_or_lm_eval():
    assert _imported_after("from evalkit.cli import build_parser\nbuild_parser()") == []


@pytest.mark.parametrize("argv", [["--help"], ["schemes"], ["models"], ["capacity", "--preset", "llama-3.1-8b"]])
def test_light_commands_do_not_import_transformers_or_lm_eval(argv):
    code = (
        "from evalkit.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    try:\n        main({argv!r})\n    except SystemExit:\n        pass"
    )
    assert _imported_after(code) == []


def test_help_lists_every_command_with_its_own_help():
    """`--help` shows each command by its help in COMMANDS without importing it; the command's own
    parser says the same (modules pass help=COMMANDS[name], never a second copy of the text)."""
    from evalkit.cli import COMMANDS, build_parser

    full = build_parser()
    shown = {a.dest: a.help for a in full._subparsers._group_actions[0]._choices_actions}
    assert shown == COMMANDS
    light = build_parser("")
    assert {a.dest: a.help for a in light._subparsers._group_actions[0]._choices_actions} == COMMANDS


@pytest.mark.parametrize(
    "scheme, fragment", [("fp9/tensor/dynamic", "unknown KV format"), ("fp8_e4m3/block0/dynamic", "positive")]
)
def test_bad_scheme_at_the_cli_exits_2_with_one_line(scheme, fragment):
    proc = subprocess.run(
        [sys.executable, "-m", "evalkit", "run", "--schemes", scheme], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in proc.stderr
