"""How a model's decode steps run: the names of the decode paths and how ``auto`` resolves.

A model setting beside its device and dtype (``--decode-path``, ``--no-compile``, a grid model's
``decode_path:``), used by the decode-bound evaluations through
:mod:`evalkit.integration.static_decode`: ``eager`` (the dynamic storage cache), ``static`` (a
static-shape storage cache, eager steps) or ``compiled`` (that step under ``torch.compile``, CUDA
graphs on CUDA). ``auto`` is ``compiled`` on CUDA and ``eager`` elsewhere.
"""

from __future__ import annotations

from evalkit.errors import EvalkitError

DECODE_PATHS = ("auto", "eager", "static", "compiled")


def resolve_decode_path(setting: str, device) -> str:
    """``auto`` -> ``compiled`` on CUDA, ``eager`` elsewhere; the others as they are (one-line error otherwise)."""
    if setting not in DECODE_PATHS:
        raise EvalkitError(f"decode path {setting!r} is not one of {', '.join(DECODE_PATHS)}: pick one of them")
    if setting == "auto":
        return "compiled" if str(device).startswith("cuda") else "eager"
    return setting
