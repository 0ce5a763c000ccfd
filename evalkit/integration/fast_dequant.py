"""The storage caches' read on CPU as one fused loop: codes -> ``(code - zero) * scale`` -> the K/V's dtype.

Why: every eager decode step reads every layer's whole K/V back from its codes (the cache keeps no
full-precision copy). torch's eager CPU cast from float8 to float32 is a scalar loop, and the scale
is a second pass over a second float32 tensor: at 2,048 tokens on the embedded model those two
passes were about 40 % of a decode step. Inductor compiles the same arithmetic into one vectorized
loop that reads one byte and writes one value per element (about 7x faster per layer, measured).

Bit-identical by construction, and tested over every byte value of every 1-byte code dtype: the
same IEEE operations in the same order as :func:`~evalkit.integration.stored_read.dequantize_stored`
followed by the cast to the K/V's dtype: an exact cast of the code to float32, one subtraction of
the zero point (if any), one multiplication by the scale, one cast to the output dtype. Inductor
compiles C++ without unsafe math and without floating-point contraction (``-ffp-contract=off``),
so no multiply-add is fused and nothing is re-associated.

What it covers: 1-byte codes (float8, int8, uint8) with a scale that broadcasts or one per group of
channels (``group<N>``); not packed 4-bit codes, E2M1's own codes or an engine codec's slot bytes
(those read as before), and never inside a graph being compiled (the static path's compiled step
traces the plain operations itself) or off the CPU (a GPU's own cast is one fast kernel already).

Each variant (code dtype, output dtype, zero point or not, grouped or not) is compiled once per process and
per layout (which sizes are 1, which strides are the contiguous ones, a view or not) and thread count, dynamic
in its sizes and without duck sizing, as its own function: dynamo guards a compiled graph on exactly those
facts, so no guard of one fails for another, nothing fills dynamo's per-function cache however many layouts a
long process reads, and a growing sequence never recompiles. It runs without gradients whatever the caller's
grad mode, so a change of grad mode does not recompile it either. Inductor keeps its compiled code on disk,
so a later process loads it instead of compiling again.

``EVALKIT_FAST_DEQUANT=0`` reads through the plain operations; a compile that fails (no C++
compiler, say, or dynamo's recompile limit for a variant) warns once, naming the reason and its mend, and
reads through them too: the same numbers, slower.
"""

from __future__ import annotations

import contextlib
import os
import types
import warnings

import torch

_ONE_BYTE = (
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
    torch.int8,
    torch.uint8,
)
_KERNELS: dict[tuple, object] = {}
_failed: list[str] = []  # a compile failure's reason, once


def _affine(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    values = codes.to(torch.float32)
    if zero is not None:
        values = values - zero
    return (values * scale).to(dtype)


def _grouped(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    b, h, s, d = codes.shape
    g = codes.to(torch.float32).reshape(b, h, s, scale.shape[-1], d // scale.shape[-1])
    if zero is not None:
        g = g - zero.unsqueeze(-1)
    return (g * scale.unsqueeze(-1)).reshape(b, h, s, d).to(dtype)


def plain(codes, scale, zero, dtype, grouped: bool) -> torch.Tensor:
    """The same arithmetic through eager torch operations (what the kernel replaces)."""
    return (_grouped if grouped else _affine)(codes, scale, zero, dtype)


def enabled() -> bool:
    return os.environ.get("EVALKIT_FAST_DEQUANT", "1") != "0" and not _failed


def applies(codes: torch.Tensor) -> bool:
    """Whether the fused kernel reads these codes (1-byte codes on the CPU, outside a compiled graph)."""
    return (
        enabled()
        and codes.device.type == "cpu"
        and codes.dtype in _ONE_BYTE
        and codes.dim() == 4
        and not torch.compiler.is_compiling()
    )


def _kernel(key: tuple, grouped: bool):
    fn = _KERNELS.get(key)
    if fn is None:
        base = _grouped if grouped else _affine
        code = base.__code__.replace(co_name=f"{base.__name__}_{len(_KERNELS)}")  # its own dynamo cache
        fn = torch.compile(types.FunctionType(code, base.__globals__, code.co_name), dynamic=True, fullgraph=True)
        _KERNELS[key] = fn
    return fn


def _without_duck_sizing():
    """torch's switch that traces each size as its own symbol; none where this torch has no such switch (its
    private config module moved, say): the read is the same, a variant may then recompile more often."""
    try:
        from torch.fx.experimental import _config
    except ImportError:
        return contextlib.nullcontext()
    return _config.patch(use_duck_shape=False) if hasattr(_config, "use_duck_shape") else contextlib.nullcontext()


def _layout(t: torch.Tensor | None) -> tuple | None:
    """What dynamo specializes a tensor argument on besides its sizes: which sizes are 1, which strides are the
    contiguous ones (a slice of a longer cache is not), and whether it is a view (dynamo also guards the base)."""
    if t is None:
        return None
    dense, expected = [], 1
    for n, stride in zip(reversed(t.shape), reversed(t.stride())):
        dense.append(n == 1 or stride == expected)
        expected *= n
    return tuple(n == 1 for n in t.shape), tuple(reversed(dense)), t._base is not None


def dequantize(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, dtype: torch.dtype, grouped: bool
) -> torch.Tensor:
    """``(codes - zero) * scale`` in ``dtype`` (``grouped``: one scale per ``D / scale.shape[-1]``
    channels), through the compiled kernel; the caller checked :func:`applies`."""
    # one compiled function per variant and per layout and thread count, so that no guard of one fails for another
    key = (codes.dtype, dtype, grouped, _layout(codes), _layout(scale), _layout(zero), torch.get_num_threads())
    fn = _KERNELS.get(key)
    try:
        # no gradients: a read of integer codes has none, and a change of grad mode would recompile. The first
        # call compiles, without "duck sizing" (two sizes equal then, batch and heads say, would be assumed equal
        # ever after); later calls skip that config switch, which costs 24 us a call (measured here)
        with torch.no_grad(), contextlib.nullcontext() if fn else _without_duck_sizing():
            return (fn or _kernel(key, grouped))(codes, scale, zero, dtype)
    except Exception as err:  # noqa: BLE001 - a compiler missing or failing: read through the plain ops
        if not _failed:
            _failed.append(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
            warnings.warn(
                f"the compiled K/V read failed ({_failed[0]}); reading through plain torch operations "
                f"(the same numbers, slower decode): {_mend(err)}, or set EVALKIT_FAST_DEQUANT=0 to silence this",
                RuntimeWarning,
                stacklevel=2,
            )
        return plain(codes, scale, zero, dtype, grouped)


def _mend(err: Exception) -> str:
    """What to do about a failed compile: a recompile limit is torch.compile's cache of one variant filling up
    (inputs of many layouts in one process), not a missing compiler."""
    if "RecompileLimit" in type(err).__name__:
        return (
            "K/V of more layouts than torch.compile keeps per variant went through one process (raise "
            "torch._dynamo.config.recompile_limit)"
        )
    return "install a C++ compiler"
