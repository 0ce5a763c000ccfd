"""What the vLLM engine tests share: whether vLLM can run here (their skip mark, with the reason
printed once)."""

from __future__ import annotations

import pytest

from evalkit.errors import EngineUnavailableError


def _vllm_missing() -> str | None:
    try:
        from evalkit.engines.vllm_kernel import check_vllm_available

        check_vllm_available()
    except EngineUnavailableError as exc:
        return str(exc)
    return None


MISSING = _vllm_missing()
if MISSING:
    print(f"\nvLLM engine tests skipped: {MISSING}")
needs_vllm = pytest.mark.skipif(MISSING is not None, reason=f"needs vLLM: {MISSING}")
