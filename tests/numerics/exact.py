"""What the numerics fingerprints share: fixed inputs, exact hashing, rounded hashing, the pin check.

Inputs are built from Python's :mod:`random` with exact float arithmetic (a sign, a mantissa in
[1, 2) and a power of two, exact in float64 and rounded once to float32): no libm, no torch RNG, so
they are the same bits on every platform and interpreter. :class:`TensorHash` hashes tensors by
their exact bytes (with dtype and shape, so a changed dtype or shape changes the hash); float8 and
bfloat16 tensors, which numpy cannot hold, are hashed as their raw integers.

Where a result comes out of a reduction whose order may differ between processors (a sum vectorized
at another SIMD width, a BLAS call), :func:`rounded_digest` hashes it rounded to 12 significant
digits instead: a change to the computation moves far more than that.

:func:`check_pins` is the one assertion of every fingerprint test; its message says what to do.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import json
import math
import random
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from evalkit.sweep.code_identity import NUMERICS_VERSION

SIGNIFICANT_DIGITS = 12


def exact_values(shape: tuple[int, ...], seed: int, low_exp: int = -12, high_exp: int = 6) -> torch.Tensor:
    """Float32 values ``sign * m * 2**e``, m in [1, 2) from ``random.random()``, e in [low_exp, high_exp]
    (1 % exact zeros, half of them -0.0; 2 % tiny, e in [-30, -21]): the same bits everywhere. A new
    tensor each call (made once per argument set: the inputs, not the code under test, are kept)."""
    return _exact_values(tuple(shape), seed, low_exp, high_exp).clone()


@functools.lru_cache(maxsize=64)
def _exact_values(shape: tuple[int, ...], seed: int, low_exp: int, high_exp: int) -> torch.Tensor:
    rng = random.Random(seed)
    values = []
    for _ in range(math.prod(shape)):
        u = rng.random()
        if u < 0.01:
            values.append(0.0 if u < 0.005 else -0.0)
            continue
        e = rng.randrange(low_exp, high_exp + 1) if u > 0.03 else rng.randrange(-30, -20)
        values.append((-1.0 if rng.random() < 0.5 else 1.0) * (1.0 + rng.random()) * 2.0**e)
    return torch.tensor(values, dtype=torch.float64).to(torch.float32).reshape(shape)


def exact_uniform(shape: tuple[int, ...], seed: int, bits: int = 12) -> np.ndarray:
    """Float64 values ``k / 2**bits``, k uniform in [0, 2**bits): exact, the same everywhere."""
    rng = random.Random(seed)
    return np.array([rng.randrange(2**bits) for _ in range(math.prod(shape))], dtype=np.float64).reshape(shape) / (
        2.0**bits
    )


def exact_normal(shape: tuple[int, ...], seed: int, scale: float = 1.0, bits: int = 10) -> np.ndarray:
    """Float64 values with a bell shape (a sum of 4 exact uniforms, centred), multiples of
    ``scale / 2**bits``: exact, the same everywhere."""
    rng = random.Random(seed)
    n, top = math.prod(shape), 2**bits
    k = [sum(rng.randrange(top) for _ in range(4)) - 2 * top for _ in range(n)]
    return np.array(k, dtype=np.float64).reshape(shape) * (scale / top)


class TensorHash:
    """SHA-256 over labels and the exact bytes of tensors (dtype and shape included)."""

    def __init__(self):
        self._h = hashlib.sha256()

    def label(self, text: str) -> None:
        self._h.update(f"# {text}\n".encode())

    def tensor(self, t: torch.Tensor | None) -> None:
        if t is None:
            self._h.update(b"None\n")
            return
        t = t.detach().contiguous().cpu()
        self._h.update(f"{tuple(t.shape)} {t.dtype}\n".encode())
        if t.dtype == torch.bfloat16 or (t.dtype.is_floating_point and t.element_size() == 1):  # no numpy dtype
            t = t.view(torch.int16 if t.element_size() == 2 else torch.uint8)
        self._h.update(t.numpy().tobytes())

    def read_values(self, t: torch.Tensor | None) -> None:
        """Values attention reads, with -0.0 taken as +0.0 (no attention can tell them apart: a code 0
        read back from the stored bytes is +0 where the quantizer's own values may say -0)."""
        self.tensor(None if t is None else t + 0.0)

    def value(self, v) -> None:
        """A plain Python value (an int, a bool, a string), exactly."""
        self._h.update(f"{v!r}\n".encode())

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def significant(x, digits: int = SIGNIFICANT_DIGITS):
    """``x`` (numbers, arrays, tensors, dicts, lists, dataclass-like rows) as JSON-able values with
    every float rounded to ``digits`` significant digits (as text, so the JSON is exact)."""
    if x is None or isinstance(x, (bool, np.bool_, str)):
        return bool(x) if isinstance(x, np.bool_) else x
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        if not math.isfinite(x):
            return repr(x)
        return f"{x:.{digits - 1}e}" if x != 0 else "0"
    if isinstance(x, torch.Tensor):
        return significant(x.detach().cpu().double().numpy() if x.is_floating_point() else x.cpu().numpy(), digits)
    if isinstance(x, np.ndarray):
        return [significant(v, digits) for v in x.tolist()] if x.ndim else significant(x.item(), digits)
    if isinstance(x, Mapping):
        return {str(k): significant(v, digits) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, (list, tuple)):
        return [significant(v, digits) for v in x]
    if hasattr(x, "value") and hasattr(x, "name") and not callable(x.value):  # an enum member
        return significant(x.value, digits)
    raise TypeError(f"cannot fingerprint a {type(x).__name__}")


def rounded_digest(x) -> str:
    """SHA-256 of ``x`` rounded to 12 significant digits, as canonical JSON."""
    return hashlib.sha256(json.dumps(significant(x), sort_keys=True).encode()).hexdigest()


def _literal(v) -> str:
    """A Python literal of ``v`` (strings in double quotes, as ruff formats them)."""
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_literal(x) for x in v) + "]"
    return repr(v)


def pin_entry(got: Mapping) -> str:
    """The entry to paste into a file's ``PINNED`` dict for the current version."""
    body = "".join(f"        {_literal(k)}: {_literal(v)},\n" for k, v in got.items())
    return f"    {NUMERICS_VERSION}: {{\n{body}    }},"


REPIN = "`python -m tests.numerics --write` (from the repository root) puts every file's new entries in place"


def pin_name(group: str, version: int) -> str:
    """The key a group's fingerprint is pinned under: its name, with its component's numerics version once
    that is bumped (``retrieval@v1``: :func:`evalkit.sweep.code_identity.components`), so bumping one
    codec family or evaluation re-pins its groups alone and leaves every other pin, and run id, as it was."""
    return group if not version else f"{group}@v{version}"


def versioned(got: Mapping[str, str], version_of) -> dict[str, str]:
    """``got`` (group -> fingerprint) keyed by :func:`pin_name`, ``version_of(group)`` giving the version."""
    return {pin_name(group, version_of(group)): value for group, value in got.items()}


def check_pins(pinned: Mapping[int, Mapping], got: Mapping, module: str, what: str) -> None:
    """Assert that ``got`` (pin name -> fingerprint) equals the pins of the current NUMERICS_VERSION; a group
    that is enumerated (a registered codec family or evaluation) but has no pin is named as such."""
    if NUMERICS_VERSION not in pinned:
        raise AssertionError(
            f"NUMERICS_VERSION {NUMERICS_VERSION} has no pinned fingerprints of {what} in "
            f"tests/numerics/{module}.py: {REPIN} (`python -m tests.numerics.{module}` prints this file's)"
        )
    want = pinned[NUMERICS_VERSION]
    unpinned = sorted(set(got) - set(want))
    if unpinned:
        raise AssertionError(
            f"{what}: registered but not pinned: {', '.join(unpinned)} (NUMERICS_VERSION {NUMERICS_VERSION}): a new "
            f"codec family, codec version or evaluation gets its pins with {REPIN}"
        )
    changed = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
    if changed:
        raise AssertionError(
            f"{what} changed in: {', '.join(changed)} (NUMERICS_VERSION {NUMERICS_VERSION}). If the change is "
            "meant, bump the numerics version of the component it belongs to (a codec family's numerics_version, "
            "evalkit.kv.formats.FORMAT_NUMERICS, an evaluation's numerics_version; NUMERICS_VERSION in "
            f"evalkit/sweep/code_identity.py for what every run shares) and re-pin: {REPIN}. If it is not "
            "meant, it is a bug: published results would no longer be what this code computes"
        )


def reference(pinned: Mapping[int, Mapping], group: str, compute, version: int = 0) -> str:
    """The pinned fingerprint of ``group`` (at its component's ``version``) for the current NUMERICS_VERSION,
    or (not pinned yet) ``compute()``: what a mutation test compares a patched fingerprint against."""
    return pinned.get(NUMERICS_VERSION, {}).get(pin_name(group, version)) or compute()


def prepare_process() -> None:
    """What ``tests/conftest.py`` sets up before any test, for the ``python -m`` printers: MKL's strict
    reproducible mode before the first matrix product, offline hubs, the tests' thread count."""
    import os

    from evalkit.runtime import numerics

    numerics.configure()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@contextlib.contextmanager
def one_thread():
    """Run torch on one thread inside the block: the exact fingerprints are elementwise ops and exact
    reductions, the same bits on any number of threads, and their many tiny ops run fastest on one
    (a busy second core makes two threads wait on each other)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def write_entry(path: str | Path, name: str, got: Mapping) -> None:
    """Put ``got`` as the current version's entry of the dict literal ``name`` in the file ``path``,
    replacing an entry for that version if there is one (``python -m tests.numerics --write``)."""
    path = Path(path)
    lines = path.read_text().splitlines(keepends=True)
    node = next(
        n.value
        for n in ast.parse("".join(lines)).body
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)
    )
    old = [
        (k.lineno, v.end_lineno)
        for k, v in zip(node.keys, node.values)
        if getattr(k, "value", None) == NUMERICS_VERSION
    ]
    end = node.end_lineno  # the line of the closing brace (1-based)
    entry = pin_entry(got) + "\n"
    if old:
        first, last = old[0]
        lines[first - 1 : last] = [entry]
    else:
        lines.insert(end - 1, entry)
    path.write_text("".join(lines))
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "ruff", "format", "--quiet", str(path)], check=False)  # long lines wrapped
