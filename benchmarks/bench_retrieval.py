"""Time of the retrieval grid per scheme on one model, side by side in one run.

    python benchmarks/bench_retrieval.py [--model embedded] [--schemes bf16,fp8_e4m3/tensor/dynamic]
        [--measure-lengths 1k,2k] [--prompts 2] [--rounds 1] [--threads 1]

1. Builds the full default grid (7 tasks x 1k/2k/4k/8k capped x 5 depths x 10 samples) once and
   reports how long that took: tokenization and prompt building happen once per grid, not per
   scheme.
2. For each length in ``--measure-lengths`` and each scheme (schemes interleaved, ``--rounds``
   times, keeping the fastest round: on a shared machine the minimum is the least disturbed),
   generates ``--prompts`` prompts of that length (one batch, the niah_single_number task) and
   reports seconds per prompt and the ratio to the baseline.
3. Extrapolates the default grid's time per scheme: seconds per prompt as a function of length is
   fitted as ``a*L + b*L^2`` with ``a, b >= 0`` (linear layers plus quadratic attention;
   non-negative least squares through the measured lengths), evaluated at each grid length, times
   the number of prompts there. Lengths that were not measured are marked as extrapolated.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from scipy.optimize import nnls


def main() -> None:
    from evalkit.runtime import numerics

    numerics.configure()  # as the command line: batch-invariant BLAS, before the first matrix product
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--schemes", default="bf16,fp8_e4m3/tensor/dynamic")
    ap.add_argument("--measure-lengths", default="1k,2k")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per measured length and scheme")
    ap.add_argument("--rounds", type=int, default=1, help="repeat each measurement, keep the fastest")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("EVALKIT_PROGRESS", "0")

    from evalkit.evals.retrieval import grid as G
    from evalkit.evals.retrieval.evaluation import RetrievalEval
    from evalkit.evals.retrieval.generate import generate_batches
    from evalkit.kv.scheme import parse_schemes
    from evalkit.models.loading import cache_root, load_model

    lm = load_model(args.model)
    schemes = parse_schemes(args.schemes)
    full = RetrievalEval({})
    t0 = time.perf_counter()
    full.prepare(lm, cache_root() / "work")
    t_grid = time.perf_counter() - t0
    counts = {n: sum(s.length == n for s in full.samples) for n in full.lengths}
    print(f"model {lm.name}, torch threads {args.threads}, load average {os.getloadavg()[0]:.1f}")
    print(f"default grid: {len(full.samples)} prompts, lengths {full.lengths}, built in {t_grid:.1f} s (once per grid)")

    measured = sorted({G.parse_length(x) for x in args.measure_lengths.split(",")})
    by_len = {n: [s for s in full.samples if s.task == "niah_single_number" and s.length == n] for n in full.lengths}
    times: dict[str, dict[int, float]] = {str(sc): {} for sc in schemes}
    for n in measured:
        pool = by_len.get(n)
        if not pool:  # a length outside the default grid
            extra = RetrievalEval(
                {"tasks": "niah_single_number", "lengths": [n], "samples": args.prompts, "depths": [50]}
            )
            extra.prepare(lm, None)
            pool = extra.samples
        prompts = [list(s.ids) for s in pool[: args.prompts]]
        max_new = max(s.max_new_tokens for s in pool[: args.prompts])
        for _ in range(args.rounds):
            for scheme in schemes:
                t0 = time.perf_counter()
                generate_batches(lm, scheme, [(prompts, max_new)])
                t = (time.perf_counter() - t0) / len(prompts)
                times[str(scheme)][n] = min(t, times[str(scheme)].get(n, float("inf")))

    base = str(schemes[0])
    print("\n| scheme | length | s / prompt | ratio vs " + base + " |\n|---|---|---|---|")
    for name, row in times.items():
        for n, t in row.items():
            print(f"| {name} | {n} | {t:.2f} | {t / times[base][n]:.2f} |")

    print("\n| scheme | grid time (h), from " + ",".join(map(str, measured)) + " | per length (s) |\n|---|---|---|")
    for name, row in times.items():
        L = np.array(list(row), dtype=float)
        A = np.stack([L, L**2], axis=1)
        coef = nnls(A, np.array(list(row.values())))[0]
        parts, total = [], 0.0
        for n in full.lengths:
            per = float(coef @ [n, n * n])
            total += per * counts[n]
            parts.append(f"{n}: {per * counts[n]:.0f}{'' if n in row else ' (extrapolated)'}")
        print(f"| {name} | {total / 3600:.2f} | {'; '.join(parts)} |")


if __name__ == "__main__":
    main()
