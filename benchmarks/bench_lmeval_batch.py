"""lm-eval items per second at batch size 8 against batch size 1, on CPU, measured in one run.

    python benchmarks/bench_lmeval_batch.py [--task evalkit_mmlu4] [--limit 24] [--rounds 3] \\
        [--batch 8] [--scheme fp8_e4m3/tensor/dynamic] [--threads 2]

The embedded model runs ``evalkit_mmlu4`` (224 four-choice questions; each is one forward of
the question, lm-eval scoring the four one-token answers from it) inside ``quantized_kv(scheme)``
through evalkit's exact-batching HFLM, at batch size 1 and at ``--batch``. The two are
interleaved round by round in ABBA order (the machine is shared, so its speed drifts); each
round is one ``run_lm_eval`` call, end to end as a sweep runs it. Reported: items per second of
each batch size (best round and median), the ratio of the medians and of the best rounds, and
the largest per-item log-likelihood difference between the two batch sizes (exactness check).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def items_per_second(hflm, tasks, scheme: str, limit: int, model) -> tuple[float, dict]:
    from evalkit.integration.install import quantized_kv
    from evalkit.lmeval_adapter import run_lm_eval

    t = time.perf_counter()
    with quantized_kv(model, scheme):
        results = run_lm_eval(hflm, tasks, num_fewshot=None, limit=limit, bootstrap_iters=0)
    seconds = time.perf_counter() - t
    logliks = {(task, s["doc_id"], i): r[0][0] for task, samples in results["samples"].items()
               for s in samples for i, r in enumerate(s["resps"])}
    n = sum(len(samples) for samples in results["samples"].values())
    return n / seconds, logliks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="evalkit_mmlu4")
    ap.add_argument("--limit", type=int, default=24, help="items per round (default 24)")
    ap.add_argument("--rounds", type=int, default=3, help="ABBA rounds (default 3: 6 runs per batch size)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--scheme", default="fp8_e4m3/tensor/dynamic")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from evalkit.lmeval_adapter import make_hflm, resolve_tasks
    from evalkit.models import load_model

    lm = load_model("embedded")
    tasks = resolve_tasks([args.task])
    hflms = {1: make_hflm(lm.model, lm.tokenizer, 1), args.batch: make_hflm(lm.model, lm.tokenizer, args.batch)}
    items_per_second(hflms[args.batch], tasks, args.scheme, 2, lm.model)  # warm-up: task loading, first forwards
    rates: dict[int, list[float]] = {1: [], args.batch: []}
    logliks: dict[int, dict] = {}
    for r in range(args.rounds):
        order = (1, args.batch, args.batch, 1) if r % 2 == 0 else (args.batch, 1, 1, args.batch)
        for bs in order:
            rate, logliks[bs] = items_per_second(hflms[bs], tasks, args.scheme, args.limit, lm.model)
            rates[bs].append(rate)
            print(f"round {r + 1}: batch {bs:>2}: {rate:.3f} items/s", flush=True)
    diff = max(abs(logliks[1][k] - logliks[args.batch][k]) for k in logliks[1])
    med = {bs: statistics.median(v) for bs, v in rates.items()}
    best = {bs: max(v) for bs, v in rates.items()}
    print(f"\n{args.task}, {args.limit} items per run, {args.scheme}, embedded model ({lm.model.dtype}), "
          f"{args.threads} threads, {2 * args.rounds} runs per batch size")
    for bs in rates:
        print(f"batch {bs:>2}: median {med[bs]:.3f} items/s, best {best[bs]:.3f} items/s")
    print(f"ratio batch {args.batch} / batch 1: median {med[args.batch] / med[1]:.2f}x, best {best[args.batch] / best[1]:.2f}x")
    print(f"largest per-item log-likelihood difference, batch {args.batch} vs 1: {diff:.2e}")


if __name__ == "__main__":
    main()
