"""Serving capacity, admission and speed of the embedded model measured from vLLM itself.

    /opt/vllm/bin/python benchmarks/bench_vllm_serving.py [--budget-gib 2] [--context 2048]
        [--load-budget-gib 0.015625] [--load-context 256] [--decode-tokens 8] [--no-float32]

1. Capacity (``--budget-gib`` of KV cache, ``max_model_len`` = ``--context``, model dtype bfloat16):
   per kv_cache_dtype (auto, fp8_e4m3, fp8_e5m2) the tokens vLLM's allocator fits and its maximum
   concurrency, evalkit's bytes per token for the same dtype, the ratio of the two and each dtype's
   capacity against auto from the allocator and from evalkit's count. Then auto in float32 (the
   embedded model's own dtype; ``--no-float32`` skips it): the case evalkit's unquantized BF16 count
   does not model, flagged with the term that explains it.
2. Admission and speed (``--load-budget-gib``, a budget small enough that the KV cache is the limit,
   requests of ``--load-context`` tokens with ``--decode-tokens`` generated): the requests running at
   once before the scheduler queued, and prefill / decode tokens/s at batch 1 and at that concurrency.
   Speeds are wall time per engine step on a shared machine: the host load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-gib", type=float, default=2.0)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--load-budget-gib", type=float, default=1 / 64)
    ap.add_argument("--load-context", type=int, default=256)
    ap.add_argument("--decode-tokens", type=int, default=8)
    ap.add_argument("--no-float32", action="store_true", help="skip the float32 auto run")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

    from evalkit.engines.vllm import serving as vs
    from evalkit.engines.vllm import serving_results as vr
    from evalkit.models.info import kv_layout
    from evalkit.models.loading import model_source
    from evalkit.models.presets import config_namespace

    folder, _ = model_source("embedded")
    with open(f"{folder}/config.json") as fh:
        layout = kv_layout(config_namespace(json.load(fh)))

    start = time.perf_counter()
    budget = vs.check_budget(args.budget_gib)
    ms = vs.measure(folder, layout, None, budget, args.context)
    print(f"## 1. capacity: {args.budget_gib:g} GiB KV budget, context {args.context:,}, model dtype bfloat16")
    print(vr.format_serving_table(vr.serving_table(vr.serving_rows(ms)), "md"))
    auto, fp8 = ms[0], ms[1]
    engine = fp8.allocation.kv_tokens / auto.allocation.kv_tokens
    counted = float(auto.comparison.computed_bytes_per_token / fp8.comparison.computed_bytes_per_token)
    print(
        f"\nfp8_e4m3 vs auto (BF16): allocator {engine:.4f}, evalkit {counted:.4f}, "
        f"difference {abs(engine / counted - 1):.3%}"
    )
    if not args.no_float32:
        f32 = vs.measure(folder, layout, ["auto"], budget, args.context, dtype="float32")
        print(f"\nauto in float32: {vr.format_serving_table(vr.serving_table(vr.serving_rows(f32)), 'md')}")

    load_budget = vs.check_budget(args.load_budget_gib)
    loads = vs.measure(
        folder,
        layout,
        ["auto", "fp8_e4m3"],
        load_budget,
        args.load_context,
        load=True,
        decode_tokens=args.decode_tokens,
    )
    print(
        f"\n## 2. admission and speed: {args.load_budget_gib:g} GiB KV budget, requests of {args.load_context:,} tokens "
        f"({args.load_context - args.decode_tokens} prompt + {args.decode_tokens} generated)"
    )
    print(vr.format_serving_table(vr.serving_table(vr.serving_rows(loads)), "md"))
    for m in loads:
        print(
            f"- {m.allocation.kv_cache_dtype}: {m.allocation.num_blocks} blocks of {m.allocation.block_size} "
            f"({m.allocation.usable_blocks} usable), {m.load.requests} requests submitted, peak running "
            f"{m.load.peak_running}, preemptions {m.load.preemptions}, host load average {m.info['host_load_average']}"
        )
    print(f"\nwall {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
