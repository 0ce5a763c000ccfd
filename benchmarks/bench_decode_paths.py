"""The decode paths side by side on the embedded model: the memory the storage cache holds against
transformers' plain cache, and compiled against eager decode steps, in one run.

    python benchmarks/bench_decode_paths.py [--batch 4] [--context 512] [--steps 32] [--rounds 3]
        [--schemes fp8_e4m3/tensor/dynamic,...] [--backend inductor]

Memory (per scheme): after a prefill of ``--context`` tokens and ``--steps`` decode steps of the
decode loop (:func:`evalkit.evals.decode.loop.decode_logits`), what the dynamic storage cache holds
(``held_bytes``: codes, scales, growth room; no full-precision copy) and the engine's bytes
(``nbytes``), against transformers' ``DynamicCache`` of the same tokens in the model's dtype; and the
static cache's held bytes (its buffers for the whole sequence).

Speed (per scheme): the median step time of the loop on each path (``eager``: the dynamic storage
cache; ``static``: the static cache, eager; ``compiled``: the static step under ``torch.compile``
with ``--backend``), rounds interleaved with the order rotated, each arm a full prefill + steps; the
first compiled round pays the compilation and is reported apart. Reported: each path's median step
and its ratio to ``eager`` in the same round (median over rounds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PATHS = ("eager", "static", "compiled")


def one_pass(lm, scheme: str, ids: torch.Tensor, prefill: int, path: str) -> tuple[list[float], object]:
    """Step times (s) of the decode loop on ``path``, and the cache it left."""
    from evalkit import quantized_kv
    from evalkit.evals.decode.loop import decode_logits

    head = lm.model.get_output_embeddings()
    times, t = [], None
    caches = []
    with torch.inference_mode(), quantized_kv(lm.model, scheme) as session:
        new_cache, new_static = session.new_cache, session.new_static_cache
        session.new_cache = lambda *a, **k: caches.append(new_cache(*a, **k)) or caches[-1]
        session.new_static_cache = lambda *a, **k: caches.append(new_static(*a, **k)) or caches[-1]
        for logits in decode_logits(lm.model, head, session, ids, torch.ones_like(ids), prefill, None, path):
            logits.argmax(-1)
            now = time.perf_counter()
            if t is not None:
                times.append(now - t)
            t = now
    return times, caches[-1]


def memory(lm, scheme: str, ids, prefill) -> dict:
    from transformers import DynamicCache

    from evalkit.integration.hf_compat import cache_inputs

    _, dynamic = one_pass(lm, scheme, ids, prefill, "eager")
    _, static = one_pass(lm, scheme, ids, prefill, "static")
    with torch.inference_mode():
        plain = DynamicCache(config=lm.model.config)
        lm.model(ids[:, :-1], **cache_inputs(lm.model, plain))
    plain_bytes = sum(layer.keys.numel() * layer.keys.element_size() * 2 for layer in plain.layers)
    held = sum(st.held_bytes() for layer in dynamic.storage_layers() for st in (layer.k, layer.v))
    return {
        "plain": plain_bytes,
        "held": held,
        "engine": dynamic.nbytes(),
        "static_held": static.held_bytes(),
        "held_vs_plain": held / plain_bytes,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--schemes", default="bf16,fp8_e4m3/tensor/dynamic,fp8_e4m3/token/dynamic,vllm:int8_per_token_head")
    ap.add_argument("--backend", default="inductor", help="torch.compile backend of the compiled path")
    args = ap.parse_args(argv)
    os.environ["EVALKIT_COMPILE_BACKEND"] = args.backend

    from evalkit.models.loading import load_model
    from evalkit.runtime import numerics

    numerics.configure()
    lm = load_model("embedded")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, lm.model.config.vocab_size, (args.batch, args.context + args.steps + 1), generator=g)
    print(
        f"embedded model ({lm.model.dtype}, {torch.get_num_threads()} threads), batch {args.batch}, "
        f"prefill {args.context}, {args.steps} steps, compiled with {args.backend}"
    )
    print("\nmemory after the decode (bytes):")
    print(
        f"{'scheme':32s} {'DynamicCache':>14s} {'held':>14s} {'engine':>14s} {'held/plain':>10s} {'static held':>14s}"
    )
    for scheme in args.schemes.split(","):
        m = memory(lm, scheme, ids, args.context)
        print(
            f"{scheme:32s} {m['plain']:14,d} {m['held']:14,d} {m['engine']:14,d} {m['held_vs_plain']:10.3f} "
            f"{m['static_held']:14,d}"
        )
    print("\ndecode step, median ms (ratio to eager in the same round, median over rounds):")
    for scheme in args.schemes.split(","):
        t = time.perf_counter()
        first, _ = one_pass(lm, scheme, ids, args.context, "compiled")  # the compilation
        compile_s = time.perf_counter() - t
        per_path = {p: [] for p in PATHS}
        ratios = {p: [] for p in PATHS}
        for r in range(args.rounds):
            order = PATHS[r % 3 :] + PATHS[: r % 3]
            medians = {}
            for path in order:
                times, _ = one_pass(lm, scheme, ids, args.context, path)
                medians[path] = statistics.median(times)
                per_path[path].append(medians[path])
            for path in PATHS:
                ratios[path].append(medians[path] / medians["eager"])
        cells = "  ".join(
            f"{p} {statistics.median(per_path[p]) * 1e3:7.2f} ({statistics.median(ratios[p]):.2f}x)" for p in PATHS
        )
        print(f"{scheme:32s} {cells}   first compiled pass {compile_s:.1f} s")


if __name__ == "__main__":
    main()
