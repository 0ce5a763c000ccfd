"""User-facing errors.

Every problem a user can cause (a bad scheme string, a missing scale file, an unknown corpus, an
unsupported architecture) raises :class:`EvalkitError` with one line that names the problem and
the fix. The command line prints that line and exits with code 2; it never shows a traceback for
these. Programming errors stay ordinary exceptions so they are not hidden.
"""

from __future__ import annotations


class EvalkitError(Exception):
    """A one-line, actionable error caused by the user's input or environment."""

    exit_code = 2

    def __init__(self, message: str):
        if "\n" in message:
            message = " ".join(part.strip() for part in message.splitlines() if part.strip())
        super().__init__(message)


class SchemeError(EvalkitError):
    """A KV scheme string or value that cannot be used."""


class ScaleError(EvalkitError):
    """A static scale table that is missing, malformed, or belongs to another model."""


class UnsupportedModelError(EvalkitError):
    """A model whose attention evalkit cannot intercept."""


class NonFiniteKVError(EvalkitError):
    """NaN or inf values reached the KV cache."""


class PreflightError(EvalkitError):
    """An output location this machine cannot write, or a device it does not have (evalkit.sweep.preflight)."""


class EngineUnavailableError(EvalkitError):
    """A serving engine evalkit is asked to run (vLLM) that is not installed or cannot run on this machine."""
