"""vLLM's released source for the API test: a wheel fetched from the package registry, only its Python kept.

:func:`vllm_source` returns a folder holding ``vllm/**/*.py`` (and the wheel's ``METADATA``) of a vLLM
release, for :mod:`evalkit.engines.vllm.api_check` to read without importing it. The wheel (about 336 MB)
is fetched once with ``pip download --no-deps --only-binary=:all:`` for the manylinux x86-64 platform
(the same file on any machine), unpacked into ``<cache>/vllm-<version>/`` and deleted; the unpacked tree
(about 40 MB) is kept. The cache is ``$EVALKIT_CI_ENVS/wheels`` in CI (kept between runs there) or
``~/.cache/evalkit/wheels``; a wheel already in it (``vllm-<version>-*.whl``) is used as it is.
When the registry cannot be reached the caller skips, saying so; any other failure of pip is an error.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

PLATFORM = "manylinux_2_28_x86_64"
_OFFLINE = re.compile(
    r"Could not fetch URL|NewConnectionError|Temporary failure in name resolution|Max retries exceeded|"
    r"Network is unreachable|Connection refused|ConnectTimeout|ReadTimeout|No route to host|Name or service not known|"
    r"ProxyError|SSLError|connection broken",
    re.IGNORECASE,
)


class RegistryUnreachable(Exception):
    """pip could not reach the package registry (the test skips with this reason)."""


def cache_dir() -> Path:
    ci = os.environ.get("EVALKIT_CI_ENVS")
    return Path(ci) / "wheels" if ci else Path.home() / ".cache" / "evalkit" / "wheels"


def _fetch(version: str, cache: Path) -> Path:
    found = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--platform", PLATFORM]
    cmd += ["--python-version", "3.12", f"vllm=={version}", "-d", str(cache), "--quiet", "--disable-pip-version-check"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    text = f"{done.stdout}\n{done.stderr}"
    if done.returncode != 0:
        lines = [line for line in text.strip().splitlines() if line.strip()] or ["no output"]
        if _OFFLINE.search(text):
            raise RegistryUnreachable(f"pip download vllm=={version} cannot reach the registry: {lines[-1][:200]}")
        raise RuntimeError(f"pip download vllm=={version} failed: {lines[-1]}")
    found = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if not found:
        raise RuntimeError(f"pip download vllm=={version} left no wheel in {cache}")
    return found[0]


def vllm_source(version: str) -> Path:
    """The folder holding vLLM ``version``'s ``vllm/`` Python source (see the module docstring)."""
    cache = cache_dir()
    tree = cache / f"vllm-{version}"
    if (tree / ".complete").is_file():
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    wheel = _fetch(version, cache)
    keep = re.compile(rf"^(vllm/.*\.py|vllm-{re.escape(version)}\.dist-info/METADATA)$")
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if keep.match(name):
                z.extract(name, tree)
    (tree / ".complete").write_text(f"{wheel.name}\n")
    wheel.unlink()
    return tree


def requirements(tree: Path) -> dict[str, str]:
    """``Requires-Dist`` name -> specifier of the unpacked wheel's METADATA (no environment markers kept)."""
    meta = next(tree.glob("vllm-*.dist-info/METADATA"))
    out = {}
    for line in meta.read_text().splitlines():
        if line.startswith("Requires-Dist: ") and ";" not in line:
            m = re.match(r"Requires-Dist: ([A-Za-z0-9_.\-\[\]]+)\s*(.*)", line)
            if m:
                out[m.group(1).split("[")[0].lower()] = m.group(2).strip()
    return out
