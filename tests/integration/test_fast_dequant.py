"""The fused K/V read (evalkit.integration.fast_dequant) against the plain torch operations it
replaces, bit for bit: every byte value of every 1-byte code dtype, every scale layout the storage
caches hand it, with and without a zero point, into float32, bfloat16 and float16; and a storage
cache's reads with the kernel on and off."""

from __future__ import annotations

import pytest
import torch

from evalkit.integration import fast_dequant
from evalkit.integration.stored_read import dequantize_stored, read_stored
from evalkit.kv.scheme import parse_scheme

CODE_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.int8, torch.uint8]


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (every NaN counts as one value: stored codes are never NaN, the cast may carry its payload)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    nan = torch.isnan(a.float())
    if not torch.equal(nan, torch.isnan(b.float())):
        return False
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[a.dtype]
    return torch.equal(a[~nan].view(ints), b[~nan].view(ints))


def _all_codes(dtype: torch.dtype, b: int, h: int, s: int, d: int) -> torch.Tensor:
    """Every byte value, repeated to fill (b, h, s, d), as codes of ``dtype`` (a non-contiguous slice, as stored)."""
    n = b * h * (s + 3) * d
    raw = (torch.arange(n) * 37 % 256).to(torch.uint8).view(b, h, s + 3, d)
    return raw.view(dtype)[:, :, :s]


def _scales(b: int, h: int, s: int, d: int) -> dict[str, tuple[torch.Tensor, bool]]:
    g = torch.Generator().manual_seed(0)

    def rand(*shape):  # scales across float32's range, subnormal-producing ones included
        return torch.exp2(torch.randint(-140, 20, shape, generator=g).float()) * (1 + torch.rand(shape, generator=g))

    return {
        "fixed": (rand(1, 1, 1, 1), False),
        "tensor": (rand(b, 1, 1, 1), False),
        "head": (rand(b, h, 1, 1), False),
        "token": (rand(b, h, s, 1), False),
        "block": (rand(b, h, s)[..., None], False),
        "group16": (rand(b, h, s, d // 16), True),
    }


def _check_layouts(code_dtype, out_dtype, layouts):
    b, h, s, d = 2, 3, 40, 64
    codes = _all_codes(code_dtype, b, h, s, d)
    for name, (scale, grouped) in _scales(b, h, s, d).items():
        if name not in layouts:
            continue
        zeros = [None]
        if code_dtype in (torch.int8, torch.uint8) and name != "block":
            zeros.append(torch.randint(0, 256, scale.shape, generator=torch.Generator().manual_seed(1)).float())
        for zero in zeros:
            got = fast_dequant.dequantize(codes, scale, zero, out_dtype, grouped)
            want = fast_dequant.plain(codes, scale, zero, out_dtype, grouped)
            assert _bits_equal(got, want), (name, zero is not None)
    assert not fast_dequant._failed, fast_dequant._failed  # the kernel ran, not the fallback


ALL_LAYOUTS = ("fixed", "tensor", "head", "token", "block", "group16")


@pytest.mark.parametrize(
    "code_dtype,out_dtype,layouts",
    [
        (torch.float8_e4m3fn, torch.float32, ALL_LAYOUTS),
        (torch.float8_e5m2, torch.float32, ("tensor", "group16")),
        (torch.uint8, torch.float32, ("token", "group16")),
        (torch.float8_e4m3fn, torch.bfloat16, ("token",)),
    ],
    ids=str,
)
def test_fused_read_equals_plain_operations(code_dtype, out_dtype, layouts):
    """Every byte value, read through the kernel and through the plain operations: the same bits
    (each variant is a compile: the whole matrix is the slow test below)."""
    _check_layouts(code_dtype, out_dtype, layouts)


@pytest.mark.slow
@pytest.mark.parametrize("code_dtype", CODE_DTYPES, ids=str)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_fused_read_equals_plain_operations_every_variant(code_dtype, out_dtype):
    _check_layouts(code_dtype, out_dtype, ALL_LAYOUTS)


def test_plain_operations_are_dequantize_stored():
    """The fused kernel's reference is the storage caches' own read (so the kernel is tested against it)."""
    b, h, s, d = 1, 2, 8, 32
    for scheme, code_dtype in (
        ("fp8_e4m3/token/dynamic", torch.float8_e4m3fn),
        ("int8_asym/group16/dynamic", torch.uint8),
    ):
        sch = parse_scheme(scheme)
        fmt = sch.kv_format
        codes = _all_codes(code_dtype, b, h, s, d)
        scale, grouped = _scales(b, h, s, d)["group16" if "group" in scheme else "token"]
        zero = torch.full(scale.shape, 7.0) if fmt.asymmetric else None
        want = dequantize_stored(codes, fmt, sch.granularity, scale, zero)
        assert _bits_equal(fast_dequant.plain(codes, scale, zero, torch.float32, grouped), want)
        assert _bits_equal(read_stored(codes, fmt, sch.granularity, scale, zero, torch.float32), want)


def test_growing_sequence_compiles_once():
    """One variant, many lengths: compiled once (dynamic sizes), not once per decode step."""
    from torch._dynamo.utils import counters

    scale = torch.tensor(0.5).reshape(1, 1, 1, 1)
    fast_dequant.dequantize(_all_codes(torch.float8_e5m2, 1, 2, 5, 16), scale, None, torch.float32, False)
    before = counters["stats"]["unique_graphs"]
    for s in (6, 7, 19, 300):
        codes = _all_codes(torch.float8_e5m2, 1, 2, s, 16)
        out = fast_dequant.dequantize(codes, scale, None, torch.float32, False)
        assert _bits_equal(out, fast_dequant.plain(codes, scale, None, torch.float32, False))
    assert counters["stats"]["unique_graphs"] == before


def test_a_change_of_grad_mode_does_not_recompile():
    """The same variant read with gradients on and off, one after another (a training-mode caller, then an
    evaluation under no_grad): one graph, not one per grad mode. A recompile per grad mode once filled dynamo's
    cache of a variant in a long process and sent every later read through the slow plain operations."""
    from torch._dynamo.utils import counters

    scale = torch.tensor(0.25).reshape(1, 1, 1, 1)
    codes = _all_codes(torch.float8_e4m3fn, 1, 2, 9, 16)
    fast_dequant.dequantize(codes, scale, None, torch.bfloat16, False)
    before = counters["stats"]["unique_graphs"]
    for grad in (True, False, True, False):
        with torch.set_grad_enabled(grad):
            out = fast_dequant.dequantize(codes, scale, None, torch.bfloat16, False)
        assert _bits_equal(out, fast_dequant.plain(codes, scale, None, torch.bfloat16, False))
    assert counters["stats"]["unique_graphs"] == before
    assert not fast_dequant._failed, fast_dequant._failed


def test_the_layouts_of_a_long_process_never_fill_a_variants_cache():
    """One variant read through more layouts than dynamo keeps graphs per function (8): slices of longer caches
    and whole ones, views and copies, batch equal to heads and not, per-head and per-token scales, on 1 and 2
    threads. Each layout and thread count is its own compiled function, so no guard fails, nothing recompiles
    and the fast read never falls back (it once did, for every later read of the process); every read has the
    plain operations' bits."""
    from torch._dynamo.utils import counters

    threads = torch.get_num_threads()
    graphs, kernels, reads = counters["stats"]["unique_graphs"], len(fast_dequant._KERNELS), 0
    try:
        for n_threads in (1, 2):
            torch.set_num_threads(n_threads)
            for b, h, capacity, s in ((2, 2, 64, 10), (2, 4, 64, 10), (3, 2, 32, 32), (4, 4, 16, 7)):
                cache = _all_codes(torch.float8_e4m3fn, b, h, capacity, 16)
                for codes in (cache[:, :, :s], cache, cache[:, :, :s].clone()):
                    n = codes.shape[2]
                    for scale in (torch.full((1, h, 1, 1), 0.5), torch.rand(b, h, capacity, 1)[:, :, :n]):
                        out = fast_dequant.dequantize(codes, scale, None, torch.float32, False)
                        assert _bits_equal(out, fast_dequant.plain(codes, scale, None, torch.float32, False))
                        reads += 1
    finally:
        torch.set_num_threads(threads)
    assert reads > torch._dynamo.config.recompile_limit and not fast_dequant._failed, fast_dequant._failed
    assert counters["stats"]["unique_graphs"] - graphs == len(fast_dequant._KERNELS) - kernels  # one graph each


def test_the_fallback_names_the_mend_of_its_cause():
    """A recompile limit is named as such (its mend is the limit, not a compiler); any other failure asks for a
    C++ compiler, which inductor needs on the CPU."""
    from torch._dynamo.exc import FailOnRecompileLimitHit

    assert "recompile_limit" in fast_dequant._mend(FailOnRecompileLimitHit("Hard failure due to fullgraph=True"))
    assert "compiler" not in fast_dequant._mend(FailOnRecompileLimitHit("x"))
    assert fast_dequant._mend(RuntimeError("no cc")) == "install a C++ compiler"


@pytest.mark.parametrize(
    "scheme",
    ["fp8_e4m3/tensor/dynamic", "fp8_e4m3/head/dynamic", "fp8_e5m2/block16/dynamic", "int8_asym/token/dynamic"],
)
def test_storage_cache_reads_the_same_with_the_kernel_off(scheme, tiny, monkeypatch):
    """A prefill and decode steps through the storage cache: every read equal with the kernel on and off."""
    from evalkit.integration.install import quantized_kv

    g = torch.Generator().manual_seed(3)
    cfg = tiny.model.config
    shape = (2, cfg.num_key_value_heads, 9, cfg.hidden_size // cfg.num_attention_heads)
    steps = [torch.randn(*shape, generator=g) * 4] + [
        torch.randn(*shape[:2], 1, shape[3], generator=g) for _ in range(5)
    ]

    def reads(flag: str) -> list[torch.Tensor]:
        monkeypatch.setenv("EVALKIT_FAST_DEQUANT", flag)
        out = []
        with quantized_kv(tiny.model, scheme) as session:
            cache = session.new_cache(None)
            for x in steps:
                k, v = cache.update(x, -x, 0)
                out += [k.clone(), v.clone()]
        return out

    for a, b in zip(reads("1"), reads("0"), strict=True):
        assert _bits_equal(a, b)
