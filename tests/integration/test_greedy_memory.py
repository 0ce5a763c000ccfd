"""A long greedy generation holds one step's logits at a time: measured by counting, at every call of
the output head, how many earlier steps' logits are still alive (weak references: deterministic, no
allocator statistics, no wall clock)."""

from __future__ import annotations

import weakref

import pytest
import torch

from evalkit import quantized_kv
from evalkit.integration.static_decode import greedy_generate

from tests.tiny_models import llama_head64


def _peak_live_logits(model, steps: int, scheme: str, on_logits=None) -> tuple[int, int]:
    """(most earlier steps' logits alive at once, head calls) over a ``steps``-token greedy generation."""
    live: list[weakref.ref] = []
    peak = [0]

    def count(module, args, out):
        peak[0] = max(peak[0], sum(r() is not None for r in live))
        live.append(weakref.ref(out))

    handle = model.get_output_embeddings().register_forward_hook(count)
    ids = torch.randint(3, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    try:
        with torch.inference_mode(), quantized_kv(model, scheme) as session:
            tokens = greedy_generate(
                session, model, ids, torch.ones_like(ids), steps, [], 0, compiled=False, on_logits=on_logits
            )
    finally:
        handle.remove()
    assert tokens.shape == (2, steps)
    return peak[0], len(live)


def test_a_long_generation_holds_one_steps_logits():
    model = llama_head64(kv_heads=1)
    peak, calls = _peak_live_logits(model, 300, "fp8_e4m3/tensor/dynamic")
    assert calls == 300
    assert peak == 0  # no earlier step's logits outlive their step: the head's output is dropped before the next


def test_what_the_caller_keeps_is_what_stays():
    """The counting sees kept logits: a caller that keeps every step's holds them all (so 0 above is a measurement)."""
    model = llama_head64(kv_heads=1)
    kept: list[torch.Tensor] = []
    peak, calls = _peak_live_logits(model, 16, "auto", on_logits=kept.append)
    assert calls == 16 and peak == 15 and len(kept) == 16


@pytest.mark.slow
def test_a_512_step_generation_on_the_embedded_model_holds_one_steps_logits(embedded):
    """The same count on a real model and vocabulary (49,152 logits a row): kept, 512 steps' logits would be
    about 200 MB. The length decides nothing the count sees (each step drops the last one's logits or keeps
    them). 512 steps take about 40 s here; the 2,048 this test once ran took 346 s."""
    peak, calls = _peak_live_logits(embedded.model, 512, "fp8_e4m3/tensor/dynamic")
    assert calls == 512 and peak == 0
