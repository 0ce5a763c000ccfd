"""Modules that register more of what evalkit knows: evaluations, engines, KV codec families.

Each registry (:mod:`evalkit.evals.registry`, :mod:`evalkit.engines.registry`, :mod:`evalkit.kv.codec`)
takes the modules named in an environment variable (comma-separated: ``EVALKIT_EVALS``,
``EVALKIT_ENGINES``, ``EVALKIT_CODECS``) and in an entry-point group of the installed packages
(``evalkit.evals``, ``evalkit.engines``, ``evalkit.codecs``), and imports each once; a module registers
what it declares as it is imported. It lives on the bottom floor so that a registry on any floor can use
it; it imports nothing of evalkit's but the error type.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable

from evalkit.errors import EvalkitError


def entry_points_of(*groups: str) -> dict[str, list]:
    """group -> its entry points among the installed distributions, for each of ``groups``, from one scan of
    their metadata (a broken distribution's metadata: none)."""
    try:
        from importlib.metadata import entry_points

        found = entry_points()
        return {group: list(found.select(group=group)) for group in groups}
    except Exception:  # noqa: BLE001  (a broken installed distribution's metadata: no entry-point plugins)
        return {group: [] for group in groups}


def plugin_modules(env: str, group: str, skip: Iterable[str] = (), entries: list | None = None) -> list[str]:
    """The modules named in ``$env`` (comma-separated), then the modules of the entry-point group ``group``
    (``entries``: its entry points when already read), but those of the entry points named in ``skip``."""
    names = [m.strip() for m in os.environ.get(env, "").split(",") if m.strip()]
    found = entry_points_of(group)[group] if entries is None else entries
    return names + [ep.value.partition(":")[0] for ep in found if ep.name not in skip]


def import_once(modules: Iterable[str], loaded: set[str], what: str, origin: str) -> None:
    """Import each of ``modules`` not in ``loaded`` yet and add it there; one that cannot be imported is an
    EvalkitError naming it (``what``: the kind of module, ``origin``: where its name came from)."""
    for module in modules:
        if module in loaded:
            continue
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise EvalkitError(
                f"{what} module {module!r} ({origin}) cannot be imported ({type(exc).__name__}: {exc}): "
                "fix the name or install it"
            ) from None
        loaded.add(module)
