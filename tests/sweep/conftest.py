"""Fixtures of the sweep tests: the ``generation`` stand-in the gpu preset's tests register while this
branch has no generation evaluation (tests/sweep/generation_standin.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def generation_standin(monkeypatch):
    """Register the test-only ``generation`` stand-in unless a real ``generation`` evaluation exists."""
    from evalkit.evals import base
    from evalkit.evals.registry import _builtin

    if "generation" not in _builtin():
        from tests.sweep.generation_standin import STANDIN_PATH

        monkeypatch.setitem(base._REGISTRY, "generation", STANDIN_PATH)
