"""Where evalkit's data folders are: ``tasks/``, ``sweeps/`` and ``calibration/`` (and, for the
notebooks, the committed results store: :func:`results_folder`).

They sit at the top of the repository, where users look for them, and ship inside the wheel as
``evalkit/_data/<kind>`` (``setup.py`` maps the folders into the package). Running from a source
checkout (a clone, installed editable or on ``PYTHONPATH``) uses the checkout's own folders, so an
edited task or grid takes effect at once; an installed package (``pip install .``, a wheel on a
cluster node) uses its packaged copy. Every lookup goes through :func:`resource_dir`, so no other
module knows either location.
"""

from __future__ import annotations

from pathlib import Path

from evalkit.errors import EvalkitError, ScaleError

KINDS = ("tasks", "sweeps", "calibration")
_PACKAGE = Path(__file__).resolve().parents[1]  # .../evalkit


def source_root() -> Path | None:
    """The source checkout this package runs from, or None when it runs from an installed copy."""
    root = _PACKAGE.parent
    return root if (root / "pyproject.toml").is_file() and (root / "setup.py").is_file() else None


def resource_dir(kind: str) -> Path:
    """The folder of one resource kind: the checkout's when running from one, else the packaged copy."""
    if kind not in KINDS:
        raise ValueError(f"unknown resource kind {kind!r}: one of {', '.join(KINDS)}")
    root = source_root()
    if root is not None and (root / kind).is_dir():
        return root / kind
    packaged = _PACKAGE / "_data" / kind
    if not packaged.is_dir():
        raise EvalkitError(
            f"evalkit's {kind}/ folder is missing from {packaged}: reinstall evalkit "
            "(pip install --force-reinstall --no-deps evalkit, or pip install . from a checkout)"
        )
    return packaged


def results_folder(path: str | Path) -> Path:
    """A results folder by the path a notebook names (``published/default``), wherever it runs.

    A notebook's kernel starts in the notebook's own folder, a script in the caller's: a relative
    path is looked up in the current folder first, then at the top of the source checkout this
    package runs from, then among the packaged data (``evalkit/_data/...``), so the committed store
    opens from the repository root, from ``notebooks/`` or from anywhere else. Absolute (or ``~``)
    paths are taken as they are.
    """
    p = Path(path).expanduser()
    if p.is_absolute() or p.is_dir():
        return p.resolve() if p.is_dir() else p
    root = source_root()
    candidates = ([root / p] if root is not None else []) + [_PACKAGE / "_data" / p]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    where = " nor ".join(str(c.parent) for c in [Path.cwd() / p, *candidates[:1]])
    raise EvalkitError(
        f"results folder {path} is in neither {where}: give its absolute path, "
        "or write one with `python -m evalkit sweep --out DIR`"
    )


def resolve_calibration_file(path: str) -> Path:
    """A static scale file by the path a scheme names (``+scales=calibration/NAME.safetensors``).

    Absolute (or ``~``) paths are taken as they are. A relative path is looked up in the current
    folder first, then in evalkit's calibration folder (with or without its leading ``calibration/``),
    so the scale tables that ship with evalkit work from any folder.
    """
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    if p.is_file():
        return p.resolve()
    calibration = resource_dir("calibration")
    rest = Path(*p.parts[1:]) if len(p.parts) > 1 and p.parts[0] == "calibration" else p
    for candidate in (calibration / rest, calibration / p):
        if candidate.is_file():
            return candidate
    raise ScaleError(
        f"static scale file {path} is in neither the current folder nor {calibration}: "
        "give its path, or make one with `python -m evalkit calibrate`"
    )
