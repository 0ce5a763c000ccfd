"""block<N>/dynamic over a long decode: every block's stored codes and scale are a one-shot encode
of the tokens it holds, however they arrived (a prefill, then one token per step).

The store keeps the open block's K/V as they arrived and re-encodes the whole block from them when
a token joins (evalkit.integration.stored_blocks). Re-encoding from the dequantized values instead would
drift: under ``+rounding=rtz`` ``(c * s) / s`` lands just below ``c`` for some codes, so each
re-encode truncates one more step; a test below shows that drift is real on these very inputs, so
the equality checked here is not vacuous.
"""

from __future__ import annotations

import pytest
import torch

from evalkit.integration.growing import Padding
from evalkit.integration.stored import StoredTensor
from evalkit.kv.quantize import dequantize, encode_quantized, quantize
from evalkit.kv.scheme import parse_scheme

PREFILL, STEPS, PAD = 5, 64, 3
SCHEMES = ["fp8_e4m3/block16/dynamic+rounding=rtz", "fp8_e4m3/block16/dynamic"]


def stream(dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """(2, 3, PREFILL + STEPS, 64) K-like values: per-token magnitudes that vary, so block amaxes grow
    as tokens join (and the scale of an open block changes)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, PREFILL + STEPS, 64, generator=g)
    x = x * torch.rand(1, 1, PREFILL + STEPS, 1, generator=g).mul(6.0).exp()
    return x.to(dtype)


def decoded_store(scheme: str, x: torch.Tensor, padded: bool) -> StoredTensor:
    """The stream written as a prefill of PREFILL tokens and then STEPS single-token writes; with
    ``padded``, row 1 of the first write is left-padded by PAD positions (the per-sequence path)."""
    s = parse_scheme(scheme)
    st = StoredTensor(s.kv_format, s.granularity, None, True)
    first = x[:, :, :PREFILL]
    if padded:
        pad = torch.zeros(*x.shape[:2], PAD, x.shape[3], dtype=x.dtype)
        first = torch.cat([pad, first], dim=2)
        mask = torch.ones(2, PAD + PREFILL, dtype=torch.long)
        mask[1, :PAD] = 0
        first[0, :, :PAD] = x[0, :, :PAD]  # row 0 starts PAD tokens earlier: its blocks begin at 0
        st.append(first, Padding(mask))
    else:
        st.append(first)
    for t in range(PREFILL, x.shape[2]):
        st.append(x[:, :, t : t + 1])
    return st


def one_shot(scheme: str, x: torch.Tensor):
    s = parse_scheme(scheme)
    q = quantize(x, s.kv_format, s.granularity)
    return encode_quantized(q, s.kv_format), q.scale, dequantize(q, x.dtype)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("padded", [False, True], ids=["one-piece", "per-sequence"])
def test_64_decode_steps_store_a_one_shot_encode_of_each_block(scheme, dtype, padded):
    x = stream(dtype)
    st = decoded_store(scheme, x, padded)
    rows = [(0, 0), (1, PAD)] if padded else [(0, 0), (1, 0)]
    for b, off in rows:
        mine = x[b : b + 1] if not (padded and b == 0) else torch.cat([x[:1, :, :PAD], x[:1]], dim=2)
        codes, scale, values = one_shot(scheme, mine)
        got_codes = st.codes[b : b + 1, :, off:]
        n_blocks = scale.shape[2]
        assert got_codes.shape == codes.shape
        assert torch.equal(got_codes.view(torch.uint8), codes.view(torch.uint8)), "stored codes"
        assert torch.equal(st.scale[b : b + 1, :, :n_blocks], scale), "block scales"
        assert torch.equal(st.values[b : b + 1, :, off:], values), "the values attention reads"
    assert torch.equal(st.decoded().to(dtype), st.values)  # and they are the stored bytes, decoded


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_re_encoding_from_dequantized_values_would_drift_under_rtz(dtype):
    """The check above can fail: re-encoding an open block from its dequantized values (the store's
    old way) gives different codes than a one-shot encode on this very stream under rtz."""
    scheme = SCHEMES[0]
    s = parse_scheme(scheme)
    fmt, gran, n = s.kv_format, s.granularity, s.granularity.size
    x = stream(dtype)
    y = c = x[:, :, :0]  # dequantized values and stored codes, re-encoded block by block as the old store did
    c = c.to(fmt.storage_dtype)
    for lo, hi in [(0, PREFILL)] + [(t, t + 1) for t in range(PREFILL, x.shape[2])]:
        first = lo // n * n
        region = torch.cat([y[:, :, first:lo].float(), x[:, :, lo:hi].float()], dim=2)
        q = quantize(region, fmt, gran)
        y = torch.cat([y[:, :, :first], dequantize(q, dtype)], dim=2)
        c = torch.cat([c[:, :, :first], encode_quantized(q, fmt)], dim=2)
    new, _, _ = one_shot(scheme, x)
    differ = int((c.view(torch.uint8) != new.view(torch.uint8)).sum())
    print(f"{dtype}: {differ} of {new.numel()} codes differ")
    assert differ > 0, "the old re-encode gives the same codes here: this stream does not exercise the drift"
