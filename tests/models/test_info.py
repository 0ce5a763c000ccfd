"""evalkit.models.info: the two fingerprints that key every evaluation's baseline cache."""

from __future__ import annotations

import hashlib

import torch

from evalkit.models.info import config_hash, hash_weights, weights_fingerprint

from tests.tiny_models import tiny_model


def _written_out(model) -> str:
    """The fingerprint's definition, written out: name, shape, dtype and the first/last 64 values of each parameter."""
    h = hashlib.sha256()
    for name, t in model.named_parameters():
        flat = t.detach().reshape(-1)
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        h.update(torch.cat([flat[:64], flat[-64:]]).float().numpy().tobytes())
    return h.hexdigest()


def test_weights_fingerprint_is_its_definition_and_sees_a_weight_change():
    model = tiny_model("llama")
    before = weights_fingerprint(model)
    assert before == _written_out(model)
    h = hashlib.sha256()
    hash_weights(h, model)
    assert h.hexdigest() == before  # lmeval feeds the same bytes into its own key
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1.0
    assert weights_fingerprint(model) != before and config_hash(model.config) == config_hash(tiny_model("llama").config)


def test_weights_fingerprint_differs_between_seeds():
    assert weights_fingerprint(tiny_model("llama", seed=0)) != weights_fingerprint(tiny_model("llama", seed=1))
