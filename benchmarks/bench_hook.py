"""Hook overhead and real-cache memory on the embedded model (issue: core, performance).

1. Forward time of one 2048-token sequence with the hook, as a ratio to the unhooked model.
   Variants are interleaved (order rotated each round) and each ratio is the median of per-round
   ratios to that round's unhooked forward, so a noisy, shared machine slows both sides alike.
   Targets: identity <= 1.02, fp8_e4m3/head/dynamic <= 1.05.
   The naive float8-cast round trip is measured beside it for reference. Wall and CPU-time
   (process_time) medians are both reported: on a shared machine the CPU-time ratio is the
   steadier one.
   Beside it, the quantizer's own time inside a forward, measured directly, as a share of the
   unhooked forward: the overhead without the noise of differencing two multi-second forwards.
2. Real FP8 cache bytes after a 2048-token prompt plus 64 generated tokens, as a fraction of the
   BF16 cache (2 bytes per element). Target <= 0.51 for tensor and head.

    python benchmarks/bench_hook.py [--rounds 7] [--tokens 2048] [--skip-cache]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import torch

from evalkit import quantized_kv
from evalkit.cache import quantized_cache
from evalkit.models import load_model


@contextlib.contextmanager
def naive_cast_round_trip():
    """Swap the emulation for torch's own float8 cast (what the emulation replaces)."""
    import evalkit.quantize as q
    from evalkit.fp8_emulation import round_to_fp8_by_cast

    original = q.round_to_fp8
    q.round_to_fp8 = round_to_fp8_by_cast
    try:
        yield
    finally:
        q.round_to_fp8 = original


def forward_ratios(lm, tokens: int, rounds: int) -> dict:
    """Each round runs every variant once, in an order rotated by one per round (so no variant
    always follows the same one); a variant's ratio in a round is to that round's unhooked forward,
    and the figure is the median of the per-round ratios (paired: slow phases of a shared machine
    hit both sides of a ratio). Medians of the raw times are given beside them."""
    from pydoc_data.topics import topics

    text = " ".join(topics.values())
    ids = lm.tokenizer(text, return_tensors="pt").input_ids[:, :tokens]
    model = lm.model
    variants = {
        "unhooked": contextlib.nullcontext,
        "identity (bf16)": lambda: quantized_kv(model, "bf16"),
        "fp8_e4m3/head/dynamic": lambda: quantized_kv(model, "fp8_e4m3/head/dynamic"),
        "fp8_e4m3/head/dynamic (naive cast)": lambda: _stacked(naive_cast_round_trip(), quantized_kv(model, "fp8_e4m3/head/dynamic")),
    }
    names = list(variants)
    wall = {name: [] for name in names}
    cpu = {name: [] for name in names}
    with torch.inference_mode():
        model(ids[:, :256])  # warm-up
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                with variants[name]():
                    t, c = time.perf_counter(), time.process_time()
                    model(ids)
                    wall[name].append(time.perf_counter() - t)
                    cpu[name].append(time.process_time() - c)
    out = {}
    for name in names:
        out[name] = {"wall_median_s": round(statistics.median(wall[name]), 3),
                     "wall_ratio": round(statistics.median(w / b for w, b in zip(wall[name], wall["unhooked"])), 4),
                     "cpu_ratio": round(statistics.median(c / b for c, b in zip(cpu[name], cpu["unhooked"])), 4),
                     "wall_ratio_of_medians": round(statistics.median(wall[name]) / statistics.median(wall["unhooked"]), 4)}
    return out


def quantizer_share(lm, tokens: int, rounds: int, scheme: str = "fp8_e4m3/head/dynamic") -> dict:
    """The hook's own work, timed directly: seconds spent inside the quantizer's calls during one
    forward, as a fraction of the unhooked forward (a far less noisy estimate of the overhead than
    a ratio of two forwards of several seconds each). Both medians over ``rounds``."""
    from pydoc_data.topics import topics

    from evalkit.kv_quantizer import KVQuantizer

    ids = lm.tokenizer(" ".join(topics.values()), return_tensors="pt").input_ids[:, :tokens]
    inside, forward = [], []
    original = KVQuantizer.__call__

    def timed_call(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            inside[-1] += time.perf_counter() - t

    with torch.inference_mode():
        for _ in range(rounds):
            t = time.perf_counter()
            lm.model(ids)
            forward.append(time.perf_counter() - t)
            inside.append(0.0)
            KVQuantizer.__call__ = timed_call
            try:
                with quantized_kv(lm.model, scheme):
                    lm.model(ids)
            finally:
                KVQuantizer.__call__ = original
    share = statistics.median(inside) / statistics.median(forward)
    return {"scheme": scheme, "quantizer_seconds_per_forward": round(statistics.median(inside), 4),
            "unhooked_forward_s": round(statistics.median(forward), 3), "overhead_share": round(share, 4)}


@contextlib.contextmanager
def _stacked(*cms):
    with contextlib.ExitStack() as stack:
        for cm in cms:
            stack.enter_context(cm)
        yield


def cache_bytes(lm, tokens: int, new_tokens: int) -> dict:
    from pydoc_data.topics import topics

    ids = lm.tokenizer(" ".join(topics.values()), return_tensors="pt").input_ids[:, :tokens]
    out = {}
    bf16 = None
    for scheme in ("bf16", "fp8_e4m3/tensor/dynamic", "fp8_e4m3/head/dynamic", "fp8_e4m3/block16/dynamic", "fp8_e4m3/token/dynamic"):
        with torch.inference_mode(), quantized_cache(lm.model, scheme) as new_cache:
            cache = new_cache()
            lm.model.generate(ids, cache=cache, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        nbytes = cache.nbytes()
        bf16 = bf16 or nbytes
        out[scheme] = {"bytes": nbytes, "ratio_to_bf16": round(nbytes / bf16, 5), "tokens": cache.get_seq_length()}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--skip-cache", action="store_true")
    args = ap.parse_args()
    lm = load_model("embedded")
    result = {"threads": torch.get_num_threads(), "forward": forward_ratios(lm, args.tokens, args.rounds),
              "quantizer_share": quantizer_share(lm, args.tokens, max(3, args.rounds // 2))}
    with naive_cast_round_trip():
        result["quantizer_share_naive_cast"] = quantizer_share(lm, args.tokens, max(3, args.rounds // 2))
    if not args.skip_cache:
        result["cache"] = cache_bytes(lm, args.tokens, args.new_tokens)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
