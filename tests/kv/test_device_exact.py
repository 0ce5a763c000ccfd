"""evalkit.kv.device_exact against independent references: exact rational arithmetic (fractions) for
the reciprocal, the product and the quotient; a plain numpy loop for the fixed-order sum; a 40-digit
``decimal`` log2 for the exponent snaps; and vLLM's per-token-head scale ``fl(amax * fl(1/QMAX))`` on
its edge cases (powers of two, subnormal amax, the 1e-6 floor, amax where the IEEE quotient differs)."""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
import torch

from evalkit.kv import device_exact as de
from evalkit.kv.codecs.vllm.per_token_head import SCALE_MIN, scales
from evalkit.kv.formats import FORMATS

F32 = np.float32


def round_to(q: Fraction, bits: int, min_exp: int = -126, max_exp: int = 127) -> float:
    """q rounded to nearest even with ``bits`` significant bits and exponents in [min_exp, max_exp]
    (subnormals below, inf above), exactly: float32 is (24, -126, 127), bfloat16 (8, -126, 127)."""
    if q == 0:
        return 0.0
    sign, q = (-1.0 if q < 0 else 1.0), abs(q)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    while Fraction(2) ** e > q:
        e -= 1
    while Fraction(2) ** (e + 1) <= q:
        e += 1
    quantum = Fraction(2) ** (max(e, min_exp) - bits + 1)
    n = q / quantum
    whole, rest = math.floor(n), n - math.floor(n)
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and whole % 2):
        whole += 1
    if whole * quantum >= Fraction(2) ** (max_exp + 1):
        return sign * math.inf
    return sign * float(whole * quantum)


def f32(v) -> float:
    return round_to(Fraction(float(v)), 24)


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


# -- reciprocal, product, quotient ---------------------------------------------------------------
CONSTANTS = (127.0, 448.0, 15.0, 7.0, 6.0, 3.0, 0.156, 2688.0, 57344.0)


@pytest.mark.parametrize("c", CONSTANTS)
def test_the_reciprocal_is_the_correctly_rounded_float32_one(c):
    want = round_to(1 / Fraction(f32(c)), 24)
    assert float(de.reciprocal(c)) == want == float(F32(1) / F32(c))
    assert de.reciprocal(c).dtype == torch.float32 and de.reciprocal(c).dim() == 0


def edge_amax(q: float) -> list[float]:
    """Powers of two (normal and subnormal), subnormals, the neighbours of the 1e-6 floor's preimage, the
    largest float32, and seeded values over many binades."""
    floor_preimage = float(F32(F32(1e-6) * F32(q)))
    near_floor = [float(np.nextafter(F32(floor_preimage), F32(s * np.inf))) for s in (-1, 1)] + [floor_preimage]
    powers = [2.0**k for k in range(-149, 128, 3)]
    subnormal = [2.0**-149, 3 * 2.0**-149, 1e-40, float(np.nextafter(F32(2.0**-126), F32(0)))]
    rng = np.random.default_rng(0)
    spread = (rng.random(400) + 0.5) * 2.0 ** rng.integers(-40, 40, 400)
    return [f32(v) for v in (*powers, *subnormal, *near_floor, float(np.finfo(F32).max), *spread)]


@pytest.mark.parametrize("c", CONSTANTS)
def test_times_reciprocal_rounds_the_exact_product_once(c):
    amax = edge_amax(c)
    got = de.times_reciprocal(t(amax), c).tolist()
    inv = Fraction(float(F32(1) / F32(c)))
    assert got == [round_to(Fraction(a) * inv, 24) for a in amax]
    with np.errstate(over="ignore"):  # the largest amax over 0.156: inf, as float32 gives it
        assert got == [float(F32(a) * (F32(1) / F32(c))) for a in amax]


@pytest.mark.parametrize("c", CONSTANTS)
def test_divide_is_the_correctly_rounded_quotient(c):
    amax = edge_amax(c)
    got = de.divide(t(amax), c).tolist()
    assert got == [round_to(Fraction(a) / Fraction(f32(c)), 24) for a in amax]


def test_a_16_bit_input_is_multiplied_in_float32_and_rounded_once():
    x = torch.tensor([1.0, 3.0, 1000.0, 0.00390625, 65504.0]).to(torch.bfloat16)
    got = de.times_reciprocal(x, 6.0)
    want = [round_to(Fraction(float(v)) * Fraction(float(F32(1) / F32(6))), 24) for v in x.float().tolist()]
    assert got.dtype == torch.bfloat16 and got.float().tolist() == [round_to(Fraction(w), 8) for w in want]


@pytest.mark.parametrize("fmt,qmax", [("int8", 127.0), ("fp8_e4m3", 448.0)])
def test_per_token_head_scales_are_the_compiled_kernels_on_the_edge_cases(fmt, qmax):
    """vLLM's compiled ``_reshape_cache_per_token_head`` stores ``max(fl(amax * fl(1/QMAX)), 1e-6)`` (H200)."""
    amax = edge_amax(qmax)
    x = torch.zeros(len(amax), 32)
    x[:, 0] = -t(amax)  # the amax is |x|: a negative value carries it
    x[:, 1] = t(amax) * 0.5
    got = scales(x[None, None], FORMATS[fmt]).reshape(-1).tolist()
    inv = Fraction(float(F32(1) / F32(qmax)))
    want = [max(round_to(Fraction(a) * inv, 24), f32(SCALE_MIN)) for a in amax]
    assert got == want
    assert min(got) == f32(SCALE_MIN) and max(got) > 1e35  # both ends of the range are probed


@pytest.mark.parametrize("qmax", [127.0, 448.0])
def test_the_scale_is_not_the_ieee_quotient_where_the_two_differ(qmax):
    """On seeded amax, the product and the quotient differ often (448: about half; 127: a few percent), and
    the scale is the product on every one of them."""
    rng = np.random.default_rng(1)
    amax = t((rng.random(4000) + 0.5) * 2.0 ** rng.integers(-5, 10, 4000))
    product, quotient = de.times_reciprocal(amax, qmax), amax / torch.tensor(qmax)
    differ = product != quotient
    assert int(differ.sum()) > (1000 if qmax == 448.0 else 40), int(differ.sum())
    x = torch.zeros(4000, 32)
    x[:, 3] = amax
    fmt = FORMATS["int8" if qmax == 127.0 else "fp8_e4m3"]
    got = scales(x[None, None], fmt).reshape(-1)
    assert torch.equal(got[differ], product[differ]) and not bool((got[differ] == quotient[differ]).any())


# -- the fixed-order sum -------------------------------------------------------------------------
def np_tree_sum(x: np.ndarray) -> np.ndarray:
    """A plain reading of the order: zero-pad to a power of two, then add the upper half onto the lower."""
    x = x.astype(F32)
    n = x.shape[-1]
    width = 1
    while width < n:
        width *= 2
    x = np.concatenate([x, np.zeros((*x.shape[:-1], width - n), F32)], axis=-1)
    while x.shape[-1] > 1:
        h = x.shape[-1] // 2
        x = (x[..., :h] + x[..., h:]).astype(F32)
    return x[..., 0]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 37, 64, 128, 129])
def test_tree_sum_is_the_pairwise_order_bit_for_bit(n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((50, n)) * 10.0 ** rng.integers(-3, 4, (50, n))).astype(F32)
    got = de.tree_sum(torch.from_numpy(x))
    assert np.array_equal(got.numpy(), np_tree_sum(x))
    assert de.tree_sum(torch.from_numpy(x), keepdim=True).shape == (50, 1)
    exact = [float(sum(Fraction(float(v)) for v in row)) for row in x]
    bound = [math.ceil(math.log2(max(n, 2))) * 2.0**-24 * float(np.abs(row).sum()) * 1.01 for row in x]
    assert all(abs(g - e) <= b for g, e, b in zip(got.tolist(), exact, bound))


def test_tree_sum_gives_the_same_bits_for_any_layout_batch_and_thread_count():
    rng = np.random.default_rng(2)
    x = torch.from_numpy((rng.standard_normal((6, 5, 128)) * 100).astype(F32))
    want = de.tree_sum(x)
    assert torch.equal(de.tree_sum(x.transpose(0, 2).contiguous().transpose(0, 2)), want)  # other strides
    assert torch.equal(de.tree_sum(x.transpose(0, 2).contiguous(), dim=0), want.T)  # another dim
    assert torch.equal(torch.cat([de.tree_sum(x[:1]), de.tree_sum(x[1:])]), want)  # other batch sizes
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = de.tree_sum(x)
        torch.set_num_threads(2)
        assert torch.equal(one, de.tree_sum(x)) and torch.equal(one, want)
    finally:
        torch.set_num_threads(threads)
    assert float(de.tree_sum(torch.zeros(3, 0))[0]) == 0.0


def test_tree_norm_is_the_root_of_the_fixed_order_sum_of_squares():
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((40, 64)).astype(F32))
    got = de.tree_norm(x, keepdim=True)
    assert np.array_equal(got.numpy()[:, 0], np.sqrt(np_tree_sum(x.numpy() * x.numpy())))
    assert torch.allclose(got.double(), x.double().norm(dim=-1, keepdim=True), rtol=1e-6)


# -- powers of two and log2 ----------------------------------------------------------------------
def test_power_of_two_is_exact_over_the_float32_range():
    e = torch.arange(-149, 128)
    assert de.power_of_two(e).tolist() == [2.0**k for k in range(-149, 128)]
    assert math.isinf(float(de.power_of_two(torch.tensor(128))))


def cr_log2(v: float) -> Fraction:
    """log2(v) to 30 digits, as an exact fraction (rounded to a float32 by round_to: the correctly rounded one)."""
    with localcontext() as ctx:
        ctx.prec = 30
        return Fraction(Decimal(v).ln() / Decimal(2).ln())


def ref_half_up(v: float) -> float:
    """floor(fl32(fl32(log2 v) + 0.5)): a correctly rounded float32 log2, then UltraQuant's float32 steps."""
    return float(math.floor(float(F32(round_to(cr_log2(v), 24)) + F32(0.5))))


def ref_ceil(v: float, bits: int) -> float:
    return float(math.ceil(round_to(Fraction(round_to(cr_log2(v), 24)), bits)))


def ref_ceil_bf16(v: float) -> float:
    """ref_ceil(v, 8), faster: float64 log2 where it is at least 1e-9 (relative) away from every float32
    rounding boundary (float64's error is ~1e-16), the 30-digit log2 elsewhere."""
    wide = math.log2(v)
    f = float(F32(wide))
    edges = [(f + float(np.nextafter(F32(f), F32(s * np.inf)))) / 2 for s in (-1, 1)]
    if min(abs(wide - e) for e in edges) < 1e-9 * max(abs(wide), 1.0):
        return ref_ceil(v, 8)
    return float(math.ceil(round_to(Fraction(f), 8)))


def probes(kind: str, dtype=torch.float32) -> list[float]:
    """Every threshold's float32 neighbours (-2..+1 ulps) at every exponent, powers of two, seeded values."""
    th = torch.tensor(de.thresholds(kind, dtype)).view(torch.int32)
    e0 = torch.arange(de.E0_MIN, de.E0_MAX + 1)
    out = []
    for off in (-2, -1, 0, 1):
        m = (th + off).view(torch.float32).clamp(0.5, float(np.nextafter(F32(1), F32(0))))
        v = torch.ldexp(m, e0)
        out += [x for x in v.tolist() if 0 < x < float("inf") and x == f32(x)]
    rng = np.random.default_rng(4)
    out += [2.0**k for k in range(-149, 128, 5)] + [
        f32(v) for v in (rng.random(300) + 0.5) * 2.0 ** rng.integers(-60, 60, 300)
    ]
    return out


def test_log2_round_half_up_is_a_correctly_rounded_log2s_on_every_threshold():
    v = probes("half_up")
    assert de.log2_round_half_up(t(v)).tolist() == [ref_half_up(x) for x in v]


def test_log2_round_half_up_agrees_with_the_cpus_float32_log2_and_keeps_the_ieee_specials():
    v = torch.from_numpy((np.random.default_rng(5).random(200_000) * 2 - 1).astype(F32) * 60).exp2()
    assert torch.equal(de.log2_round_half_up(v), torch.floor(torch.log2(v) + 0.5))
    specials = de.log2_round_half_up(t([0.0, float("inf"), float("nan"), -1.0])).tolist()
    assert specials[:2] == [-math.inf, math.inf] and all(math.isnan(s) for s in specials[2:])


def test_log2_ceil_in_float32_is_a_correctly_rounded_log2s_on_every_threshold():
    v = probes("ceil")
    assert de.log2_ceil(t(v)).tolist() == [ref_ceil(x, 24) for x in v]


def test_log2_ceil_in_bfloat16_rounds_the_float32_log2_to_bfloat16_on_every_value_sglang_meets():
    """Every positive bf16 value from 2**-34 to 2**126 (SGLang's amax / 6 after its 1e-10 floor)."""
    bits = torch.arange(0x2E80, 0x7F00, dtype=torch.int32).to(torch.int16)  # 2**-34 .. 2**126, bf16 bit patterns
    v = bits.view(torch.bfloat16)
    got = de.log2_ceil(v).tolist()
    assert got == [ref_ceil_bf16(x) for x in v.float().tolist()]
    assert torch.equal(de.log2_ceil(v), torch.ceil(torch.log2(v)).float())  # this CPU's bf16 log2 agrees


def test_sqrt_is_the_correctly_rounded_float32_root():
    v = np.random.default_rng(6).random(100_000).astype(F32) * F32(100)
    want = np.sqrt(v.astype(np.float64)).astype(F32)  # float64 root rounded once: the correctly rounded one
    assert np.array_equal(de.sqrt(torch.from_numpy(v)).numpy(), want) and np.array_equal(np.sqrt(v), want)
    assert de.sqrt(t([0.0, 4.0, 2.0**-149])).tolist() == [0.0, 2.0, f32(math.sqrt(2.0**-149))]
