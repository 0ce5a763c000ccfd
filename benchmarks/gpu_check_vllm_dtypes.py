"""gpu_check's section 7: vLLM's kv_cache_dtypes encoded on the device and on the CPU, and every cast they make.

Per ``vllm:<kv_cache_dtype>`` evalkit models (evalkit.kv.codecs.vllm) beyond the per-tensor FP8
ones (sections 2 and 3 cover those): K and V of seeded random values (outlier channels, an
all-zero token) encoded by evalkit's emulation on the device and on the CPU, and every FP8/FP4
cast the emulation makes, recorded as it runs, against the device's own conversion and the
hardware rule (PTX cvt.rn.satfinite: nearest even, saturating; the float64 table search).

Imported by benchmarks/gpu_check.py.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
from gpu_check_casts import reference_round, same_bits

if TYPE_CHECKING:
    from gpu_check_budget import Section
    from gpu_check_models import Context

PER_TENSOR = ("fp8", "fp8_e4m3", "fp8_e5m2")  # per-tensor FP8: sections 2 and 3
FLOAT8_DTYPES = {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}


def vllm_dtype_items() -> list[tuple[str, object, bool]]:
    """(dtype name, scheme, is MLA) for every modelled vLLM dtype this checkout has (none if it has none)."""
    try:
        from evalkit.kv.codecs.vllm.dtypes import VLLM_DTYPES, Arch, Status
        from evalkit.kv.codecs.vllm.family import vllm_scheme
    except ImportError:
        return []
    items = []
    for name, d in VLLM_DTYPES.items():
        if d.status is Status.MODELLED and name not in PER_TENSOR:
            items.append((name, vllm_scheme(name), d.arch is Arch.MLA))
    return items


class CastRecorder:
    """Records, while active, every float32 -> float8 ``Tensor.to`` (a TorchFunctionMode) and every
    E2M1 rounding (``evalkit.kv.microscaling.round_to_grid`` for FP4, replaced inside this block
    only and restored on exit): (format name, input, output)."""

    def __init__(self):
        self.casts: list[tuple[str, torch.Tensor, torch.Tensor]] = []

    def __enter__(self):
        from torch.overrides import TorchFunctionMode

        from evalkit.kv import microscaling

        recorder = self

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func is torch.Tensor.to and isinstance(out, torch.Tensor) and out.dtype in FLOAT8_DTYPES:
                    src = args[0]
                    if src.dtype not in FLOAT8_DTYPES:
                        recorder.casts.append((FLOAT8_DTYPES[out.dtype], src.detach().float(), out.detach()))
                return out

        self._mx, self._grid = microscaling, microscaling.round_to_grid

        def grid(y, fmt, *args, **kwargs):
            out = self._grid(y, fmt, *args, **kwargs)
            if fmt.bits == 4:
                recorder.casts.append(("fp4_e2m1", y.detach().float(), out.detach()))
            return out

        microscaling.round_to_grid = grid
        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        self._mx.round_to_grid = self._grid
        return False


def vllm_inputs(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Seeded float32 K or V (CPU): normal values, four outlier channels (x20), one all-zero token."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    x[..., : min(4, shape[-1])] *= 20.0
    x[:, :, 0] = 0.0
    return x


def device_float4_cast(device: torch.device) -> str:
    """Whether torch converts float32 to FP4 on ``device`` (one line: why not, where it does not)."""
    dt = getattr(torch, "float4_e2m1fn_x2", None)
    if dt is None:
        return f"torch {torch.__version__} has no float4 dtype"
    try:
        torch.zeros(2, device=device).to(dt)
    except Exception as exc:  # noqa: BLE001 - the reason is the figure
        return f"torch {torch.__version__} has no float32 -> float4_e2m1fn_x2 conversion ({type(exc).__name__})"
    return "available"


def encode_both(x: torch.Tensor, scheme, role: str, device: torch.device):
    """evalkit's emulation of one side (K or V) on ``device`` (casts recorded) and on the CPU."""
    from evalkit.kv.quantize import quantize

    fmt, gran = scheme.kv_format, scheme.granularity
    with CastRecorder() as rec:
        q_dev = quantize(x.to(device), fmt, gran, role=role)
    q_cpu = quantize(x, fmt, gran, role=role)
    return q_dev, q_cpu, rec.casts


def _bytes(q, fmt) -> torch.Tensor:
    from evalkit.kv.quantize import encode_quantized

    stored = encode_quantized(q, fmt).detach().cpu().contiguous()
    return stored.view(torch.uint8) if stored.element_size() == 1 else stored.view(torch.uint8).reshape(-1)


def vllm_label(name: str, ctx: Context) -> str:
    return f"vllm:{name}: emulation ({ctx.device.type}) == emulation (cpu), its casts == device conversion == rule"


def vllm_dtypes(sec: Section, ctx: Context) -> None:
    from evalkit.kv.formats import FORMATS
    from evalkit.kv.quantize import dequantize

    items = vllm_dtype_items()
    if not items:
        sec.skip("vLLM dtypes", "this checkout has no evalkit.kv.codecs.vllm")
        return
    s = ctx.sizes
    fp4 = device_float4_cast(ctx.device)
    last = 0.0
    for i, (name, scheme, mla) in enumerate(items):
        if not sec.fits(last):
            sec.cut([vllm_label(n, ctx) for n, _, _ in items[i:]])
            return
        t = time.perf_counter()
        dims = (("k", 512), ("v", 64)) if mla else (("k", 64), ("v", 64))
        heads = 1 if mla else 8
        figures: dict = {"shape": None, "device": ctx.device.type, "roles": {}}
        ok = True
        for role, d in dims:
            shape = (s.batch, heads, s.vllm_tokens, d)
            figures["shape"] = [s.batch, heads, s.vllm_tokens]
            x = vllm_inputs(shape, seed=1000 * i + (role == "v"))
            q_dev, q_cpu, casts = encode_both(x, scheme, role, ctx.device)
            b_dev, b_cpu = _bytes(q_dev, scheme.kv_format), _bytes(q_cpu, scheme.kv_format)
            byte_diff = int((b_dev != b_cpu).sum()) if b_dev.shape == b_cpu.shape else -1
            v_dev = dequantize(q_dev, torch.float32).cpu()
            value_same = same_bits(v_dev.reshape(-1), dequantize(q_cpu, torch.float32).reshape(-1))
            entry = {
                "values": x.numel(),
                "stored_bytes": b_dev.numel(),
                "stored_bytes_differing_from_cpu": byte_diff,
                "dequantized_differing_from_cpu": value_same[1],
                "casts": {},
            }
            scale_same = (True, 0, "")
            if q_dev.scale is not None and q_dev.scale.numel():  # scales kept beside the codes (per-token-head)
                scale_same = same_bits(q_dev.scale.float().reshape(-1), q_cpu.scale.float().reshape(-1))
                entry["scales_differing_from_cpu"] = scale_same[1]
            ok &= byte_diff == 0 and value_same[0] and scale_same[0]
            for fmt_name in dict.fromkeys(c[0] for c in casts):
                fmt = FORMATS[fmt_name]
                ins = torch.cat([c[1].reshape(-1).cpu() for c in casts if c[0] == fmt_name])
                outs = torch.cat([c[2].float().reshape(-1).cpu() for c in casts if c[0] == fmt_name])
                rule = reference_round(ins.clamp(-fmt.max, fmt.max), fmt, "rne")
                got = {"emulation_vs_rule": same_bits(outs, rule)}
                if fmt.bits == 8:  # the emulation's cast is torch's: on the device, the device's conversion
                    got["device_cast_vs_cpu_cast"] = same_bits(outs, ins.to(fmt.torch_dtype).float())
                    conversion = f"torch's {fmt.torch_dtype} cast on {ctx.device.type}"
                else:
                    conversion = f"evalkit's E2M1 rounding; device float4 conversion: {fp4}"
                entry["casts"][fmt_name] = {
                    "count": ins.numel(),
                    "inputs_beyond_max": int((ins.abs() > fmt.max).sum()),  # the rule saturates them
                    "conversion": conversion,
                    **{k: {"mismatches": r[1], **({"first": r[2]} if r[2] else {})} for k, r in got.items()},
                }
                ok &= all(r[0] for r in got.values())
            if not casts:
                entry["casts"] = "none: no FP8/FP4 cast on this side (integer, codebook, UE8M0 or 16-bit arithmetic)"
            figures["roles"][role] = entry
        last = time.perf_counter() - t
        reason = "" if ok else "the device's bytes or casts differ: see figures"
        sec.check(vllm_label(name, ctx), ok, figures, reason, seconds=last)
