"""Is a published store what this tree's code gives? Each completed run's recorded code identity against the
identity this tree gives a run of its scheme and evaluation (:func:`evalkit.sweep.code_identity.components`:
a bumped codec family or evaluation re-keys its own runs only, so a store may hold several identities, one
per component version, and only the runs of a bumped component need re-making)."""

from __future__ import annotations


def stale_runs(complete: list[dict]) -> list[str]:
    """``model scheme eval`` of each completed run whose recorded identity is not this tree's for it."""
    from evalkit.sweep.code_identity import code_identity, components

    out = []
    for r in complete:
        want = code_identity(components(r["scheme"], r["eval"]))
        if r["info"]["code"]["identity"] != want:
            out.append(f"{r['model']} {r['scheme']} {r['eval']}")
    return out
