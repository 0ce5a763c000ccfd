"""DeepSeek V3.2's fp8_ds_mla cache writer (deepseek_v32/common/kernels.py, Triton) run by Triton's
interpreter against evalkit.kv.codecs.vllm.ds_mla: float32 tile scales equal, every one; E4M3 codes held to
round-to-nearest-even and bf16 RoPE values to nearest even, each difference in a named class."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.engines.vllm_env import needs_vllm


@needs_vllm
@pytest.mark.slow
def test_fp8_ds_mla_writer_through_the_interpreter_equals_evalkit():
    from evalkit.engines.vllm.triton_ds_mla import CLASSES, TOKENS
    from evalkit.engines.vllm.triton_store import FP8_CLASSES

    env = {**os.environ, "TRITON_INTERPRET": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "evalkit.engines.vllm.triton_ds_mla", "0"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["scales_equal"] == r["scales"] == 4 * TOKENS
    assert r["values"] == TOKENS * (512 + 64)
    assert r["codes_equal"] + sum(r["classes"].values()) == r["values"]
    assert set(r["classes"]) <= (set(FP8_CLASSES) - {"other"}) | set(CLASSES), r["classes"]
    latent_differ = sum(n for k, n in r["classes"].items() if k != "bf16_truncated")
    assert latent_differ / (TOKENS * 512) < 0.05, r
