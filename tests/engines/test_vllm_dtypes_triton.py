"""vLLM's per-token-head Triton store run by Triton's interpreter (the real triton, loaded without
touching the installed vLLM) against evalkit's encoder: INT8 codes and float32 scales equal, every
one; FP8 codes held to round-to-nearest-even, each difference in a named class."""

from __future__ import annotations

import sys

import pytest

from evalkit.cli import main

from tests.cli_checks import one_line_exit_2
from tests.engines.vllm_env import needs_vllm


def test_triton_kernel_takes_only_the_triton_stored_dtypes(capsys):
    one_line_exit_2(
        ["conformance", "--engine", "vllm", "--kernel", "triton", "--schemes", "vllm:fp8"],
        capsys,
        "--kernel triton",
        "vllm:int8_per_token_head",
    )


@needs_vllm
@pytest.mark.slow
def test_per_token_head_store_through_the_interpreter_equals_evalkit(capsys):
    from evalkit.engines.vllm.triton_store import FP8_CLASSES, conformance

    before = sys.modules.get("vllm.triton_utils")
    int8, fp8 = conformance(("int8_per_token_head", "fp8_per_token_head"))
    assert sys.modules.get("vllm.triton_utils") is before  # vLLM's own module is left as it was
    assert int8.codes_equal == int8.values == 65536 and int8.scales == fp8.scales == 1024
    for r in (int8, fp8):  # the interpreter divides; the compiled kernel, and evalkit, multiply by fl(1/QUANT_MAX)
        assert r.scales_equal + r.scale_classes.get("interpreter_divides", 0) == r.scales, r
        assert set(r.scale_classes) == {"interpreter_divides"}, r.scale_classes
    assert fp8.codes_equal + sum(fp8.classes.values()) == fp8.values
    assert set(fp8.classes) <= set(FP8_CLASSES) - {"other"}, fp8.classes
    assert fp8.codes_equal / fp8.values > 0.95
    capsys.readouterr()
    assert main(["conformance", "--engine", "vllm", "--kernel", "triton", "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert "| int8_per_token_head | 971/1024 (interpreter_divides 53) | 65536/65536 (100.00 %) | - |" in out
