"""The same stored bytes whatever the device, shown without one (issue 39, item 4).

benchmarks/gpu_check.py section 7 encodes every modelled ``vllm:`` dtype on a GPU and on the CPU and
requires the same codes, scales and dequantized values. A CPU cannot run the GPU's kernels, but the
two ways a result comes to depend on where it runs can be ruled out here:

- an order-dependent float reduction (``sum``, ``norm``, ``matmul``, ...), whose order changes with
  the device, the layout, the batch and the thread count: every encoder must give the same bytes
  for the same values batched, split, permuted, strided or threaded differently, and no float
  reduction may run at all while a dtype encodes or decodes (recorded by a TorchFunctionMode);
- a division by a Python number, which torch on CUDA turns into a multiply by the float32
  reciprocal: none may run while a dtype encodes or decodes (the same recorder; the static check of
  evalkit/kv's source is tests/kv/test_no_scalar_division.py).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.overrides import TorchFunctionMode

from evalkit.kv.codec import codec_for, is_codec
from evalkit.kv.codecs.vllm.dtypes import VLLM_DTYPES, Arch, Status
from evalkit.kv.codecs.vllm.family import vllm_scheme
from evalkit.kv.quantize import dequantize, encode_quantized, quantize

PER_TENSOR = ("fp8", "fp8_e4m3", "fp8_e5m2")  # one scale per layer: no reduction, no division by design
DTYPES = [n for n, d in VLLM_DTYPES.items() if d.status is Status.MODELLED and n not in PER_TENSOR]


# vLLM 0.33's Octave caches sum and take square roots with torch's own ops, as vLLM's reference
# (rocm_octave.py _quantize_lut) does, so they are that reference's bytes on the CPU (tests/kv/test_vllm_octave.py);
# a fixed order would differ from it (evalkit/kv/codecs/vllm/octave.py says by how much). Their float reductions
# are the one exception below; every other rule (no division by a Python number, layout, batch and threads) holds.
TORCH_ORDER = ("octave_k3v4", "octave_k3v3", "octave_k3v3_compact")


def test_every_dtype_gpu_checks_section_7_compares_is_here():
    assert len(DTYPES) == 15, DTYPES


def inputs(name: str, role: str, batch: int = 3, tokens: int = 10, seed: int = 0) -> torch.Tensor:
    """Seeded float32 K or V as gpu_check's section 7 builds them: normal values, four outlier channels
    (x20), an all-zero token; MLA rows are one latent (512) or RoPE key (64) per token."""
    mla = VLLM_DTYPES[name].arch is Arch.MLA
    d = (512 if role == "k" else 64) if mla else 64
    g = torch.Generator().manual_seed(seed + (role == "v"))
    x = torch.randn(batch, 1 if mla else 4, tokens, d, generator=g) * torch.logspace(-2, 2, tokens)[:, None]
    x[..., :4] *= 20.0
    x[:, :, 0] = 0.0
    return x


def encoded(name: str, x: torch.Tensor, role: str) -> dict[str, torch.Tensor]:
    """What gpu_check compares: the stored bytes, the scales kept beside them, the dequantized values
    (each as raw bits, so that -0.0 and NaN payloads count too)."""
    s = vllm_scheme(name)
    q = quantize(x, s.kv_format, s.granularity, role=role)
    out = {"bytes": encode_quantized(q, s.kv_format).contiguous().view(torch.uint8)}
    out["values"] = dequantize(q, torch.float32).contiguous().view(torch.int32)
    if q.scale is not None and q.scale.numel():
        out["scale"] = q.scale.float().contiguous().view(torch.int32)
    return out


def assert_same(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), what
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: {k} differ in {int((a[k] != b[k]).sum())} places"


def _cat(parts: list[dict], dim: int) -> dict:
    return {k: torch.cat([p[k] for p in parts], dim=dim) for k in parts[0]}


@contextlib.contextmanager
def threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("role", ["k", "v"])
def test_the_bytes_do_not_depend_on_batch_layout_order_or_threads(name, role):
    x = inputs(name, role)
    want = encoded(name, x, role)
    assert_same(_cat([encoded(name, x[i : i + 1], role) for i in range(3)], 0), want, "one batch row at a time")
    assert_same(_cat([encoded(name, x[:, :, :4], role), encoded(name, x[:, :, 4:], role)], 2), want, "tokens split")
    strided = x.transpose(0, 2).contiguous().transpose(0, 2)
    assert not strided.is_contiguous()
    assert_same(encoded(name, strided, role), want, "non-contiguous input")
    flipped = encoded(name, x.flip(1, 2), role)
    assert_same({k: v.flip(1, 2) for k, v in flipped.items()}, want, "heads and tokens reversed")
    bigger = encoded(name, torch.cat([x, inputs(name, role, batch=5, seed=7)]), role)
    assert_same({k: v[:3] for k, v in bigger.items()}, want, "inside a larger batch")
    with threads(1):
        one = encoded(name, x, role)
    with threads(2):
        two = encoded(name, x, role)
    assert_same(one, want, "1 thread")
    assert_same(two, want, "2 threads")


FLOAT_REDUCTIONS = {
    torch.sum, torch.Tensor.sum, torch.nansum, torch.Tensor.nansum, torch.mean, torch.Tensor.mean,
    torch.norm, torch.Tensor.norm, torch.linalg.norm, torch.linalg.vector_norm, torch.prod, torch.Tensor.prod,
    torch.cumsum, torch.Tensor.cumsum, torch.std, torch.var, torch.matmul, torch.Tensor.matmul,
    torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm, torch.bmm, torch.einsum, torch.dot, torch.Tensor.dot,
    torch.tensordot, torch.addmm, torch.nn.functional.linear, torch.logsumexp,
}  # fmt: skip
DIVISIONS = {
    torch.div, torch.divide, torch.true_divide, torch.Tensor.div, torch.Tensor.div_, torch.Tensor.divide,
    torch.Tensor.true_divide, torch.Tensor.__truediv__, torch.Tensor.__itruediv__,
}  # fmt: skip


class Recorder(TorchFunctionMode):
    """Every float reduction and every division by a Python number, by op name, while active."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        first = args[0] if args else None
        if func in FLOAT_REDUCTIONS and isinstance(first, torch.Tensor) and first.dtype.is_floating_point:
            self.found.append(f"float reduction {getattr(func, '__name__', func)}")
        if func in DIVISIONS:
            divisor = args[1] if len(args) > 1 else kwargs.get("other")
            if isinstance(divisor, (int, float)) and not isinstance(divisor, bool):
                self.found.append(f"division by the Python number {divisor!r}")
        return func(*args, **kwargs)


@pytest.mark.parametrize("name", DTYPES)
def test_no_float_reduction_and_no_division_by_a_python_number_runs(name):
    s = vllm_scheme(name)
    with Recorder() as rec:
        for role in "kv":
            x = inputs(name, role, batch=2, tokens=6)
            q = quantize(x, s.kv_format, s.granularity, role=role)
            encode_quantized(q, s.kv_format)
            dequantize(q, torch.float32)
            if is_codec(s.recipe):  # the codecs' own read of their bytes (the storage cache's path)
                codec_for(s.recipe).decode(q.stored, role, x.shape[-1])
    found = [f for f in rec.found if not (name in TORCH_ORDER and f == "float reduction sum")]
    assert found == [], sorted(set(found))
    if name in TORCH_ORDER:
        assert "float reduction sum" in rec.found  # the exception is needed, and is only that


def test_the_recorder_sees_what_it_forbids():
    with Recorder() as rec:
        x = torch.ones(4, 8)
        x.sum(-1), x.norm(dim=-1), x @ x.T, x / 3.0, torch.div(x, 2)
        x.int().sum(), x / torch.tensor(3.0), 3.0 / x  # allowed: integer sum, tensor divisor, reciprocal
    assert rec.found == [
        "float reduction sum",
        "float reduction norm",
        "float reduction matmul",
        "division by the Python number 3.0",
        "division by the Python number 2",
    ]
