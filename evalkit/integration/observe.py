"""Observe a model's post-RoPE K/V without changing them (calibration statistics).

``observe_kv(model, observer)`` calls ``observer(which, layer_idx, x, valid)`` with ``which`` "k"
or "v", x shaped (batch, kv_heads, seq, head_dim) and ``valid`` (batch, seq) marking real tokens
(None when nothing is padded), for every attention call inside the block, then runs the model's
own attention on the unchanged K/V. Statistics are thus taken exactly where the storage cache
quantizes (after RoPE, per KV head, before the GQA repeat), and the forward is that of the plain
model, so calibration cannot be poisoned by its own quantization.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from evalkit.errors import EvalkitError
from evalkit.integration.attention import attention_handler, key_validity
from evalkit.models.info import check_supported, kv_layout

Observer = Callable[[str, int, torch.Tensor, "torch.Tensor | None"], None]


@contextlib.contextmanager
def observe_kv(model, observer: Observer) -> Iterator[None]:
    check_supported(model)
    if kv_layout(model.config).is_mla:
        raise EvalkitError("calibration of multi-head latent attention models is not supported: use dynamic scales")

    def handler(module, query, key, value, attention_mask, inner, **kwargs):
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            raise EvalkitError(
                f"attention module {type(module).__name__} has no layer_idx: evalkit cannot tell its layer"
            )
        valid = key_validity(attention_mask, key.shape[0], key.shape[-2])
        observer("k", layer, key, valid)
        observer("v", layer, value, valid)
        return inner(module, query, key, value, attention_mask, **kwargs)

    with attention_handler(model, handler):
        yield
