"""vLLM's rotation-dtype Triton stores (INT4 per token and head, TurboQuant, UltraQuant) run by
Triton's interpreter on CPU tensors, against evalkit's codecs (:mod:`evalkit.kv.codecs.slot`).

Each check writes :func:`evalkit.engines.vllm.triton_base.sample` K/V (several magnitudes, an all-zero
head, exact halves) through vLLM's own launcher into a paged cache at scattered slots, reads each
(token, head) slot back and compares it with the codec's bytes for the same K/V, part by part:

- ``int4_per_token_head`` (``reshape_and_cache_int4``: the launcher's torch RHT, then
  ``_reshape_cache_int4_kernel``): the stored float32 scale (with the zero point in its low bits) and
  every 4-bit code: all integer and float32 arithmetic, so all must be equal;
- ``turboquant_*`` (``triton_turboquant_store``): "scales" are the float16 key norm and the value's
  float16 scale and min; "codes" the key indices (or FP8 keys) and the value codes. The launcher
  rotates with a float32 GEMM (``x_hat @ PiT``) where evalkit uses the butterfly, so an index may
  differ where ``y`` lies within float32 rounding of a midpoint: each such index is checked to be the
  one the engine's own ``y`` gives (class ``rotation_summation_order``). FP8 keys (``k8v4``) are held
  to RNE-satfinite and the interpreter's casts classified as for ``fp8_per_token_head``;
- ``ultraquant_4bit`` (``ultraquant_store``, bf16 K/V): the UE8M0 scale bytes and the E2M1 codes.

Integer/float32 parts must be equal; any other difference is counted under ``other`` (never hidden).
"""

from __future__ import annotations

import torch

from evalkit.engines.vllm.triton_base import BLOCK, StoreConformance, fp8_classes, load_with_triton, sample

OPS = "vllm/v1/attention/ops/"
INT4_FILE = OPS + "int4_per_token_head.py"
TQ_FILE = OPS + "triton_turboquant_store.py"
UQ_FILE = OPS + "ultraquant/triton_store.py"
CLASSES = {
    "rotation_summation_order": "the key's rotated value y lies within float32 rounding of a codebook midpoint: the "
    "engine's float32 GEMM (x_hat @ PiT) and evalkit's butterfly sum in different orders, and the engine's own y "
    "gives the engine's index",
}


def _slots(tokens: int) -> tuple[torch.Tensor, int]:
    blocks = -(-tokens // BLOCK)
    return torch.randperm(blocks * BLOCK, generator=torch.Generator().manual_seed(1))[:tokens], blocks


def _ours(name: str, x: torch.Tensor, role: str) -> torch.Tensor:
    """The codec's bytes for (tokens, heads, D) K or V, as (tokens, heads, width)."""
    from evalkit.kv.quantize import quantize
    from evalkit.kv.scheme import parse_scheme

    s = parse_scheme(f"vllm:{name}")
    q = quantize(x.permute(1, 0, 2)[None], s.kv_format, s.granularity, role=role)
    return q.stored[0].permute(1, 0, 2)


def _count(result: StoreConformance, ours: torch.Tensor, theirs: torch.Tensor, scales: bool) -> torch.Tensor:
    equal = ours == theirs
    if scales:
        result.scales += equal.numel()
        result.scales_equal += int(equal.sum())
    else:
        result.values += equal.numel()
        result.codes_equal += int(equal.sum())
    return ~equal


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Byte pairs -> one int16 per stored float16 (norm, scale, min)."""
    return b.contiguous().view(torch.int16)


def _add(classes: dict[str, int], name: str, n: int) -> None:
    if n:
        classes[name] = classes.get(name, 0) + n


def int4_conformance(seed: int = 0, device: str = "cpu") -> StoreConformance:
    mod = load_with_triton(INT4_FILE, device)
    key, value = sample(seed)
    tokens, heads, d = key.shape
    slots, blocks = _slots(tokens)
    caches = [torch.zeros(blocks, BLOCK, heads, d // 2, dtype=torch.uint8, device=device) for _ in range(2)]
    scales = [torch.full((blocks, BLOCK, heads), -1.0, device=device) for _ in range(2)]
    mod.reshape_and_cache_int4(
        key.to(device),
        value.to(device),
        *caches,
        slots.to(device),
        k_scale_cache=scales[0],
        v_scale_cache=scales[1],
    )
    caches, scales = [c.cpu() for c in caches], [s.cpu() for s in scales]
    result = StoreConformance("int4_per_token_head", 0, 0, 0, 0)
    for role, x, cache, scale in (("k", key, caches[0], scales[0]), ("v", value, caches[1], scales[1])):
        ours = _ours("int4_per_token_head", x, role)
        from evalkit.kv.packing import unpack_nibbles

        theirs_codes = unpack_nibbles(cache.reshape(-1, heads, d // 2)[slots])
        theirs_scale = scale.reshape(-1, heads)[slots].contiguous().view(torch.int32)
        _count(result, unpack_nibbles(ours[..., : d // 2]), theirs_codes, scales=False)
        _count(result, ours[..., d // 2 :].contiguous().view(torch.int32)[..., 0], theirs_scale, scales=True)
    return result


def turboquant_conformance(name: str, seed: int = 0, device: str = "cpu") -> StoreConformance:
    from vllm.model_executor.layers.quantization.turboquant.centroids import get_centroids
    from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig
    from vllm.v1.attention.backends.turboquant_attn import _build_hadamard

    from evalkit.kv.codecs.vllm import turboquant as tq
    from evalkit.kv.packing import unpack_3bit, unpack_nibbles

    mod = load_with_triton(TQ_FILE, device)
    key, value = sample(seed)
    tokens, heads, d = key.shape
    cfg = TurboQuantConfig.from_cache_dtype(name, d)
    slots, blocks = _slots(tokens)
    cache = torch.zeros(blocks, BLOCK, heads, cfg.slot_size_aligned, dtype=torch.uint8, device=device)
    pit = _build_hadamard(d, "cpu")
    c = get_centroids(d, cfg.centroid_bits).sort().values
    mid = (c[:-1] + c[1:]) / 2
    on = [t.to(device) for t in (key, value)]
    mod.triton_turboquant_store(
        *on,
        cache,
        slots.to(device),
        pit.to(device),
        mid.to(device),
        cfg.key_mse_bits,
        cfg.key_packed_size,
        cfg.value_quant_bits,
        cfg.key_fp8,
    )
    cache = cache.cpu()
    slot = cache.reshape(-1, heads, cfg.slot_size_aligned)[slots]
    kps, vbits = cfg.key_packed_size, cfg.value_quant_bits
    ok, ov = _ours(name, key, "k"), _ours(name, value, "v")
    result, classes = StoreConformance(name, 0, 0, 0, 0), {}
    if cfg.key_fp8:
        differ = _count(result, ok, slot[..., :kps], scales=False)
        if bool(differ.any()):
            got, want = slot[..., :kps].view(torch.float8_e4m3fn), ok.view(torch.float8_e4m3fn)
            for k, n in fp8_classes(got, want, key.clamp(-448, 448)).items():
                _add(classes, k, n)
    else:
        bits, n = cfg.key_mse_bits, -(-d * cfg.key_mse_bits // 8)
        unpack = unpack_nibbles if bits == 4 else unpack_3bit
        theirs = unpack(slot[..., :n]).long()
        differ = _count(result, unpack(ok[..., :n]).long(), theirs, scales=False)
        _count(result, _f16(ok[..., n:kps]), _f16(slot[..., n:kps]), scales=True)
        if bool(differ.any()):  # the engine's own rotation, as its launcher computes it
            k = key.float().reshape(-1, d)
            y = (k / (k.norm(dim=1, keepdim=True) + tq.NORM_EPS)) @ pit
            engine_idx = tq.key_indices(y, mid).reshape(theirs.shape)
            explained = differ & (engine_idx == theirs)
            _add(classes, "rotation_summation_order", int(explained.sum()))
            _add(classes, "other", int((differ & ~explained).sum()))
    vn = -(-d * vbits // 8)
    unpack = unpack_nibbles if vbits == 4 else unpack_3bit
    vslot = slot[..., kps : kps + vn + 4]
    differ = _count(result, unpack(ov[..., :vn]).long(), unpack(vslot[..., :vn]).long(), scales=False)
    _add(classes, "other", int(differ.sum()))
    _count(result, _f16(ov[..., vn:]), _f16(vslot[..., vn:]), scales=True)
    result.classes = classes
    return result


def ultraquant_conformance(seed: int = 0, device: str = "cpu") -> StoreConformance:
    from vllm.v1.attention.ops.ultraquant.format import slot_size

    from evalkit.kv.codecs.vllm.ultraquant import width
    from evalkit.kv.packing import unpack_nibbles

    mod = load_with_triton(UQ_FILE, device)
    key, value = (t.to(torch.bfloat16) for t in sample(seed))
    tokens, heads, d = key.shape
    slots, blocks = _slots(tokens)
    cache = torch.zeros(blocks, BLOCK, heads, slot_size(d), dtype=torch.uint8, device=device)
    mod.ultraquant_store(key.to(device), value.to(device), cache, slots.to(device))
    cache = cache.cpu()
    slot = cache.reshape(-1, heads, slot_size(d))[slots]
    w, result, classes = width("k", d), StoreConformance("ultraquant_4bit", 0, 0, 0, 0), {}
    for i, (role, x) in enumerate((("k", key), ("v", value))):
        ours, theirs = _ours("ultraquant_4bit", x, role), slot[..., i * w : (i + 1) * w]
        differ = _count(result, unpack_nibbles(ours[..., : d // 2]), unpack_nibbles(theirs[..., : d // 2]), False)
        differ_s = _count(result, ours[..., d // 2 :], theirs[..., d // 2 :], scales=True)
        _add(classes, "other", int(differ.sum()) + int(differ_s.sum()))
    result.classes = classes
    return result


CONFORMANCE = {
    "int4_per_token_head": int4_conformance,
    **{
        n: (lambda seed=0, device="cpu", n=n: turboquant_conformance(n, seed, device))
        for n in ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")
    },
    "ultraquant_4bit": ultraquant_conformance,
}
