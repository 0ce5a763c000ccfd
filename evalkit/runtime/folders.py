"""Whether a folder (or a file) can be written, probed before a command spends minutes loading a model.

Writability is probed by creating (and removing) a temporary file in the folder, or in its nearest
existing ancestor when the folder does not exist yet, so no output folder is created just to test it.
A real file is created because permission bits do not answer the question (``os.access`` says yes to
root on a read-only file system). It lives on the bottom floor so that a command hook at any floor (an
engine's ``conformance`` command in ``evalkit/engines/<name>/``) can call it; the command line's other
checks are :mod:`evalkit.sweep.preflight`. It reads the file system only, never a number a run stores.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from evalkit.errors import PreflightError

PROBE_PREFIX = ".evalkit-write-check-"


def check_writable(path: str | Path | None, flag: str, *, kind: str = "folder", fix: str | None = None) -> None:
    """Raise PreflightError unless ``path`` (a folder, or with ``kind="file"`` a file) can be
    written or created; ``flag`` names the option in the message (``--out``). Creates nothing
    that outlives the call. ``None`` (option not given) passes."""
    if path is None:
        return
    if kind not in ("folder", "file"):
        raise ValueError(f"kind must be 'folder' or 'file', got {kind!r}")
    shown = str(path)
    fix = fix or f"pass {flag} a {'folder' if kind == 'folder' else 'file path'} you can write"
    reason = _unwritable_reason(Path(os.fspath(path)), kind)  # relative paths end their walk up at '.'
    if reason:
        raise PreflightError(f"cannot write to {shown} ({reason}): {fix}")


def _unwritable_reason(path: Path, kind: str) -> str | None:
    if os.path.lexists(path):
        if os.path.islink(path) and not os.path.exists(path):
            return "it is a broken link"
        if kind == "folder" and not path.is_dir():
            return "it is a file, not a folder"
        if kind == "file" and path.is_dir():
            return "it is a folder, not a file"
        if kind == "file":
            problem = _open_existing(path)
            if problem:
                return problem
            return _probe(path.parent)
        return _probe(path)
    ancestor = path.parent if kind == "file" else path
    while not os.path.lexists(ancestor):
        if ancestor.parent == ancestor:
            return f"{ancestor} does not exist"
        ancestor = ancestor.parent
    if os.path.islink(ancestor) and not os.path.exists(ancestor):
        return f"{ancestor} is a broken link"
    if not ancestor.is_dir():
        return f"{ancestor} is a file, not a folder"
    return _probe(ancestor)


def _probe(folder: Path) -> str | None:
    """None when a file can be created in ``folder``, else why not (the probe file is removed)."""
    try:
        fd, name = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=folder)
    except OSError as exc:
        return _reason(exc, folder)
    os.close(fd)
    try:
        os.unlink(name)
    except OSError:
        pass
    return None


def _open_existing(path: Path) -> str | None:
    """None when the existing file ``path`` can be opened for writing; its contents are untouched."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError as exc:
        return _reason(exc, path)
    os.close(fd)
    return None


def _reason(exc: OSError, where: Path) -> str:
    code = exc.errno
    if code == errno.EROFS:
        return "read-only file system"
    if code in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if code == errno.ENOTDIR:
        return f"{where} is not a folder"
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return "no space left on the device"
    if code == errno.ENOENT:
        return f"{where} does not accept new files"
    return (os.strerror(code) if code else str(exc)).lower()
