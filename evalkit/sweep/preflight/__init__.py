"""Checks made before any model loads: of the machine a command will use, and of the runs it plans.

A command that loads a model spends seconds to minutes before it first writes its output or
moves a tensor to its device; an output folder it cannot write, or a ``--device`` this machine
does not have, would then end in a traceback. Each command calls these checks first; each raises
:class:`~evalkit.errors.PreflightError` with one line that names the folder or device and the fix.
The checks leave nothing behind. Writability (:func:`check_writable`) is
:mod:`evalkit.runtime.folders`', on the bottom floor so that an engine's command hook can call it too.

The runs themselves (``run``, ``sweep``, ``sweep --dry-run``) are checked by the submodules, every
problem listed in one report: :mod:`.planned` (a planned run, a problem, printing the report),
:mod:`.commands` (what each command plans and which checks it makes), :mod:`.scale_files`,
:mod:`.model_fit` (schemes against the model's architecture, from its config) and :mod:`.engines`
(engine profile, engine plan, whether the engine can start here).
"""

from __future__ import annotations

import os

from evalkit.errors import PreflightError
from evalkit.runtime.folders import PROBE_PREFIX, check_writable  # noqa: F401 (the commands' writability check)

DEVICE_MAP_STRATEGIES = (
    "auto",
    "balanced",
    "balanced_low_0",
    "sequential",
)  # accelerate's; they pick devices themselves


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
