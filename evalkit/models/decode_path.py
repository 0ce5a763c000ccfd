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
# The static-shape paths' own numbers version (a component of the run id, evalkit.sweep.code_identity): 1: every
# static cache a multiple of 16 positions and lengths padded to shape buckets (evalkit.integration.compile_cache),
# which moves their logits at float rounding against the unaligned cache (the eager path is untouched)
STATIC_NUMERICS = 1


def resolve_decode_path(setting: str, device) -> str:
    """``auto`` -> ``compiled`` on CUDA, ``eager`` elsewhere; the others as they are (one-line error otherwise)."""
    if setting not in DECODE_PATHS:
        raise EvalkitError(f"decode path {setting!r} is not one of {', '.join(DECODE_PATHS)}: pick one of them")
    if setting == "auto":
        return "compiled" if str(device).startswith("cuda") else "eager"
    return setting
