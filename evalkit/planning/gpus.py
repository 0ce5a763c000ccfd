"""The GPUs people serve on: memory as the vendor states it and as the device reports it, and the architecture.

Three memory figures, because they differ by several percent and capacity plans go wrong on the difference:

- ``stated``: the datasheet's, in the vendor's decimal gigabytes (an H200 has "141 GB" = 141 x 10**9 bytes);
- ``smi``: what ``nvidia-smi`` (``memory.total``, MiB) or ``rocm-smi --showmeminfo vram`` (bytes) reports:
  143,771 MiB on an H200;
- ``cuda``: what the CUDA (or HIP) runtime reports as the device's total, ``torch.cuda.mem_get_info()[1]``,
  printed by torch's out-of-memory message as "GPU 0 has a total capacity of 139.81 GiB". This is the
  figure vLLM multiplies by ``gpu_memory_utilization`` (``vllm/v1/worker/utils.py`` ``request_memory``:
  ``ceil(total_memory * gpu_memory_utilization)``), so :attr:`GPU.memory` is this one where known. It moves
  by a few tens of MiB with the driver and ECC; ``capacity --gpu-memory`` overrides it.

Each figure was read in public logs (found with code search; nvidia-smi tables, torch OOM messages, vLLM's
"total_gpu_memory (...)" profiling line); ``source`` says which. Compute capability (NVIDIA) or gfx
architecture (AMD) decides which vLLM attention backends and KV cache dtypes a GPU runs
(:mod:`evalkit.planning.kv_backends`).
"""

from __future__ import annotations

from dataclasses import dataclass

from evalkit.errors import EvalkitError

GIB = 2**30
MIB = 2**20
_CUDA_SRC = "torch OOM messages 'GPU 0 has a total capacity of {} GiB'"


@dataclass(frozen=True)
class GPU:
    key: str
    name: str
    vendor: str  # "nvidia" | "amd"
    arch: str  # Hopper, Blackwell, CDNA 3 ...
    stated_gb: int  # the vendor's figure, decimal GB
    smi_bytes: int | None  # nvidia-smi / rocm-smi total
    cuda_bytes: int | None  # CUDA/HIP runtime total (what vLLM takes a fraction of)
    capability: tuple[int, int] | None = None  # NVIDIA compute capability
    gfx: str | None = None  # AMD LLVM target
    source: str = ""

    @property
    def memory(self) -> int:
        """Bytes vLLM sees: the runtime's total where known, else the management tool's."""
        return self.cuda_bytes or self.smi_bytes or self.stated_gb * 10**9

    @property
    def memory_source(self) -> str:
        if self.cuda_bytes:
            return "as CUDA reports it" if self.vendor == "nvidia" else "as HIP reports it"
        return "as nvidia-smi reports it" if self.vendor == "nvidia" else "as rocm-smi reports it"

    @property
    def compute(self) -> str:
        return f"SM {self.capability[0]}.{self.capability[1]}" if self.capability else str(self.gfx)

    @property
    def sm100_family(self) -> bool:
        return bool(self.capability) and self.capability[0] == 10

    def describe(self) -> str:
        smi = f"{self.smi_bytes / MIB:,.0f} MiB" if self.smi_bytes else "not found"
        tool = "nvidia-smi" if self.vendor == "nvidia" else "rocm-smi"
        return (
            f"{self.name} ({self.compute}): {self.memory / GIB:.2f} GiB {self.memory_source}; "
            f"{tool}: {smi}; {'AMD' if self.vendor == 'amd' else 'NVIDIA'}: {self.stated_gb} GB"
        )


def _gib(x: float) -> int:
    return round(x * GIB)


GPUS: dict[str, GPU] = {
    g.key: g
    for g in (
        GPU(
            "a100",
            "NVIDIA A100 80GB (SXM4)",
            "nvidia",
            "Ampere",
            80,
            81920 * MIB,
            _gib(79.14),
            (8, 0),
            source="nvidia-smi 81920MiB; torch '79.14 GiB available' (A100-SXM4-80GB)",
        ),
        GPU(
            "l40s",
            "NVIDIA L40S",
            "nvidia",
            "Ada Lovelace",
            48,
            46068 * MIB,
            _gib(44.39),
            (8, 9),
            source="nvidia-smi 46068MiB; " + _CUDA_SRC.format("44.39"),
        ),
        GPU(
            "h100",
            "NVIDIA H100 80GB HBM3 (SXM5)",
            "nvidia",
            "Hopper",
            80,
            81559 * MIB,
            _gib(79.11),
            (9, 0),
            source="nvidia-smi 81559MiB; vLLM 'total_gpu_memory (79.11GiB)' for Llama-3.1-8B on H100",
        ),
        GPU(
            "h200",
            "NVIDIA H200 (SXM)",
            "nvidia",
            "Hopper",
            141,
            143771 * MIB,
            _gib(139.81),
            (9, 0),
            source="nvidia-smi 143771MiB; " + _CUDA_SRC.format("139.81"),
        ),
        GPU(
            "b200",
            "NVIDIA B200",
            "nvidia",
            "Blackwell",
            180,
            183359 * MIB,
            _gib(178.35),
            (10, 0),
            source="nvidia-smi 183359MiB; " + _CUDA_SRC.format("178.35"),
        ),
        GPU(
            "gb200",
            "NVIDIA GB200 (NVL72)",
            "nvidia",
            "Blackwell",
            186,
            189471 * MIB,
            _gib(184.31),
            (10, 0),
            source="nvidia-smi 189471MiB; " + _CUDA_SRC.format("184.31"),
        ),
        GPU(
            "b300",
            "NVIDIA B300 (SXM6 AC)",
            "nvidia",
            "Blackwell Ultra",
            288,
            275040 * MIB,
            _gib(267.69),
            (10, 3),
            source="nvidia-smi 275040MiB; " + _CUDA_SRC.format("267.69"),
        ),
        GPU(
            "mi300x",
            "AMD Instinct MI300X",
            "amd",
            "CDNA 3",
            192,
            205822885888,
            _gib(191.98),
            gfx="gfx942",
            source="rocm-smi 'VRAM Total Memory (B): 205822885888'; " + _CUDA_SRC.format("191.98"),
        ),
        GPU(
            "mi325x",
            "AMD Instinct MI325X",
            "amd",
            "CDNA 3",
            256,
            None,
            _gib(255.98),
            gfx="gfx942",
            source=_CUDA_SRC.format("255.98"),
        ),
        GPU(
            "mi355x",
            "AMD Instinct MI355X",
            "amd",
            "CDNA 4",
            288,
            None,
            _gib(287.98),
            gfx="gfx950",
            source=_CUDA_SRC.format("287.98"),
        ),
    )
}


def get_gpu(name: str) -> GPU:
    key = name.strip().lower().replace("-", "").replace(" ", "")
    if key in GPUS:
        return GPUS[key]
    raise EvalkitError(f"unknown GPU {name!r}: use one of {', '.join(GPUS)} (or give --gpu-memory SIZE)")
