"""Named grids: where ``default``, ``quick`` and the other grids named on the command line are found
(``$EVALKIT_SWEEPS``, then evalkit's ``sweeps/`` folder)."""

from __future__ import annotations

from pathlib import Path

from evalkit.sweep.located_yaml import GridError


# -- named grids -------------------------------------------------------------------------------
def grid_dirs() -> list[Path]:
    """Where named grids (``default``, ``quick``) are looked up, in order: ``$EVALKIT_SWEEPS``, then
    evalkit's ``sweeps/`` folder (the checkout's, or the installed package's copy)."""
    import os

    from evalkit.data.resources import resource_dir

    dirs = [Path(os.environ["EVALKIT_SWEEPS"])] if os.environ.get("EVALKIT_SWEEPS") else []
    return dirs + [resource_dir("sweeps")]


def resolve_grid(name_or_path: str) -> Path:
    """A grid file path, or the name of a grid in ``sweeps/`` (``default``, ``quick``)."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.is_file():
        if not p.is_file():
            raise GridError(f"grid file {p} does not exist")
        return p
    for d in grid_dirs():
        for suffix in (".yaml", ".yml"):
            cand = d / f"{name_or_path}{suffix}"
            if cand.is_file():
                return cand
    names = sorted({f.stem for d in grid_dirs() if d.is_dir() for f in d.glob("*.y*ml")})
    raise GridError(f"no grid named {name_or_path!r}: give a YAML file or one of {', '.join(names) or '(none found)'}")
