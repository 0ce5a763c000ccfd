"""The KV budget of each rank of a deployment: GPU memory at the utilization, less weights and reserve.

Per rank, as vLLM 0.33 sizes it (``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``;
``vllm/v1/worker/utils.py`` ``request_memory``)::

    usable    = ceil(memory x utilization)             memory: what the CUDA runtime reports for the GPU
    KV budget = usable - weights of the rank - reserve (activations + CUDA graphs, evalkit.planning.reserve)

With a vLLM release's sizing (:mod:`evalkit.planning.vllm_sizing`, ``capacity --vllm-version``) whose
extensible KV cache is on (0.34), ``usable`` is ``min(ceil(memory x utilization), memory - margin)``,
the margin ``max(1 GiB, 0.75 x the rank's activation peak)``.

Weights of a rank (:mod:`evalkit.planning.weights`) come from the model's parts when its config has them
(a preset, a config.json with ``intermediate_size`` and ``vocab_size``). A total given instead
(``--weights-bytes``, ``--params`` x ``--weights-dtype``, a folder's safetensors files) is spread over the
ranks in the proportions of those parts, or evenly over TP x PP when the parts are unknown (then no
reserve is estimated either: the note says so, and ``--reserve SIZE`` gives one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from evalkit.errors import EvalkitError
from evalkit.planning.parallel import Parallel, stage_layers
from evalkit.planning.reserve import Batch, Reserve, estimate
from evalkit.planning.vllm_sizing import VllmSizing
from evalkit.planning.weights import Architecture, RankWeights, model_params, rank_weights
from evalkit.units import format_bytes


@dataclass(frozen=True)
class Deployment:
    memory: int  # bytes per GPU, as the runtime reports it
    utilization: float
    parallel: Parallel
    batch: Batch
    reserve: int | None = None  # bytes per rank given by the user (replaces the estimate)
    sizing: VllmSizing | None = None  # a vLLM release's sizing (None: evalkit's plain count)

    @property
    def usable(self) -> int:
        return math.ceil(self.memory * self.utilization)


@dataclass(frozen=True)
class Stage:
    """One pipeline stage's fullest rank."""

    index: int
    layers: range
    weights: int
    reserve: int
    usable: int
    estimate: Reserve | None = None
    parts: dict = field(default_factory=dict)  # weight bytes by part (proportional to parameters)
    margin: int = 0  # what vLLM 0.34's extensible KV cache keeps free (0 without it)

    @property
    def kv_budget(self) -> int:
        return self.usable - self.weights - self.reserve


def model_bytes(arch: Architecture, dtype: str, block: int | None) -> int:
    """The whole model's weight bytes (one copy, as the checkpoint holds it)."""
    whole = rank_weights(arch, Parallel())
    pad = model_params(arch) - (whole.linear + whole.other)  # vocabulary padding, negative or zero
    return whole.nbytes(dtype, block) + RankWeights(0, pad, {}).nbytes(dtype)


def stages(
    dep: Deployment,
    num_layers: int,
    arch: Architecture | None,
    dtype: str | None,
    block: int | None = None,
    total: int | None = None,
) -> list[Stage]:
    """The budget of every pipeline stage's fullest rank; one line (EvalkitError) when one does not fit."""
    if dep.utilization <= 0 or dep.utilization > 1:
        raise EvalkitError(f"--utilization is a fraction in (0, 1], got {dep.utilization}")
    par = dep.parallel
    out = []
    for s, layers in enumerate(stage_layers(num_layers, par.pp)):
        if arch is not None and (dtype is not None or total is not None):
            basis = dtype or "bf16"  # a given total with no dtype: spread in proportion to BF16 parts
            rank: RankWeights = rank_weights(arch, par, s)
            weights = rank.nbytes(basis, block)
            if total is not None:
                weights = round(weights * total / model_bytes(arch, basis, block))
            share = weights / max(rank.linear + rank.other, 1)
            parts = {k: round(v * share) for k, v in rank.parts.items()}
        elif total is not None:
            weights, parts = -(-total // (par.tp * par.pp)), {}
        else:
            raise EvalkitError(
                "the weight footprint is unknown: give --weights-bytes SIZE, or --params N with --weights-dtype bf16|fp8|int4"
            )
        est = estimate(arch, par, dep.batch, s) if arch is not None and dep.reserve is None else None
        reserve = dep.reserve if dep.reserve is not None else (est.total if est else 0)
        usable, margin = dep.usable, 0
        if dep.sizing is not None and dep.sizing.extensible:
            peak = est.activations if est else reserve  # a given reserve: all of it counted as the peak
            usable, margin = dep.sizing.usable(dep.memory, dep.utilization, peak), dep.sizing.margin(peak)
        stage = Stage(s, layers, weights, reserve, usable, est, parts, margin)
        if stage.kv_budget <= 0:
            where = f"pipeline stage {s}: " if par.pp > 1 else ""
            raise EvalkitError(
                f"{where}the weights ({format_bytes(weights)} per rank) and reserve ({format_bytes(reserve)}) do not "
                f"fit in {format_bytes(usable)} per GPU ({dep.memory / 2**30:.2f} GiB x {dep.utilization} usable"
                f"{f', less a margin of {format_bytes(margin)}' if margin else ''}, {par}): "
                "add GPUs (more --tensor-parallel, --pipeline-parallel or --expert-parallel), use smaller weights "
                "(--weights-dtype fp8/int4) or raise --utilization"
            )
        out.append(stage)
    return out
