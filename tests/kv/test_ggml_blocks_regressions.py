"""Cases the kernel comparison found on the embedded model's own K/V rows, kept as plain checks."""

from __future__ import annotations

import numpy as np
import torch

from evalkit.kv.codecs.llamacpp.ggml_blocks import encode


def test_q8_0_divides_127_by_amax_once():
    """ggml's x86 q8_0 takes id = 127 / amax in one float32 division. torch's ``127.0 / t`` multiplies by
    the reciprocal instead (one ulp off on a quarter of all values), which turned this model K value's
    x * id from the tie -30.5 (even: -30) into -30.500002 (-31)."""
    for amax, x, want in ((5.3165016, -1.2767977, -30), (1.2082872, 0.6041436, 64)):
        block = np.zeros(32, np.float32)
        block[0], block[1] = amax, x
        idv = np.float32(127.0) / np.float32(amax)
        assert np.float32(np.float32(x) * idv) in (-30.5, 63.5)  # the product is an exact tie
        codes = encode("q8_0", torch.from_numpy(block)).numpy()[2:].view(np.int8)
        assert codes[0] == 127 and codes[1] == want
