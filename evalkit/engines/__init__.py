"""Serving engines as evalkit models them: their KV-cache kernels' formats, scales and rounding
(:mod:`evalkit.engines.profiles`).

The package itself imports nothing: an engine's light modules (its declaration, an evaluation's flags)
are read without the profiles, which import the KV formats and so torch. The profile names below are
resolved from :mod:`evalkit.engines.profiles` when first asked for.
"""

__all__ = ["PROFILES", "EngineProfile", "Fact", "KVDtype", "apply_profile", "get_profile"]


def __getattr__(name: str):
    if name in __all__:
        from evalkit.engines import profiles

        return getattr(profiles, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
