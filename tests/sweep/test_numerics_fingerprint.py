"""The numerics fingerprint: a tiny fixed computation whose output hash is pinned with NUMERICS_VERSION.

Seeded K/V-shaped tensors (built from Python's ``random`` with exact float arithmetic: no libm, no
torch RNG, so the inputs are the same bits on every platform) go through ``evalkit.kv``'s quantize,
encode and dequantize under a set of schemes (FP8 E4M3/E5M2/fnuz, INT8/INT4 symmetric and
asymmetric, FP4 with FP32, E4M3 and E8M0 scales, per tensor/head/block/token/group, nearest-even and
toward-zero rounding, a given static scale), in float32 and bfloat16. It is elementwise math and
exact reductions (amax), so its output is bit-reproducible across processors and interpreters.

If this test fails, the numbers evalkit computes changed: when that is meant, bump
``evalkit.sweep.code_identity.NUMERICS_VERSION`` and re-pin :data:`PINNED` with the line that
``python -m tests.sweep.test_numerics_fingerprint`` prints (from the repository root); when it is
not meant, the change is a bug.
"""

from __future__ import annotations

import hashlib
import random

import torch

from evalkit.kv.quantize import dequantize, encode_quantized, quantize
from evalkit.kv.scheme import parse_scheme
from evalkit.sweep.code_identity import NUMERICS_VERSION

PINNED = {
    # 1: "a0441bc39a540a5ab574b40de47b3cfeaad97e5493c6f68288eacd064578539c" (before the engine codecs joined)
    2: "d074a49c9d61d7118be4de781e86ba4478eec4996ee88a364f893033c2c6b289",  # per-token-head scales amax * fl(1/qmax)
}  # NUMERICS_VERSION -> SHA-256 of fingerprint()

SCHEMES = (
    "fp8_e4m3/tensor/dynamic",
    "fp8_e4m3/head/dynamic",
    "fp8_e4m3/block16/dynamic",
    "fp8_e4m3/token/dynamic",
    "fp8_e4m3/head/dynamic+rounding=rtz",
    "fp8_e5m2/head/dynamic",
    "fp8_e5m2/token/dynamic+rounding=rtz",
    "fp8_e4m3fnuz/tensor/dynamic",
    "int8/token/dynamic",
    "int8_asym/token/dynamic",
    "int4/group32/dynamic",
    "int4_asym/group16/dynamic",
    "nvfp4",
    "mxfp4",
    "mxfp8_e4m3",
    "sglang_fp4",
)
STATIC = ("fp8_e4m3/tensor/dynamic", "fp8_e5m2/tensor/dynamic")  # the same formats with a given scale
CODECS = (  # engine codecs (since version 2): K and V stored by the engine's own arithmetic
    "vllm:int8_per_token_head",
    "vllm:fp8_per_token_head",
    "vllm:int4_per_token_head",
    "vllm:turboquant_k8v4",
    "vllm:turboquant_4bit_nc",
    "vllm:turboquant_k3v4_nc",
    "vllm:turboquant_3bit_nc",
    "vllm:ultraquant_4bit",
    "vllm:nvfp4",
    "vllm:nvfp4_4over6",
    "llamacpp:q8_0",
    "llamacpp:q4_0",
    "llamacpp:q4_1",
    "llamacpp:q5_0",
    "llamacpp:q5_1",
    "llamacpp:iq4_nl",
)
SHAPE = (2, 3, 40, 64)  # (batch, KV heads, tokens, head_dim)


def inputs(seed: int) -> torch.Tensor:
    """Values sign * m * 2**e with m in [1, 2) from random.random() and e in [-12, 6] (outliers up to
    ~100, a few exact zeros and negative zeros, a few near the bottom of the range): exact in float64,
    rounded once to float32, so the same bits everywhere."""
    rng = random.Random(seed)
    values = []
    for _ in range(SHAPE[0] * SHAPE[1] * SHAPE[2] * SHAPE[3]):
        u = rng.random()
        if u < 0.01:
            values.append(0.0 if u < 0.005 else -0.0)
            continue
        e = rng.randrange(-12, 7) if u > 0.03 else rng.randrange(-30, -20)
        values.append((-1.0 if rng.random() < 0.5 else 1.0) * (1.0 + rng.random()) * 2.0**e)
    return torch.tensor(values, dtype=torch.float64).to(torch.float32).reshape(SHAPE)


def _update(h, t: torch.Tensor) -> None:
    t = t.detach().contiguous().cpu()
    h.update(f"{tuple(t.shape)} {t.dtype}\n".encode())
    if t.dtype == torch.bfloat16 or t.dtype.is_floating_point and t.element_size() == 1:  # no numpy dtype
        t = t.view(torch.int16 if t.element_size() == 2 else torch.uint8)
    h.update(t.numpy().tobytes())


def fingerprint() -> str:
    """SHA-256 over codes, scales, stored bytes and dequantized values of every scheme and input."""
    h = hashlib.sha256()
    for dtype in (torch.float32, torch.bfloat16):
        x = inputs(seed=0).to(dtype)
        for text in SCHEMES:
            scheme = parse_scheme(text)
            q = quantize(x, scheme.kv_format, scheme.granularity)
            h.update(f"{text} {dtype}\n".encode())
            for part in (q.codes, q.scale, q.zero, q.tensor_scale, q.stored):
                if part is not None:
                    _update(h, part)
            _update(h, encode_quantized(q, scheme.kv_format))
            _update(h, dequantize(q, dtype))
        for text in STATIC:
            scheme = parse_scheme(text)
            q = quantize(x, scheme.kv_format, scheme.granularity, scale=torch.tensor(0.0123, dtype=torch.float32))
            h.update(f"{text} static {dtype}\n".encode())
            _update(h, q.codes)
            _update(h, dequantize(q, dtype))
        for text in CODECS:
            scheme = parse_scheme(text)
            for role in ("k", "v"):
                q = quantize(x, scheme.kv_format, scheme.granularity, role=role)
                h.update(f"{text} {role} {dtype}\n".encode())
                _update(h, encode_quantized(q, scheme.kv_format))
                _update(h, dequantize(q, dtype))
    return h.hexdigest()


def test_the_fingerprint_is_pinned_with_the_numerics_version():
    got = fingerprint()
    assert NUMERICS_VERSION in PINNED, (
        f"NUMERICS_VERSION {NUMERICS_VERSION} has no pinned fingerprint: add {NUMERICS_VERSION}: {got!r} to PINNED"
    )
    assert got == PINNED[NUMERICS_VERSION], (
        f"evalkit.kv's numbers changed (fingerprint {got}). If meant: bump NUMERICS_VERSION in "
        "evalkit/sweep/code_identity.py and pin the line `python -m tests.sweep.test_numerics_fingerprint` "
        "prints in PINNED here; if not, this is a bug"
    )


def test_the_inputs_are_fixed_bits():
    x = inputs(seed=0)
    assert x.shape == SHAPE and x.dtype == torch.float32
    assert hashlib.sha256(x.numpy().tobytes()).hexdigest() == INPUTS_SHA256
    assert (x == 0).sum() > 0 and torch.signbit(x[x == 0]).any() and x.abs().max() < 128


INPUTS_SHA256 = "d4bea4af3a365a26118c38cca5272053f579f03d527f1ff9e473c6e8838eaada"


if __name__ == "__main__":
    print(f"PINNED = {{{NUMERICS_VERSION}: {fingerprint()!r}}}  # NUMERICS_VERSION -> SHA-256 of fingerprint()")
