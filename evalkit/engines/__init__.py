"""Serving engines as evalkit models them: their KV-cache kernels' formats, scales and rounding
(:mod:`evalkit.engines.profiles`)."""

from evalkit.engines.profiles import PROFILES, EngineProfile, Fact, KVDtype, apply_profile, get_profile

__all__ = ["PROFILES", "EngineProfile", "Fact", "KVDtype", "apply_profile", "get_profile"]
