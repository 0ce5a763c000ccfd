"""Imports follow use: the core, the storage path and the model loaders run without lm-eval, datasets
and gguf (the GPU machine's image has none of them), and a command that needs one that is missing
says so in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

BLOCK = "import sys\nfor name in ('lm_eval', 'datasets', 'gguf'):\n    sys.modules[name] = None\n"


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True, timeout=600)


def test_storage_path_runs_without_lm_eval_datasets_gguf():
    out = run_python(
        "import torch\n"
        "from evalkit import quantized_kv\n"
        "from tests.tiny_models import tiny_model\n"
        "model = tiny_model('llama')\n"
        "ids = torch.randint(0, 100, (2, 9))\n"
        "with torch.inference_mode(), quantized_kv(model, 'fp8_e4m3/head/dynamic') as s:\n"
        "    assert torch.isfinite(model(ids).logits).all()\n"
        "import evalkit.models.loading, evalkit.kv.memory, evalkit.kv.scale_table, evalkit.integration.observe\n"
        "print('OK', sorted(m for m in ('lm_eval', 'datasets', 'gguf') if sys.modules.get(m) is not None))\n"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("OK []")


@pytest.mark.parametrize(
    "argv, package",
    [
        (
            ["run", "--eval", "lmeval", "--schemes", "auto", "--lmeval-tasks", "evalkit_mmlu4", "--lmeval-limit", "1"],
            "lm-eval",
        ),
    ],
)
def test_a_command_needing_a_missing_package_says_so_in_one_line(tmp_path, argv, package):
    out = run_python(f"from evalkit.cli import main\nsys.exit(main({argv + ['--out', str(tmp_path / 'out')]!r}))\n")
    lines = [line for line in out.stderr.splitlines() if line.startswith("evalkit: error:")]
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and len(lines) == 1
    assert f"needs {package}" in lines[0] and "pip install" in lines[0]
