"""The storage path's cost, side by side in one run: forwards, decode steps, memory.

    python benchmarks/bench_storage.py [--rounds 3] [--threads 2] [--length 2048] [--decode 64]

On the embedded model (float32 on CPU unless --device/--dtype say otherwise), for each scheme:

1. **Forward throughput** (what perplexity and lm-eval loglikelihood do: one forward per window or
   request) through the storage cache against the previous implementation, an attention-function
   wrapper that fake-quantizes the full K/V with the same core (``quantize_dequantize``) and calls
   the model's own attention: ``throughput ratio = t_wrapper / t_storage`` (target >= 0.95).
2. **Decode steps** at ``--length`` context: ``--decode`` greedy steps after the prefill, through the
   storage cache against plain transformers decoding (DynamicCache, no evalkit): ``t_storage / t_plain``
   per step (target <= 1.10 for FP8).
3. **Memory** held after prefill + decode: the storage cache (dequantized copy + codes + scales)
   against transformers' DynamicCache in the model's dtype, and what an engine would hold
   (``cache.nbytes()``) against a BF16 cache.

Rounds are interleaved (every arm once per round, order rotated) and the minimum per arm is reported,
so slow phases of a shared machine hit every arm alike.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from evalkit.integration.hf_compat import cache_inputs, output_cache

SCHEMES = ["bf16", "fp8_e4m3/tensor/dynamic", "fp8_e4m3/head/dynamic", "fp8_e4m3/block16/dynamic", "fp8_e4m3/head/unit"]


def wrapper_arm(model, scheme):
    """The previous implementation's work: fake-quantize the full K/V inside the attention function."""
    from evalkit.integration.attention import attention_handler
    from evalkit.kv.quantize import quantize_dequantize
    from evalkit.kv.scheme import parse_scheme

    s = parse_scheme(scheme)
    fixed = torch.ones(1, 1, 1, 1) if s.scales.value == "unit" else None

    def handler(module, query, key, value, attention_mask, inner, **kwargs):
        if not s.is_identity:
            key = quantize_dequantize(key, s.kv_format, s.granularity, scale=fixed)
            value = quantize_dequantize(value, s.kv_format, s.granularity, scale=fixed)
        return inner(module, query, key, value, attention_mask, **kwargs)

    return attention_handler(model, handler)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    from evalkit.runtime import numerics

    numerics.configure()  # as the command line: batch-invariant BLAS, before the first matrix product
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--forward-length", type=int, default=1024, help="tokens per forward in part 1")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from evalkit import quantized_kv
    from evalkit.data.corpus import load_corpus, tokenize_corpus
    from evalkit.models.loading import load_model

    lm = load_model("embedded", device=args.device, dtype=args.dtype)
    model = lm.model
    ids = tokenize_corpus(load_corpus("embedded"), lm.tokenizer, None)
    prompt = ids[: args.length][None].to(lm.device)
    window = ids[: args.forward_length][None].to(lm.device)
    schemes = args.schemes.split(",")
    sync = torch.cuda.synchronize if lm.device.type == "cuda" else (lambda: None)
    print(
        f"model {lm.name} {next(model.parameters()).dtype} on {lm.device}, threads {args.threads}, "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )

    # 1. forwards ----------------------------------------------------------------------------------
    def forward(ctx_factory):
        def run():
            with torch.inference_mode(), ctx_factory():
                model(window, use_cache=False)
            sync()

        return run

    arms = {}
    for s in schemes:
        arms[("wrapper", s)] = forward(lambda s=s: wrapper_arm(model, s))
        arms[("storage", s)] = forward(lambda s=s: quantized_kv(model, s))
    best: dict = {}
    keys = list(arms)
    for r in range(args.rounds):
        order = keys[r % len(keys) :] + keys[: r % len(keys)]
        for k in order:
            t = timed(arms[k])
            best[k] = min(best.get(k, float("inf")), t)
    print(f"\n1. one forward of {args.forward_length} tokens (min of {args.rounds} interleaved rounds)")
    print(f"{'scheme':30s} {'wrapper s':>10s} {'storage s':>10s} {'throughput storage/wrapper':>28s}")
    for s in schemes:
        w, st = best[("wrapper", s)], best[("storage", s)]
        print(f"{s:30s} {w:10.3f} {st:10.3f} {w / st:28.3f}")

    # 2. decode steps -----------------------------------------------------------------------------
    def decode(scheme):
        out = {}

        def run():
            with torch.inference_mode():
                ctx = quantized_kv(model, scheme) if scheme else None
                if ctx is not None:
                    ctx.__enter__()
                try:
                    res = model(prompt, use_cache=True)
                    cache, tok = output_cache(res), res.logits[:, -1:].argmax(-1)
                    sync()
                    start = time.perf_counter()
                    for _ in range(args.decode):
                        res = model(tok, **cache_inputs(model, cache))
                        tok = res.logits[:, -1:].argmax(-1)
                    sync()
                    out["step"] = (time.perf_counter() - start) / args.decode
                    out["cache"] = cache
                finally:
                    if ctx is not None:
                        ctx.__exit__(None, None, None)

        return run, out

    dec_arms = {s: decode(s) for s in [None] + schemes}
    steps: dict = {}
    for r in range(args.rounds):
        order = list(dec_arms)
        order = order[r % len(order) :] + order[: r % len(order)]
        for s in order:
            run, out = dec_arms[s]
            run()
            steps[s] = min(steps.get(s, float("inf")), out["step"])
    plain = steps[None]
    print(
        f"\n2. decode step at {args.length} context ({args.decode} steps, min of {args.rounds} rounds): plain transformers {plain * 1e3:.1f} ms"
    )
    print(f"{'scheme':30s} {'ms/step':>10s} {'vs plain':>10s}")
    for s in schemes:
        print(f"{s:30s} {steps[s] * 1e3:10.1f} {steps[s] / plain:10.3f}")

    # 3. memory -----------------------------------------------------------------------------------
    dyn = dec_arms[None][1]["cache"]
    dyn_bytes = sum(
        layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
        for layer in dyn.layers
    )
    bf16_bytes = sum(layer.keys.numel() * 2 + layer.values.numel() * 2 for layer in dyn.layers)
    print(
        f"\n3. cache memory after {args.length} + {args.decode} tokens: transformers DynamicCache {dyn_bytes / 2**20:.1f} MiB "
        f"({next(model.parameters()).dtype}), BF16 {bf16_bytes / 2**20:.1f} MiB"
    )
    print(f"{'scheme':30s} {'held MiB':>10s} {'held/dynamic':>13s} {'engine bytes/BF16':>18s}")
    for s in schemes:
        cache = dec_arms[s][1]["cache"]
        held = sum(st.held_bytes() for layer in cache.storage_layers() for st in (layer.k, layer.v))
        print(f"{s:30s} {held / 2**20:10.1f} {held / dyn_bytes:13.3f} {cache.nbytes() / bf16_bytes:18.4f}")


if __name__ == "__main__":
    main()
