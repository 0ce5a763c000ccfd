"""What computed a store's numbers besides evalkit's code: one line for the report, and a warning
when that differs from the published store.

A quantized forward amplifies float rounding (:mod:`evalkit.runtime.numerics`): the same run on
another processor, instruction set or BLAS mode, or with another torch or transformers, gives
other FP8 numbers, by more than some differences between schemes. So a report says where its
numbers come from: from each counted run's completion record, the CPU (model and
vendor/family/model/stepping), the instruction set torch dispatched to, MKL's reproducibility mode
and whether matrix products were batch-invariant, the device for GPU runs, the torch and
transformers versions, and the engine where one computed the log-probs (a row ``backend`` other
than ``emulation``, with the ``engine*`` keys of its info: e.g. ``evalkit run --engine vllm``). :func:`platform_lines` gives one line per distinct
platform (with its run count); :func:`describe_info` the platform of one computation.

:func:`published_warnings` compares the store with the published one (``published/default`` of
the source checkout, the store the README's table is made from): a store computed elsewhere gets
a WARNING naming what differs, because its numbers and the published ones then differ partly by
float-rounding noise. Outside a checkout (an installed package) there is no published store to
compare with and nothing is said.
"""

from __future__ import annotations

import json
from pathlib import Path

from evalkit.report.results import RESULTS_FILE, Results

PLATFORM_KEYS = ("cpu", "cpu_id", "machine", "cpu_capability", "mkl", "mkl_cbwr")  # as runtime.numerics.same_platform
VERSION_KEYS = ("torch", "transformers")
ENGINE_KEYS = ("engine_package", "engine_version", "attention_backend")


def published_store() -> Path | None:
    """The published store of the source checkout evalkit runs from (None from an installed copy)."""
    from evalkit.data.resources import source_root

    root = source_root()
    store = root / "published" / "default" if root is not None else None
    return store if store is not None and (store / RESULTS_FILE).is_file() else None


def _key(info: dict, engine: dict | None = None) -> tuple:
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


def _engines(results: Results) -> dict[str, dict]:
    """run_id -> the engine keys of its rows' info, for runs whose log-probs an engine computed."""
    out: dict[str, dict] = {}
    for run_id, info in zip(results.rows["run_id"], results.rows["info"]):
        if run_id in out or not isinstance(info, dict):
            continue
        backend = info.get("backend")  # evalkit.evals.backend stamps every row; "emulation" is evalkit's own
        if info.get("engine") or backend not in (None, "emulation"):
            out[run_id] = {
                "engine_package": info.get("engine_package") or info.get("engine") or backend,
                **{k: info.get(k) for k in ENGINE_KEYS[1:]},
            }
    return out


def platforms(results: Results) -> dict[tuple, int]:
    """Platform key -> number of counted runs computed on it (runs that recorded a platform)."""
    engines = _engines(results)
    counts: dict[tuple, int] = {}
    for run_id, rec in results.complete.items():
        info = rec.get("info") or {}
        if isinstance(info.get("platform"), dict):
            key = _key(info, engines.get(run_id))
            counts[key] = counts.get(key, 0) + 1
    return counts


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
    return describe(_key(info, engine))


def platform_lines(results: Results) -> list[str]:
    """``Platform: ...`` lines, one per distinct platform of the counted runs (none recorded: one line saying so)."""
    counts = platforms(results)
    if not counts:
        return ["Platform: not recorded (runs written by an evalkit that did not record one)"]
    many = len(counts) > 1
    return [
        f"Platform: {describe(key)}" + (f" ({n} runs)" if many else "")
        for key, n in sorted(counts.items(), key=lambda kv: -kv[1])
    ]


def _published_keys(store: Path) -> set[tuple]:
    keys = set()
    with open(store / RESULTS_FILE) as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if (
                isinstance(rec, dict)
                and rec.get("type") == "complete"
                and isinstance((rec.get("info") or {}).get("platform"), dict)
            ):
                keys.add(_key(rec["info"]))
    return keys


def _differences(key: tuple, published: tuple) -> list[str]:
    names = ("CPU", "BLAS batch invariance", "device", "torch/transformers")
    parts = []
    for name, mine, theirs in zip(names, key[:4], published[:4]):
        if mine != theirs:
            if name == "CPU":
                fields = [f"{k} {a} vs {b}" for k, a, b in zip(PLATFORM_KEYS, mine, theirs) if a != b]
                parts.append(", ".join(fields))
            elif name == "torch/transformers":
                parts.append(", ".join(f"{k} {a} vs {b}" for k, a, b in zip(VERSION_KEYS, mine, theirs) if a != b))
            else:
                parts.append(f"{name} {mine} vs {theirs}")
    return parts


def published_warnings(results: Results, published: Path | None = None) -> list[str]:
    """A WARNING per distinct difference from the published store's platform (empty when they
    match, when the store is the published one, or when there is no published store)."""
    published = published_store() if published is None else published
    if published is None or Path(results.folder).resolve() == Path(published).resolve():
        return []
    theirs = _published_keys(published)
    if len(theirs) != 1:
        return []  # a published store from several platforms has no one platform to compare with
    (pub,) = theirs
    out = []
    for key in platforms(results):
        diff = _differences(key, pub)
        if diff:
            line = (
                f"WARNING: these numbers were computed on another platform than the published store "
                f"(published/{published.name}: {describe(pub)}): {'; '.join(diff)}. A quantized forward amplifies float "
                "rounding, so differences from the published rows are partly numerical noise"
            )
            if line not in out:  # platforms differing only by engine differ from the published one alike
                out.append(line)
    return out


def report_lines(results: Results) -> list[str]:
    """What the report prints about the platform: its lines, then any warning."""
    return platform_lines(results) + published_warnings(results)
