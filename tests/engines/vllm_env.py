"""What the vLLM engine tests share: whether vLLM can run here (their skip mark, with the reason
printed once) and the check that a command line refuses in one line with exit 2."""

from __future__ import annotations

import pytest

from evalkit.cli import main
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


def one_line_exit_2(argv, capsys, *needles):
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("evalkit: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err
