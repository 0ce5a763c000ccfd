"""Starting vLLM in this process: importing it (the environment it needs checked first), the terminal's
progress bars and status lines while it works, and one line for an error it raised while starting.

Shared by every way evalkit starts vLLM (:class:`~evalkit.engines.vllm.runner.VllmRunner`, lm-eval's
engine in :mod:`evalkit.engines.vllm.lmeval`, the serving measurement), apart from the runner itself.
"""

from __future__ import annotations

import os
import re
import sys

from evalkit.errors import EngineUnavailableError


# -- importing vLLM ------------------------------------------------------------------------------------
def import_vllm(device: str | None = None):
    """vLLM, imported in-process (evalkit.engines.vllm.install: the environment it needs, checked first; the
    installed build and its version for ``device``: evalkit.engines.vllm.versions)."""
    from evalkit.engines.vllm.install import check_companions, set_in_process
    from evalkit.engines.vllm.kernel import check_vllm_available

    check_vllm_available(device=device)
    set_in_process()  # VLLM_ENABLE_V1_MULTIPROCESSING=0 before the import, or one line
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # evalkit checks what the warnings would say (scales)
    check_companions()  # torchvision/torchaudio/torchcodec builds that break transformers' model imports
    try:
        if "vllm" in sys.modules:
            import vllm
        else:
            with status("importing vLLM"):  # 10-40 s on a small CPU: said on the terminal at once
                import vllm
    except ImportError as exc:
        raise EngineUnavailableError(f"vLLM is installed but cannot be imported ({exc})") from None
    return vllm


# -- progress on the terminal (stderr; EVALKIT_PROGRESS=0, e.g. --no-progress, turns it off) ---------------------
def progress_bar(desc: str, total: int | None = None, unit: str = "tok", **kwargs):
    """A tqdm bar on stderr that disappears when done, as the evaluations' own bars."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=True,
        leave=False,
        dynamic_ncols=True,
        file=sys.stderr,
        disable=os.environ.get("EVALKIT_PROGRESS") == "0",
        **kwargs,
    )


def status(what: str):
    """One line on stderr for a step without a count (starting an engine), cleared when it ends."""
    return progress_bar(what, bar_format="{desc} ...")


# vLLM's names in its start-up errors -> the caller's flags (VllmRunner.flags); see startup_error
_TOO_LONG = re.compile(r"User-specified max_model_len \((\d+)\) is greater than the derived max_model_len \(([^)]*)\)")
_NO_MEMORY = re.compile(r"Available memory on node (\d+) \(([^)]*)\).*?requested memory for kv \(([^)]*)\)")
_NO_GPU_MEMORY = re.compile(
    r"Free memory on device (\S+) \(([\d.]+)/([\d.]+) GiB\) on startup is less than (.*?) \(([\d.]+)"
)


def startup_error(exc: BaseException, flags: dict[str, str] | None = None) -> str:
    """One line for an exception vLLM raised while starting: the cause, not the wrapper. A pydantic
    ``N validation error for ModelConfig`` gives its first error's message; the messages evalkit
    recognises are said in the caller's terms (``flags``: ``context`` and ``budget`` name the
    flags that set ``max_model_len`` and ``kv_cache_memory_bytes``, e.g. ``--context`` and ``--budget-gib``)."""
    flags = flags or {}
    errors = getattr(exc, "errors", None)
    text = ""
    if callable(errors):
        try:
            first = errors()[0]
            text = str(first.get("msg", "")).removeprefix("Value error, ")
        except Exception:  # noqa: BLE001  (not pydantic's shape after all)
            text = ""
    if not text:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        text = lines[0] if lines else type(exc).__name__
    too_long = _TOO_LONG.search(text)
    if too_long:
        flag = flags.get("context", "max_model_len")
        return (
            f"{flag} {int(too_long.group(1)):,} is longer than the model's context ({too_long.group(2)}): lower {flag}"
        )
    memory = _NO_MEMORY.search(text)
    if memory:
        flag = flags.get("budget", "kv_cache_memory_bytes")
        return (
            f"a KV cache of {memory.group(3)} does not fit: NUMA node {memory.group(1)} has {memory.group(2)} "
            f"available: lower {flag} (or free memory)"
        )
    gpu = _NO_GPU_MEMORY.search(text)
    if gpu:
        device, free, total, _, share = gpu.groups()
        return (
            f"only {free} of {total} GiB are free on {device}, less than gpu_memory_utilization {share} asks: "
            "lower --engine-option gpu_memory_utilization (or free the GPU)"
        )
    sentence = text.split(". ")[0].rstrip(".")
    return sentence[:300]
