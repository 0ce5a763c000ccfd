"""Serving engines as evalkit models them: their KV-cache kernels' formats, scales and rounding
(:mod:`evalkit.engines.profiles`).

The package itself imports nothing: an engine's light modules (its declaration, an evaluation's flags)
are read without the profiles, which import the KV formats and so torch. The names below are resolved when
first asked for: the profile's classes from :mod:`evalkit.engines.profiles`, the table of every engine's
profiles from :mod:`evalkit.engines.registry`.
"""

__all__ = ["PROFILES", "EngineProfile", "Fact", "KVDtype", "apply_profile", "get_profile"]
_REGISTRY_NAMES = ("PROFILES", "apply_profile", "get_profile")


def __getattr__(name: str):
    if name in __all__:
        from evalkit.engines import profiles, registry

        return getattr(registry if name in _REGISTRY_NAMES else profiles, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
