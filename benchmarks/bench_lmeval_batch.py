"""lm-eval items per second at batch size 8 against batch size 1, on CPU, measured in one run.

    python benchmarks/bench_lmeval_batch.py [--task evalkit_mmlu4] [--limit 24] [--rounds 3] \\
        [--batch 8] [--scheme fp8_e4m3/tensor/dynamic] [--threads 2]

The embedded model runs ``evalkit_mmlu4`` (224 four-choice questions; each is one forward of
the question, lm-eval scoring the four one-token answers from it) inside ``quantized_kv(scheme)``
through evalkit's exact-batching HFLM, at batch size 1 and at ``--batch``. The two are
interleaved round by round in ABBA order (the machine is shared, so its speed drifts); each
round is one ``run_lm_eval`` call, end to end as a sweep runs it. Reported: items per second of
each batch size by wall time and by the process's CPU time (all its threads; a shared machine
disturbs it less), as median and best run, the ratios batch N / batch 1, and the largest per-item
log-likelihood difference between the two batch sizes (exactness check).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def items_per_second(hflm, tasks, scheme: str, limit: int, model) -> tuple[float, float, dict]:
    """(items per wall second, items per CPU second, per-item log-likelihoods) of one run."""
    from evalkit.evals.lmeval.adapter import run_lm_eval
    from evalkit.integration.install import quantized_kv

    t, c = time.perf_counter(), time.process_time()
    with quantized_kv(model, scheme):
        results = run_lm_eval(hflm, tasks, num_fewshot=None, limit=limit, bootstrap_iters=0)
    t, c = time.perf_counter() - t, time.process_time() - c
    logliks = {
        (task, s["doc_id"], i): r[0][0]
        for task, samples in results["samples"].items()
        for s in samples
        for i, r in enumerate(s["resps"])
    }
    n = sum(len(samples) for samples in results["samples"].values())
    return n / t, n / c, logliks


def main() -> None:
    from evalkit.runtime import numerics

    numerics.configure()  # as the command line: batch-invariant BLAS, before the first matrix product
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="evalkit_mmlu4")
    ap.add_argument("--limit", type=int, default=24, help="items per round (default 24)")
    ap.add_argument("--rounds", type=int, default=3, help="ABBA rounds (default 3: 6 runs per batch size)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--scheme", default="fp8_e4m3/tensor/dynamic")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from evalkit.evals.lmeval.adapter import make_hflm, resolve_tasks
    from evalkit.models.loading import load_model

    lm = load_model("embedded")
    tasks = resolve_tasks([args.task])
    hflms = {1: make_hflm(lm.model, lm.tokenizer, 1), args.batch: make_hflm(lm.model, lm.tokenizer, args.batch)}
    items_per_second(hflms[args.batch], tasks, args.scheme, 2, lm.model)  # warm-up: task loading, first forwards
    rates = {clock: {1: [], args.batch: []} for clock in ("wall", "cpu")}
    logliks: dict[int, dict] = {}
    for r in range(args.rounds):
        order = (1, args.batch, args.batch, 1) if r % 2 == 0 else (args.batch, 1, 1, args.batch)
        for bs in order:
            wall, cpu, logliks[bs] = items_per_second(hflms[bs], tasks, args.scheme, args.limit, lm.model)
            rates["wall"][bs].append(wall)
            rates["cpu"][bs].append(cpu)
            print(f"round {r + 1}: batch {bs:>2}: {wall:.3f} items/s wall, {cpu:.3f} items per CPU s", flush=True)
    diff = max(abs(logliks[1][k] - logliks[args.batch][k]) for k in logliks[1])
    print(
        f"\n{args.task}, {args.limit} items per run, {args.scheme}, embedded model ({lm.model.dtype}), "
        f"{args.threads} threads, {2 * args.rounds} runs per batch size"
    )
    for clock, by_bs in rates.items():
        med = {bs: statistics.median(v) for bs, v in by_bs.items()}
        best = {bs: max(v) for bs, v in by_bs.items()}
        for bs in by_bs:
            print(f"{clock:4s} batch {bs:>2}: median {med[bs]:.3f}, best {best[bs]:.3f} items/s")
        print(
            f"{clock:4s} ratio batch {args.batch} / batch 1: median {med[args.batch] / med[1]:.2f}x, "
            f"best {best[args.batch] / best[1]:.2f}x"
        )
    print(f"largest per-item log-likelihood difference, batch {args.batch} vs 1: {diff:.2e}")


if __name__ == "__main__":
    main()
