"""vLLM's DeepSeek V3.2 MLA cache writer run by Triton's interpreter on CPU tensors, against
:mod:`evalkit.kv.codecs.vllm.ds_mla`.

The writer is ``vllm/models/deepseek_v32/common/kernels.py`` ``fused_norm_rope`` /
``_fused_norm_rope_kernel`` (RMS norm of the latent, RoPE of the key, and the cache write in one
program per token), loaded with the real Triton by :func:`evalkit.engines.vllm.triton_base.load_with_triton`.
:func:`fp8_ds_mla_conformance` writes seeded latents (magnitudes 1e-3 to 1e2, one all-zero token) and
RoPE keys into a paged ``fp8_ds_mla`` cache, takes the kernel's own normed latent and rotated key
(``kv_c_out`` / ``k_pe_out``, float32, what its registers held), encodes them with evalkit's codec
and compares the 656-byte rows:

- the four float32 tile scales per token (power-of-two snap of ``max(amax / 448, 1e-4)``): float32
  arithmetic, equal, every one;
- the 512 E4M3 codes: held to round-to-nearest-even with saturation (``cvt.rn.satfinite``); the
  interpreter's own float8 cast differs, each difference named by class
  (:data:`evalkit.engines.vllm.triton_base.FP8_CLASSES`);
- the 64 bf16 RoPE values: the GPU casts with ``cvt.rn.bf16.f32`` (nearest even); the interpreter
  truncates (class ``bf16_truncated``).

``nvfp4_ds_mla`` cannot run here: its E2M1 cast is inline PTX (``cvt.rn.satfinite.e2m1x2.f32`` via
``tl.inline_asm_elementwise``), which the interpreter refuses ("inline_asm not supported in
interpreter mode"); its rows are held to a numpy reading of the kernel in the tests instead.
"""

from __future__ import annotations

import torch

from evalkit.engines.vllm.triton_base import StoreConformance, fp8_classes, load_with_triton

KERNEL_FILE = "vllm/models/deepseek_v32/common/kernels.py"
TOKENS, BLOCK, Q_DIM, ROPE_POSITIONS = 64, 16, 64, 4096
CLASSES = {
    "bf16_truncated": "a RoPE value the interpreter casts to bf16 by truncation (toward zero); the GPU's "
    "cvt.rn.bf16.f32 rounds to nearest even, as evalkit does",
}


def _rope_cache(positions: int = ROPE_POSITIONS, half: int = 32) -> torch.Tensor:
    inv = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float64) / half))
    f = torch.arange(positions, dtype=torch.float64)[:, None] * inv[None]
    return torch.cat([f.cos(), f.sin()], dim=-1).float()


def run_writer(seed: int = 0, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's rows (TOKENS, 656) uint8 and its normed latent / rotated key (float32), run on ``device``
    (the inputs are drawn on the CPU, so they are the same everywhere) and read back to the CPU."""
    mod = load_with_triton(KERNEL_FILE, device)
    g = torch.Generator().manual_seed(seed)
    kv_c = torch.randn(TOKENS, 512, generator=g) * torch.logspace(-3, 2, TOKENS)[:, None]
    kv_c[0] = 0.0
    k_pe = torch.randn(TOKENS, 64, generator=g) * 3.0
    positions = torch.randint(0, ROPE_POSITIONS, (TOKENS,), generator=g)
    cache = torch.zeros(TOKENS // BLOCK, BLOCK, 656, dtype=torch.uint8)
    slots = torch.randperm(TOKENS, generator=g)
    q = torch.randn(TOKENS, Q_DIM, generator=g)

    def on(t):
        return t.to(device)

    kv_out, pe_out, cache_on = on(torch.empty_like(kv_c)), on(torch.empty_like(k_pe)), on(cache)
    mod.fused_norm_rope(
        on(positions),
        on(q),
        on(torch.ones(Q_DIM)),
        1e-6,
        on(kv_c),
        on(torch.ones(512)),
        1e-6,
        on(k_pe),
        on(_rope_cache()),
        None,
        None,
        None,
        1e-6,
        None,
        on(torch.zeros(TOKENS, 8, dtype=torch.int32)),
        slot_mapping=on(slots),
        mla_kv_cache=cache_on,
        mla_kv_cache_dtype="fp8_ds_mla",
        mla_k_scale=on(torch.ones(1)),
        has_indexer=False,
        kv_c_out=kv_out,
        k_pe_out=pe_out,
    )
    return cache_on.cpu().reshape(-1, 656)[slots], kv_out.cpu(), pe_out.cpu()


def fp8_ds_mla_conformance(seed: int = 0, device: str = "cpu") -> StoreConformance:
    from evalkit.kv.codecs.vllm import ds_mla

    rows, latent, rope = run_writer(seed, device)
    codec = next(c for c in ds_mla.CODECS if c.name == "fp8_ds_mla")
    k, v = codec.encode(latent, "k"), codec.encode(rope, "v")
    ours = ds_mla.row("fp8_ds_mla", k.stored, v.stored)
    scales = ours[:, 512:528].contiguous().view(torch.float32)
    theirs_codes = rows[:, :512].contiguous().view(torch.float8_e4m3fn)
    our_codes = ours[:, :512].contiguous().view(torch.float8_e4m3fn)
    y = (latent.reshape(TOKENS, 4, 128) / scales[..., None]).reshape(TOKENS, 512)
    classes = fp8_classes(theirs_codes, our_codes, y.clamp(-448.0, 448.0))
    rope_theirs = rows[:, 528:].contiguous().view(torch.bfloat16)
    rope_ours = ours[:, 528:].contiguous().view(torch.bfloat16)
    rope_differ = rope_theirs.view(torch.int16) != rope_ours.view(torch.int16)
    truncated = (rope.view(torch.int32) & ~0xFFFF).view(torch.float32)
    n_trunc = int((rope_differ & (rope_theirs.float() == truncated)).sum())
    classes.update({"bf16_truncated": n_trunc} if n_trunc else {})
    if int(rope_differ.sum()) > n_trunc:
        classes["other"] = classes.get("other", 0) + int(rope_differ.sum()) - n_trunc
    return StoreConformance(
        "fp8_ds_mla",
        values=our_codes.numel() + rope_ours.numel(),
        scales_equal=int((rows[:, 512:528] == ours[:, 512:528]).reshape(TOKENS, 4, 4).all(-1).sum()),
        scales=scales.numel(),
        codes_equal=int((theirs_codes.view(torch.uint8) == our_codes.view(torch.uint8)).sum())
        + int((~rope_differ).sum()),
        classes=classes,
    )


CONFORMANCE = {"fp8_ds_mla": fp8_ds_mla_conformance}


if (
    __name__ == "__main__"
):  # python -m evalkit.engines.vllm.triton_ds_mla [seed], with TRITON_INTERPRET=1: one JSON line
    import json
    import sys

    print(json.dumps(fp8_ds_mla_conformance(int(sys.argv[1]) if len(sys.argv) > 1 else 0).to_dict()))
