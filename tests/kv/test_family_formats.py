"""Formats that refuse what they cannot store, and a codec family that brings its own element format.

evalkit's own store (:func:`evalkit.kv.quantize.encode` / ``decode``) holds 8-bit codes and 4-bit codes two
per byte. An INT6 row added to the format table the way the table's checklist describes would have been
cast to uint8 (-15 read back as 241); it is refused in one line instead. A test-only family
(tests/toy_int6_codec.py) registers an INT6 element format of its own, packs four 6-bit codes in three
bytes, and round-trips through the storage cache, held against a plain numpy reading of its bytes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from evalkit.errors import SchemeError
from evalkit.kv import codec, formats
from evalkit.kv.quantize import decode, encode
from evalkit.kv.scheme import parse_scheme

from tests.tiny_models import tiny_model


def test_an_int6_row_is_refused_by_encode_and_decode_in_one_line():
    int6 = formats._int("int6", 6, False, "INT6 symmetric, codes -31..31")  # step 1 of the checklist
    codes = torch.tensor([[-15.0, 3.0, 31.0, -31.0]])
    for call in (lambda: encode(codes, int6), lambda: decode(codes.to(torch.uint8), int6)):
        with pytest.raises(SchemeError, match="not 6-bit signed codes in uint8") as e:
            call()
        assert "\n" not in str(e.value) and "codec family" in str(e.value)
    assert formats.storable(formats.FORMATS["int8"]) is None and formats.storable(formats.FORMATS["int4"]) is None


@pytest.fixture
def int6_family():
    from tests.toy_int6_codec import INT6, INT6_FAMILY

    formats.register_format(INT6)
    codec.register_family(INT6_FAMILY)
    yield INT6_FAMILY
    codec.unregister_family("toy6")


def _reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, values) of the toy6 slot for K or V (B, H, S, D), read plainly from the module docstring."""
    amax = np.abs(x).max(-1, keepdims=True)
    scale = np.where(amax > 0, amax / 31, 1).astype(np.float16)
    codes = np.clip(np.round(x / scale.astype(np.float32)), -31, 31).astype(np.int64)
    out = np.zeros((*x.shape[:-1], 3 * x.shape[-1] // 4 + 2), np.uint8)
    for i in range(x.shape[-1] // 4):
        word = np.zeros(x.shape[:-1], np.int64)
        for j in range(4):
            word |= (codes[..., 4 * i + j] & 0x3F) << (6 * j)
        for k in range(3):
            out[..., 3 * i + k] = (word >> (8 * k)) & 0xFF
    out[..., -2:] = scale.view(np.uint8)
    return out, codes.astype(np.float32) * scale.astype(np.float32)


def test_a_family_with_its_own_int6_format_round_trips(int6_family):
    from transformers import DynamicCache

    from evalkit.integration.hf_compat import cache_inputs
    from evalkit.integration.install import quantized_kv
    from evalkit.kv.memory import bytes_per_token
    from evalkit.models.info import kv_layout

    scheme = parse_scheme("toy6:int6_per_token_head")
    assert str(scheme) == "toy6:int6_per_token_head" and scheme.kv_format.bits == 6
    with pytest.raises(SchemeError, match="unknown KV format 'toy_int6'"):  # evalkit's grammar never names it
        parse_scheme("toy_int6/token/dynamic")
    model = tiny_model("llama")
    layout = kv_layout(model.config)
    ids = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    raw = DynamicCache()
    model(ids, **cache_inputs(model, raw))
    with quantized_kv(model, scheme) as session:
        cache = session.new_cache()
        quantized = model(ids, **cache_inputs(model, cache)).logits
    first = cache.layers[0]  # layer 0's K/V do not depend on the cache: the raw run's are its input
    for st, x in ((first.k, raw.layers[0].keys), (first.v, raw.layers[0].values)):
        want_bytes, want_values = _reference(x.detach().float().numpy())
        np.testing.assert_array_equal(st.codes.numpy(), want_bytes)
        np.testing.assert_array_equal(st.decoded().numpy(), want_values)
    d, heads, layers = layout.head_dim, layout.num_kv_heads, layout.num_layers
    assert cache.nbytes() == 2 * 9 * layers * 2 * heads * (3 * d // 4 + 2)
    assert bytes_per_token(layout, scheme) == layers * 2 * heads * (3 * d // 4 + 2)
    assert 0 < (quantized - model(ids).logits).abs().max() < 1.0  # 6-bit K/V: a small change, not none
