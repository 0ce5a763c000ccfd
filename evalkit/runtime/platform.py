"""The platform of one computation as a key and in words: the record :func:`evalkit.runtime.numerics.platform_record`
makes (CPU, instruction set, MKL mode, batch-invariant products), with the device, the torch and transformers
versions and, for a run an engine computed, the engine's package, version and attention backend beside it.

The report groups a store's runs by :func:`platform_key` and prints :func:`describe` of each
(:mod:`evalkit.report.platform`); an engine's conformance report prints :func:`describe_info` of its own run.
It reads dicts only, so a layer at any floor can say where a number was computed.
"""

from __future__ import annotations

PLATFORM_KEYS = ("cpu", "cpu_id", "machine", "cpu_capability", "mkl", "mkl_cbwr")  # as runtime.numerics.same_platform
VERSION_KEYS = ("torch", "transformers")
ENGINE_KEYS = ("engine_package", "engine_version", "attention_backend")


def platform_key(info: dict, engine: dict | None = None) -> tuple:
    """What decides the floats of one run, as a hashable key (missing fields are None)."""
    p = info.get("platform") if isinstance(info.get("platform"), dict) else {}
    v = info.get("versions") if isinstance(info.get("versions"), dict) else {}
    e = engine or {}
    return (
        tuple(p.get(k) for k in PLATFORM_KEYS),
        p.get("blas_batch_invariant"),
        str(info.get("device") or "cpu"),
        tuple(v.get(k) for k in VERSION_KEYS),
        tuple(e.get(k) for k in ENGINE_KEYS) if e else None,
    )


def describe(key: tuple) -> str:
    """A platform key in words: CPU, BLAS mode, device, library versions, engine."""
    (cpu, cpu_id, machine, capability, mkl, cbwr), invariant, device, (torch, transformers), engine = key
    where = f"CPU {cpu} [{cpu_id or machine}], {capability}"
    blas = (f"MKL, MKL_CBWR={cbwr or 'unset'}" if mkl else "BLAS without MKL") + (
        ", batch-invariant products" if invariant else ", products NOT batch-invariant" if invariant is False else ""
    )
    text = (
        f"{where}; {blas}"
        + ("" if device == "cpu" else f"; device {device}")
        + f"; torch {torch}, transformers {transformers}"
    )
    if engine:
        package, version, backend = engine
        text += f"; engine {package}" + (f" {version}" if version else "") + (f" ({backend})" if backend else "")
    return text


def describe_info(info: dict, engine: dict | None = None) -> str:
    """The platform of one computation in words, from an info dict as runs record it (``platform``:
    :func:`evalkit.runtime.numerics.platform_record`; ``versions``; ``device``) and the engine's keys
    (:data:`ENGINE_KEYS`): what ``evalkit conformance`` prints of its own run."""
    if not isinstance(info.get("platform"), dict):
        return "not recorded (written by an evalkit that did not record one)"
    return describe(platform_key(info, engine))
