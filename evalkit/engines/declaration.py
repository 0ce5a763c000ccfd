"""What an engine declares about its KV cache, and the one check that reads the declaration.

vLLM's attention backends say, as class data, which ``kv_cache_dtype`` values they take
(``supported_kv_cache_dtypes``), and one ``validate_configuration`` reads that data; nothing below
them names a dtype. evalkit's engines do the same. Each engine's folder (``evalkit/engines/<name>/``)
declares one :class:`~evalkit.engines.registry.Engine` that holds

- its devices, and per released version (:class:`EngineVersion`) the devices it runs on and the
  ``kv_cache_dtype`` values its flag accepts, each with the evalkit scheme that models it, or the one
  line saying why none does (:class:`CacheType`), and the source it was read in;
- the names a later version gave an earlier dtype (``renamed``), so an old name is refused in one line
  that names the new one;
- its engine profiles (:mod:`evalkit.engines.profiles`) and its codec family's prefix
  (:mod:`evalkit.kv.codec`).

The validator (:func:`device_problems`, :func:`cache_type`, :func:`scheme_problems`) is the only code
that reads these facts to accept or refuse: a grid's or a run's models on a device the engine does not
declare, a ``kv_cache_dtype`` its version does not take, a scheme none of its dtypes maps to.
"""

from __future__ import annotations

from dataclasses import dataclass

from evalkit.errors import SchemeError


@dataclass(frozen=True)
class CacheType:
    """One value of an engine's ``kv_cache_dtype`` flag: the evalkit scheme that models its store (None:
    not modelled, ``note`` says why), what it stores, and where that was read."""

    name: str
    scheme: str | None
    note: str = ""
    source: str = ""

    @property
    def modelled(self) -> bool:
        return self.scheme is not None


@dataclass(frozen=True)
class EngineVersion:
    """One released version (``0.5.23``; a ``major.minor`` covers its patch releases): the devices it
    runs on, the ``kv_cache_dtype`` values it accepts, and ``renamed`` ``(old, new)`` pairs: dtypes an
    earlier version took under another name."""

    version: str
    devices: tuple[str, ...]
    kv_cache_dtypes: tuple[CacheType, ...]
    renamed: tuple[tuple[str, str], ...] = ()

    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.kv_cache_dtypes)


def version_of(engine, version: str | None = None) -> EngineVersion:
    """``engine``'s declared version ``version`` (default: the first declared, its newest); SchemeError,
    one line, for one it does not declare."""
    if not engine.versions:
        raise SchemeError(f"engine {engine.name} declares no versions and no kv_cache_dtype values")
    if version is None:
        return engine.versions[0]
    for v in engine.versions:
        if version == v.version or version.startswith(v.version + "."):
            return v
    declared = ", ".join(v.version for v in engine.versions)
    raise SchemeError(f"engine {engine.name} declares versions {declared}, not {version}: use one of them")


def cache_type(engine, name: str, version: str | None = None) -> CacheType:
    """The ``kv_cache_dtype`` ``name`` as ``engine``'s ``version`` declares it; SchemeError, one line, for a
    name that version does not take (naming the one that replaced it where it was renamed)."""
    v = version_of(engine, version)
    for d in v.kv_cache_dtypes:
        if d.name == name:
            return d
    new = dict(v.renamed).get(name)
    if new is not None:
        raise SchemeError(
            f"{engine.name} {v.version} has no kv_cache_dtype {name}: it takes {new} instead (--kv-cache-dtype {new})"
        )
    raise SchemeError(f"{engine.name} {v.version} has no kv_cache_dtype {name}: use one of {', '.join(v.names())}")


def device_problems(engine, models) -> list[tuple[tuple, str]]:
    """``(key, message)`` for each model on a device ``engine`` does not declare (``cuda:1`` is ``cuda``)."""
    out = []
    for i, m in enumerate(models):
        kind = str(m.device).split(":")[0]
        if kind not in engine.devices:
            out.append(
                (
                    ("models", i),
                    f"engine {engine.name} runs on {' or '.join(engine.devices)}, not {m.device}: "
                    f"run {m.name} on device {engine.devices[0]}",
                )
            )
    return out


def declared_schemes(engine, version: str | None = None) -> dict[str, str]:
    """Canonical scheme -> the ``kv_cache_dtype`` that runs it, for ``engine``'s modelled dtypes (the first
    dtype of a scheme two names share)."""
    from evalkit.kv.scheme import parse_scheme

    out: dict[str, str] = {}
    for d in version_of(engine, version).kv_cache_dtypes:
        if d.modelled:
            out.setdefault(str(parse_scheme(d.scheme)), d.name)
    return out


def scheme_problems(engine, schemes, version: str | None = None) -> tuple[list, list[str]]:
    """(the schemes ``engine`` runs, each once; one message for each it does not), ``schemes`` being
    :class:`~evalkit.kv.scheme.Scheme` values: a scheme runs when one of the version's declared
    ``kv_cache_dtype`` values maps to it."""
    runs = declared_schemes(engine, version)
    ok, problems = [], []
    for scheme in schemes:
        canonical = str(scheme)
        if canonical in runs:
            ok.append(scheme)
        else:
            listed = ", ".join(f"{s} (kv_cache_dtype {n})" for s, n in runs.items())
            problems.append(f"engine {engine.name} cannot run {canonical}: its kv_cache_dtypes run {listed}")
    return list(dict.fromkeys(ok)), problems
