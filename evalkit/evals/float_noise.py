"""Float-rounding noise: copies of a model whose weights differ from it by a few ulps of their own dtype.

A quantized forward is chaotic in float rounding: a last-bit change in one weight moves the K/V
that reach the quantizer, a few codes flip, and the flips propagate. Two implementations that
compute the same thing in a different order (an engine and an emulation, or one emulation on two
processors) therefore differ by more than their arithmetic alone suggests. The spread of a metric
over weight copies perturbed in their last bits measures that noise: a difference between two
results that lies inside it is not resolved by the data.

:func:`perturbed_model` moves every floating-point weight by ``k`` ulps of its own dtype, ``k`` a
seeded integer draw of ``round(ulps * N(0, 1))`` per element (with the default ``ulps=1``: 38 % of
weights stay, 48 % move by one ulp, 12 % by two). The unit is the dtype's own ulp, so the
perturbation is the same size, in rounding steps, for float32, bfloat16 and float16 weights (a
fixed relative change such as ``1 + 1e-7 * N(0, 1)`` is a no-op on bf16 weights, whose ulp is
2**-8 relative). Zeros stay zero. The perturbation is drawn on the CPU in float64 from a seeded
generator, so it is the same on every device and platform.

Parameters only, not buffers. A model's floating-point buffers are constants derived from its
config, not weights: rotary ``inv_freq`` (and ``original_inv_freq``, which dynamic RoPE restores it
from), attention-mask fills, position tables. Every implementation computes them from the config,
so they are not where two implementations' weights can differ; moving them would add an error of a
different kind (an ulp of ``inv_freq`` shifts every rotary angle by an amount that grows with the
position, the same in every layer; ``inv_freq`` and its original copy would disagree), and a mask
fill of ``finfo.min`` has an infinite ulp above it (the next step overflows), so it would become NaN.
"""

from __future__ import annotations

import copy

import torch

DEFAULT_ULPS = 1.0


def ulp(x: torch.Tensor) -> torch.Tensor:
    """The distance from ``|x|`` to the next representable value above it, in ``x``'s dtype."""
    a = x.abs()
    return torch.nextafter(a, torch.full_like(a, float("inf"))) - a


def perturb_(tensor: torch.Tensor, generator: torch.Generator, ulps: float = DEFAULT_ULPS) -> None:
    """Move each element of a floating-point tensor, in place, by ``round(ulps * N(0, 1))`` of its ulps."""
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return
    steps = torch.round(ulps * torch.randn(tensor.shape, generator=generator, dtype=torch.float64))
    cpu = tensor.detach().to("cpu")
    moved = torch.where(cpu != 0, cpu.double() + steps * ulp(cpu).double(), cpu.double())
    tensor.copy_(moved.to(tensor.dtype).to(tensor.device))


def perturbed_model(model: torch.nn.Module, seed: int, ulps: float = DEFAULT_ULPS) -> torch.nn.Module:
    """A deep copy of ``model`` with every floating-point parameter moved by a few ulps (seeded, in
    parameter-name order); buffers are copied unchanged (see the module docstring for why)."""
    clone = copy.deepcopy(model)
    g = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for _, p in sorted(clone.named_parameters(), key=lambda kv: kv[0]):
            perturb_(p, g, ulps)
    return clone
