"""Reproducible floats on CPU: a batch-invariant BLAS, and a record of the platform that computed a result.

Why it matters here. A quantized forward is chaotic in float rounding: a 1e-7 change in one K
value moves it across an FP8 rounding boundary now and then, the flipped code changes the next
layers' inputs by far more than 1e-7, and they flip more codes. Measured on the embedded model
(SmolLM2-135M, float32, 4 windows of 512 tokens, fp8_e4m3/tensor/dynamic): multiplying every
weight by ``1 + 1e-6 * N(0, 1)`` leaves the unquantized perplexity unchanged to 1e-6 but moves the
FP8 perplexity between 15.31 and 15.39 and its KL between 0.0091 and 0.0095 nats. So a number is
reproducible only where the same floats are computed: same kernels, same summation orders.

Two things decide those orders on CPU beyond evalkit's code:

* **Intel MKL's matrix products** (torch's CPU ``matmul``/``linear`` on x86) pick kernels by the
  shape of the call and split work between threads in ways that change the summation order. A
  row's product then depends on how many rows share the call: measured on a 2-core Xeon (AVX-512),
  a 5-row product differs from the same rows inside a batch of 8 x 18 in the last bits, and a
  37-row 1536 -> 576 product from the same rows in a 74-row call (2 threads). Batched lm-eval
  (:mod:`evalkit.evals.lmeval.batching`) is exact only when products are batch-invariant. MKL's
  Conditional Numerical Reproducibility in strict mode (``MKL_CBWR=AUTO,STRICT``) makes them so,
  and independent of the thread count, at no measurable cost (README, "Performance"). MKL reads the
  variable at its first call, so :func:`configure` must run before the process's first matrix
  product: the command line calls it first thing, the tests' ``conftest.py`` and the Ray workers
  too. A library user who multiplies matrices before importing evalkit sets it in the environment.
* **The processor.** The same kernels on another instruction set (AVX2 against AVX-512, another
  vendor) round differently, so results are bit-identical only on the same platform.
  :func:`platform_record` is stored with every run (CPU model, the instruction set torch
  dispatches to, MKL's mode and whether products are batch-invariant as measured by
  :func:`blas_is_batch_invariant`); the published store's re-run test compares bit for bit only
  on a matching platform.
"""

from __future__ import annotations

import os
import platform
from functools import cache

MKL_MODE = "AUTO,STRICT"  # MKL CNR: the processor's own code branch, strict (shape- and thread-invariant) results


def configure() -> None:
    """Ask MKL for strict reproducible results unless the environment chose otherwise (effective
    only before the process's first MKL call; harmless where torch does not use MKL)."""
    os.environ.setdefault("MKL_CBWR", MKL_MODE)


@cache
def blas_is_batch_invariant() -> bool:
    """Whether a matrix product's rows equal the same rows computed inside a larger call, here and
    now (a probe on the shapes that differed without strict mode: a 5-row and a 37-row product)."""
    import torch

    g = torch.Generator().manual_seed(0)
    w = torch.randn(576, 1536, generator=g)
    for rows, batch in ((5, (8, 18)), (37, (2, 37))):
        x = torch.randn(rows, 1536, generator=g)
        big = torch.randn(*batch, 1536, generator=g)
        big[1, :rows] = x
        alone = x @ w.T
        inside = (big.reshape(-1, 1536) @ w.T).reshape(*batch, -1)[1, :rows]
        if not torch.equal(alone, inside):
            return False
    return True


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def _cpu_model() -> tuple[str, str]:
    """(model name, vendor family/model/stepping): virtual machines often name only "Intel Xeon"."""
    info = _cpuinfo()
    name = info.get("model name") or platform.processor() or platform.machine()
    ident = "/".join(info.get(k, "?") for k in ("vendor_id", "cpu family", "model", "stepping")) if info else ""
    return name, ident


@cache
def platform_record() -> dict:
    """What besides the code decides the floats of a CPU run (stored in every run's info), and the
    interpreter that ran it (``python``, full version: provenance; its major.minor is in the run id,
    :func:`evalkit.sweep.grid.versions`, and :func:`same_platform` leaves it out, since the
    interpreter does not change torch's floats)."""
    import torch

    name, ident = _cpu_model()
    return {
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "cpu": name,
        "cpu_id": ident,
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl": torch.backends.mkl.is_available(),
        "mkl_cbwr": os.environ.get("MKL_CBWR"),
        "blas_batch_invariant": blas_is_batch_invariant(),
    }


def same_platform(a: dict | None, b: dict | None) -> bool:
    """Whether two platform records compute the same floats (same CPU, instruction set and MKL mode)."""
    keys = ("cpu", "cpu_id", "machine", "cpu_capability", "mkl", "mkl_cbwr")
    return bool(a) and bool(b) and all(a.get(k) == b.get(k) for k in keys)
