"""The thin layer evalkit uses to run llama.cpp itself (through llama-cpp-python's low-level ctypes API):
whether it is there, the library initialised once, and its version.

Why a layer of its own: evalkit holds its own KV-cache emulation against llama.cpp's real cache, so it needs
exactly what llama.cpp computes, with every setting that changes the numbers written down. The layer is
four small modules above this one: :mod:`~evalkit.engines.llamacpp.cache_types` (the cache-type whitelist,
its refusals, ggml's row sizes), :mod:`~evalkit.engines.llamacpp.llama_log` (the one log callback, what is
read back from it), :mod:`~evalkit.engines.llamacpp.model` (a GGUF loaded once, CPU only) and
:mod:`~evalkit.engines.llamacpp.context` (one context per cache pair: logits, greedy generation,
teacher-forced decode steps, the KV allocation). :func:`require` imports ``llama_cpp`` only when called,
never at import.
"""

from __future__ import annotations

import importlib.util

from evalkit.engines.llamacpp.llama_log import LOG
from evalkit.errors import EvalkitError

INSTALL_HINT = (
    "llama.cpp is not installed: pip install -e '.[llamacpp]' (builds llama-cpp-python from source, about 5 min)"
)


def installed() -> bool:
    """Whether llama-cpp-python is importable (without importing it)."""
    return importlib.util.find_spec("llama_cpp") is not None


_state: dict = {}


def require():
    """The ``llama_cpp`` module, with its backend initialised and evalkit's quiet log callback set."""
    if "lib" in _state:
        return _state["lib"]
    try:
        import llama_cpp
    except (ImportError, OSError) as exc:
        raise EvalkitError(
            f"{INSTALL_HINT} [{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}]"
        ) from exc
    llama_cpp.llama_backend_init()
    LOG.install(llama_cpp)
    _state["lib"] = llama_cpp
    return llama_cpp


def version() -> str:
    """``"llama-cpp-python 0.3.36"``."""
    try:
        from importlib.metadata import version as dist_version

        return f"llama-cpp-python {dist_version('llama_cpp_python')}"
    except Exception:
        return f"llama-cpp-python {require().__version__}"


def loaded():
    """The ``llama_cpp`` module if :func:`require` has loaded it, else None (for closing handles late, at exit)."""
    return _state.get("lib")


class Closing:
    """A llama.cpp handle's lifetime: :meth:`close` on leaving a ``with`` block and when collected (errors at
    interpreter exit ignored). The model and its contexts are both."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
