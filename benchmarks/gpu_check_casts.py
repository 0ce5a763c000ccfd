"""gpu_check's section 2, FP8 and FP4 rounding, and the independent reference it holds casts to.

For every FP8 format, the device's own cast (nearest even) against evalkit's emulation on the device, the same
emulation on the CPU, and an independent reference (:func:`reference_round`: a float64 search of the format's
full table of values), on every value, midpoint and the floats next to them plus random values over the whole
range: same bits. The other rounding modes of ``evalkit.kv.rounding`` (no CUDA cast) and FP4 E2M1 likewise,
without the device cast. Section 7 (:mod:`gpu_check_vllm_dtypes`) holds the casts it records to the same
reference. Imported by benchmarks/gpu_check.py.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from gpu_check_budget import Section
    from gpu_check_models import Context


def rounding_modes() -> list:
    """The rounding modes evalkit.kv.rounding has now (nearest even always; rtz / rna where present)."""
    from evalkit.kv import rounding

    modes = getattr(rounding, "Rounding", None)
    return list(modes) if modes is not None else ["rne"]


def mode_name(mode) -> str:
    return getattr(mode, "value", str(mode))


def format_table(fmt) -> tuple[torch.Tensor, torch.Tensor]:
    """Every finite value of ``fmt`` (float64, ascending, zero once) and whether its code is even."""
    if fmt.torch_dtype is not None and fmt.torch_dtype.is_floating_point and fmt.bits == 8:
        codes = torch.arange(128, dtype=torch.uint8)
        mags = codes.view(fmt.torch_dtype).to(torch.float64)
    else:  # FP4 E2M1: codes 0..7 are these magnitudes
        mags = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
        codes = torch.arange(8, dtype=torch.uint8)
    keep = torch.isfinite(mags)
    mags, even = mags[keep], (codes[keep] % 2 == 0)
    values = torch.cat([-mags[1:].flip(0), mags])
    evens = torch.cat([even[1:].flip(0), even])
    return values, evens


def reference_round(x: torch.Tensor, fmt, mode) -> torch.Tensor:
    """The independent reference: the value of ``fmt`` that ``mode`` picks among the two table
    values around each (clamped, float32) ``x``, by float64 comparisons; float32 out."""
    values, evens = format_table(fmt)
    x64 = x.detach().to("cpu", torch.float64)
    idx = torch.searchsorted(values, x64).clamp(1, len(values) - 1)
    lo, hi = values[idx - 1], values[idx]
    d_lo, d_hi = x64 - lo, hi - x64
    name = mode_name(mode)
    if name == "rtz":
        pick = torch.where(x64 >= 0, lo, hi)
    else:
        tie = torch.where(evens[idx - 1], lo, hi) if name == "rne" else torch.where(x64 >= 0, hi, lo)
        pick = torch.where(d_lo < d_hi, lo, torch.where(d_hi < d_lo, hi, tie))
    pick = torch.where(lo == x64, lo, torch.where(hi == x64, hi, pick))
    out = pick.to(torch.float32)
    zero = out == 0
    signed = torch.copysign(torch.zeros_like(out), x.detach().cpu()) if fmt.negative_zero else torch.zeros_like(out)
    return torch.where(zero, signed, out)


def cast_inputs(fmt, n: int, device: torch.device, seed: int) -> torch.Tensor:
    """Every table value, every midpoint, the float32 neighbours of both, ±0, float32 subnormals,
    and ``n`` random values log-uniform over the format's whole range with random signs; clamped."""
    values, _ = format_table(fmt)
    v = values.to(torch.float32)
    mid = ((values[1:] + values[:-1]) / 2).to(torch.float32)
    pts = torch.cat([v, mid])
    inf = torch.tensor(float("inf"))
    edges = torch.cat(
        [
            pts,
            torch.nextafter(pts, inf),
            torch.nextafter(pts, -inf),
            torch.tensor([0.0, -0.0, 1e-40, -1e-40, 1e-30, -1e-30, fmt.max, -fmt.max]),
        ]
    )
    g = torch.Generator(device=device).manual_seed(seed)
    smallest = math.log2(float(values[values > 0].min()))
    e = torch.rand(n, device=device, generator=g) * (math.log2(fmt.max) + 1 - smallest + 3) + smallest - 3
    sign = torch.where(torch.rand(n, device=device, generator=g) < 0.5, -1.0, 1.0)
    x = torch.cat([edges.to(device), sign * torch.exp2(e)])
    return x.clamp(-fmt.max, fmt.max)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, int, str]:
    a, b = a.detach().cpu(), b.detach().cpu()
    diff = a.view(torch.int32) != b.view(torch.int32)
    n = int(diff.sum())
    first = ""
    if n:
        i = int(diff.nonzero()[0, 0])
        first = f"first at index {i}: {float(a[i])!r} vs {float(b[i])!r}"
    return n == 0, n, first


def casts(sec: Section, ctx: Context) -> None:
    from evalkit.kv import rounding as R
    from evalkit.kv.formats import FORMATS

    formats = [f for f in FORMATS.values() if f.kind.value == "float"]  # the FP8 formats and FP4 E2M1
    items = [(f, m) for f in formats for m in rounding_modes()]

    def label(fmt, mode) -> str:
        cast = "device cast == " if fmt.bits == 8 and mode_name(mode) == "rne" else ""
        return f"{fmt.name} {mode_name(mode)}: {cast}emulation ({ctx.device.type}) == emulation (cpu) == reference"

    last = 0.0
    for i, (fmt, mode) in enumerate(items):
        if not sec.fits(last):
            sec.cut([label(f, m) for f, m in items[i:]])
            return
        t = time.perf_counter()
        name, fp8 = mode_name(mode), fmt.bits == 8
        x = cast_inputs(fmt, ctx.sizes.cast_values, ctx.device, seed=i)
        if name == "rne":
            emu, emu_cpu = R.round_to_fp8_emulated(x, fmt), R.round_to_fp8_emulated(x.cpu(), fmt)
        else:
            emu, emu_cpu = R.round_to_grid(x, fmt, mode), R.round_to_grid(x.cpu(), fmt, mode)
        ref = reference_round(x, fmt, mode)
        results = {"emulation_vs_cpu_emulation": same_bits(emu, emu_cpu), "emulation_vs_reference": same_bits(emu, ref)}
        if fp8:  # what the storage path calls: the cast or the emulation by size (nearest even), or the grid
            bound = fmt.with_rounding(mode) if hasattr(fmt, "with_rounding") else fmt
            results["storage_rounding_vs_reference"] = same_bits(R.round_to_fp8(x, bound), ref)
            if name == "rne":
                results["device_cast_vs_reference"] = same_bits(R.round_to_fp8_by_cast(x, fmt), ref)
        ctx.sync()
        ok = all(r[0] for r in results.values())
        figures = {
            "values": x.numel(),
            "device": ctx.device.type,
            **{k: {"mismatches": r[1], **({"first": r[2]} if r[2] else {})} for k, r in results.items()},
        }
        last = time.perf_counter() - t
        sec.check(
            label(fmt, mode),
            ok,
            figures,
            "" if ok else "; ".join(f"{k}: {r[1]} differ ({r[2]})" for k, r in results.items() if not r[0]),
            seconds=last,
        )
