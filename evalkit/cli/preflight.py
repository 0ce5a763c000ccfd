"""Checks of the machine a command will write to and compute on, made before any model loads.

A command that loads a model spends seconds to minutes before it first writes its output or
moves a tensor to its device; an output folder it cannot write, or a ``--device`` this machine
does not have, would then end in a traceback. Each command calls these checks first; each raises
:class:`~evalkit.errors.PreflightError` with one line that names the folder or device and the fix.

The checks leave nothing behind: writability is probed by creating (and removing) a temporary
file in the folder, or in its nearest existing ancestor when the folder does not exist yet, so
no output folder is created just to test it. A real file is created because permission bits do
not answer the question (``os.access`` says yes to root on a read-only file system).
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from evalkit.errors import PreflightError

PROBE_PREFIX = ".evalkit-write-check-"
DEVICE_MAP_STRATEGIES = (
    "auto",
    "balanced",
    "balanced_low_0",
    "sequential",
)  # accelerate's; they pick devices themselves


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


def check_device(device: str | None, flag: str = "--device", *, where: str = "", use: str | None = None) -> None:
    """Raise PreflightError unless this torch on this machine can place tensors on ``device``
    (``cpu``, ``cuda``, ``cuda:N``, ``mps`` ...). ``flag`` names the option (``--device``), ``where``
    is put before it (``grid g.yaml, model m: ``), ``use`` ends the fix (default ``use {flag} cpu``)."""
    if device is None:
        return
    import torch

    text = str(device)
    name = f"{where}{flag} {text}"
    use = use or f"use {flag} cpu"
    version = f"torch {torch.__version__}"
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        raise PreflightError(f"{name} is not a device: {use}, or cuda, cuda:N, mps") from None
    if dev.type == "cpu":
        return
    if dev.type == "cuda":
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            raise PreflightError(
                f"{name} but this torch has no CUDA ({version}): {use} or install a CUDA build of torch"
            )
        if not torch.cuda.is_available():
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            seen = f", CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
            raise PreflightError(
                f"{name} but no CUDA GPU is visible ({version}{seen}): {use}, or check the driver "
                "(nvidia-smi) and CUDA_VISIBLE_DEVICES"
            )
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            have, pick = (
                ("cuda:0", "cuda:0") if count == 1 else (f"cuda:0 ... cuda:{count - 1}", f"cuda:N with N < {count}")
            )
            raise PreflightError(
                f"{name} but this machine has {count} CUDA GPU{'' if count == 1 else 's'} ({have}): use {flag} {pick}"
            )
        return
    if dev.type == "mps":
        mps = torch.backends.mps
        if not mps.is_built():
            raise PreflightError(f"{name} but this torch has no MPS ({version}; MPS is Apple silicon on macOS): {use}")
        if not mps.is_available():
            raise PreflightError(
                f"{name} but MPS is not available on this machine ({version}; it needs macOS 12.3+ "
                f"on Apple silicon): {use}"
            )
        if dev.index not in (None, 0):
            raise PreflightError(f"{name} but MPS has one device (mps:0): use {flag} mps")
        return
    if dev.type == "meta":
        raise PreflightError(f"{name} holds no data, a model cannot run on it: {use}")
    backend = getattr(torch, dev.type, None)
    available = getattr(backend, "is_available", None)
    if callable(available) and not available():
        raise PreflightError(f"{name} but this torch cannot use {dev.type} on this machine ({version}): {use}")


def check_device_map(device_map: str | None, flag: str = "--device-map", **kw) -> None:
    """A ``--device-map`` that names one device (``cuda:1``) is checked as a device; accelerate's
    strategies (``auto`` ...) pick devices themselves and pass."""
    if device_map is None or str(device_map) in DEVICE_MAP_STRATEGIES:
        return
    kw.setdefault("use", f"use {flag} auto")
    check_device(str(device_map), flag, **kw)


def check_model_device(args) -> None:
    """``--device`` and ``--device-map`` of a command built with :func:`evalkit.cli.common.add_model_arguments`."""
    check_device(getattr(args, "device", None), "--device")
    check_device_map(getattr(args, "device_map", None), "--device-map")


def check_grid_devices(models, grid_path) -> None:
    """Each model's ``device:`` / ``device_map:`` of a sweep grid (:class:`evalkit.sweep.grid.ModelSpec`)."""
    for spec in dict.fromkeys(models):
        where = f"grid {grid_path}, model {spec.name}: "
        check_device(spec.device, "device:", where=where, use="use device: cpu in the grid")
        check_device_map(spec.device_map, "device_map:", where=where, use="use device_map: auto in the grid")
