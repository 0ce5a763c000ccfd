"""Perplexity evaluation speed and memory on the embedded model, as ratios measured in one run.

    python benchmarks/bench_perplexity.py throughput [--window 512] [--windows 4] [--rounds 2]
    python benchmarks/bench_perplexity.py memory [--lengths 1024,4096,8192]

``throughput``: scored tokens per second of (a) a plain transformers loop
(``model(ids, labels=ids)`` per window), (b) ``PerplexityEval.evaluate`` for the baseline scheme
and (c) for ``fp8_e4m3/head/dynamic``, over the same disjoint windows of the embedded corpus. The
methods are interleaved round by round (the machine is shared, so its speed drifts) and each
method's best round is reported, with the ratios to the plain loop. The one-off baseline pass
(``prepare``) is timed once and reported separately.

``memory``: for each window length, a fresh subprocess loads the model, then samples its resident
set size every 5 ms while it tokenizes the corpus (cached on disk, so measured on its own), runs
``prepare`` and ``evaluate(fp8_e4m3/head/dynamic)`` on one window, and then the plain loop on the
same window; it prints the peak RSS above the level before each step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

SCHEME = "fp8_e4m3/head/dynamic"


def _load():
    from evalkit.models import load_model

    return load_model("embedded")


def _windows(ev):
    c = ev.params["window"] - int(ev.bos)
    return [ev.ids[s: s + c][None] for s, _ in ev.plan]


def plain_loop(lm, windows) -> tuple[float, int]:
    """The reference: model(ids, labels=ids) per window; returns (seconds, scored tokens)."""
    n, t = 0, time.perf_counter()
    with torch.inference_mode():
        for ids in windows:
            loss = lm.model(ids, labels=ids).loss
            n += ids.shape[1] - 1
            float(loss)
    return time.perf_counter() - t, n


def throughput(args) -> None:
    from evalkit.evals.perplexity import PerplexityEval
    from evalkit.scheme import Scheme, parse_scheme

    lm = _load()
    ev = PerplexityEval(dict(window=args.window, max_windows=args.windows, corpus="embedded", bos=False))
    with tempfile.TemporaryDirectory() as work:
        t = time.perf_counter()
        ev.prepare(lm, Path(work))
        prep = time.perf_counter() - t
        windows = _windows(ev)
        n = int(ev.offsets[-1])
        best = {"plain": float("inf"), "bf16": float("inf"), SCHEME: float("inf")}
        for r in range(args.rounds):
            for name in best:
                t = time.perf_counter()
                if name == "plain":
                    _, n_plain = plain_loop(lm, windows)
                    assert n_plain == n, (n_plain, n)
                else:
                    ev.evaluate(lm, Scheme() if name == "bf16" else parse_scheme(name))
                best[name] = min(best[name], time.perf_counter() - t)
                print(f"round {r} {name:24s} {time.perf_counter() - t:8.2f} s", flush=True)
    tps = {k: n / v for k, v in best.items()}
    print(f"\nembedded model, {len(windows)} windows x {args.window} tokens, {n} scored tokens, "
          f"torch threads {torch.get_num_threads()}, best of {args.rounds} rounds")
    print(f"{'method':28s} {'tokens/s':>9s} {'ratio to plain':>15s}")
    for k, v in tps.items():
        print(f"{k:28s} {v:9.1f} {v / tps['plain']:15.3f}")
    print(f"{'prepare (baseline, once)':28s} {n / prep:9.1f} {n / prep / tps['plain']:15.3f}")


class _PeakRSS:
    """Samples this process's resident set size in a thread; ``peak`` is the maximum seen."""

    def __init__(self, every: float = 0.005):
        self.every, self.peak, self._stop = every, 0, threading.Event()

    @staticmethod
    def now() -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(self.every)

    def __enter__(self):
        self.start = self.peak = self.now()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())

    @property
    def delta_mb(self) -> float:
        return (self.peak - self.start) / 2**20


def memory_one(length: int) -> dict:
    from evalkit.evals.perplexity import PerplexityEval
    from evalkit.scheme import parse_scheme

    lm = _load()
    ev = PerplexityEval(dict(window=length, max_windows=1, corpus="embedded", bos=False))
    with tempfile.TemporaryDirectory() as work:
        from evalkit.corpus import load_corpus, tokenize_corpus

        with _PeakRSS() as tokenize:  # corpus tokenization is cached on disk; measured on its own
            tokenize_corpus(load_corpus("embedded"), lm.tokenizer, Path(work))
        with _PeakRSS() as prep:
            ev.prepare(lm, Path(work))
        with _PeakRSS() as evaluate:
            ev.evaluate(lm, parse_scheme(SCHEME))
        windows = _windows(ev)
    with _PeakRSS() as plain:
        plain_loop(lm, windows)
    return dict(window=length, tokenize_mb=tokenize.delta_mb, prepare_mb=prep.delta_mb, evaluate_mb=evaluate.delta_mb, plain_mb=plain.delta_mb)


def memory(args) -> None:
    print("peak RSS above the level before each step, MB (fresh process per window length)")
    print(f"{'window':>7s} {'tokenize':>9s} {'prepare':>8s} {'evaluate':>9s} {'plain loop':>11s}")
    for length in [int(x) for x in args.lengths.split(",")]:
        out = subprocess.run([sys.executable, __file__, "memory-one", str(length)], capture_output=True, text=True,
                             check=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{r['window']:7d} {r['tokenize_mb']:9.0f} {r['prepare_mb']:8.0f} {r['evaluate_mb']:9.0f} {r['plain_mb']:11.0f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["throughput", "memory", "memory-one"])
    p.add_argument("length", nargs="?", type=int)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--windows", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--lengths", default="1024,4096,8192")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.mode == "throughput":
        throughput(args)
    elif args.mode == "memory":
        memory(args)
    else:
        print(json.dumps(memory_one(args.length)))


if __name__ == "__main__":
    main()
