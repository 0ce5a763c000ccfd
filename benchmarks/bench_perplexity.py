"""Perplexity evaluation speed and memory on the embedded model, as ratios measured in one run.

    python benchmarks/bench_perplexity.py throughput [--window 512] [--windows 4] [--rounds 2]
    python benchmarks/bench_perplexity.py memory [--lengths 1024,4096,8192]
    python benchmarks/bench_perplexity.py kl [--model embedded|llama128k] [--window 512] [--windows 4] [--schemes ...]

``throughput``: scored tokens per second of (a) a plain transformers loop
(``model(ids, labels=ids)`` per window), (b) ``PerplexityEval.evaluate`` for the baseline scheme
and (c) for ``fp8_e4m3/head/dynamic``, over the same disjoint windows of the embedded corpus. The
methods are interleaved round by round (the machine is shared, so its speed drifts) and each
method's best round is reported, by wall time and by the CPU time of the compute thread (torch
runs single-threaded here), with the ratios to the plain loop. The one-off baseline pass
(``prepare``) is timed once and reported separately.

``memory``: for each window length and each step (tokenizing the corpus, ``prepare`` = the
baseline pass, ``evaluate(fp8_e4m3/head/dynamic)``, and the plain loop) a fresh subprocess loads
the model, runs a short warm-up forward, then samples its resident set size every 5 ms during the
step on one window, and prints the peak above the level before the step. Fresh processes keep
memory freed by one step (and kept by the allocator) from hiding the next step's growth.

``kl``: the 2 KB-per-token KL (:mod:`evalkit.evals.kl_topk`) against the full-vocabulary KL, per
scheme: ``PerplexityEval`` on disjoint windows of the embedded corpus, and the same windows run
through the model directly with float64 log-softmax over the whole vocabulary (the reference). It
prints the estimate's relative error, the proven lower bound's, the reported sampling standard
error, the mean tail mass and the baseline folder's bytes on disk per scored token. ``--model
llama128k`` is a random llama with a 131072-token vocabulary (hidden 64, 2 layers, the embedded
tokenizer): the disk cost at an LLM vocabulary.
"""

from __future__ import annotations

import argparse
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
    from evalkit.models.loading import load_model

    return load_model("embedded")


def _windows(ev):
    c = ev.params["window"] - int(ev.bos)
    return [ev.ids[s : s + c][None] for s, _ in ev.plan]


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
    from evalkit.evals.perplexity.evaluation import PerplexityEval
    from evalkit.kv.scheme import Scheme, parse_scheme

    lm = _load()
    ev = PerplexityEval(dict(window=args.window, max_windows=args.windows, corpus="embedded", bos=False))
    with tempfile.TemporaryDirectory() as work:
        t = time.perf_counter()
        ev.prepare(lm, Path(work))
        prep = time.perf_counter() - t
        windows = _windows(ev)
        n = int(ev.offsets[-1])
        names = ["plain", "bf16", SCHEME]
        wall, cpu = {k: float("inf") for k in names}, {k: float("inf") for k in names}
        for r in range(args.rounds):
            for name in names:
                t, c = time.perf_counter(), time.thread_time()
                if name == "plain":
                    _, n_plain = plain_loop(lm, windows)
                    assert n_plain == n, (n_plain, n)
                else:
                    ev.evaluate(lm, Scheme() if name == "bf16" else parse_scheme(name))
                t, c = time.perf_counter() - t, time.thread_time() - c
                wall[name], cpu[name] = min(wall[name], t), min(cpu[name], c)
                print(f"round {r} {name:24s} wall {t:8.2f} s   cpu {c:8.2f} s", flush=True)
    print(
        f"\nembedded model, {len(windows)} windows x {args.window} tokens, {n} scored tokens, "
        f"torch threads {torch.get_num_threads()}, best of {args.rounds} interleaved rounds"
    )
    print("tokens/s by wall time and by CPU time of the (only) compute thread, which a shared machine disturbs less")
    print(f"{'method':28s} {'wall tok/s':>10s} {'ratio':>6s} {'cpu tok/s':>10s} {'ratio':>6s}")
    for k in names:
        print(
            f"{k:28s} {n / wall[k]:10.1f} {wall['plain'] / wall[k]:6.3f} {n / cpu[k]:10.1f} {cpu['plain'] / cpu[k]:6.3f}"
        )
    print(
        f"{'prepare (baseline, once)':28s} {n / prep:10.1f} {wall['plain'] / prep:6.3f}   (includes tokenizing the corpus)"
    )


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


def memory_one(length: int, step: str, work: Path) -> float:
    """Peak RSS growth (MB) of one step on one window, in this (fresh) process, after a warm-up."""
    from evalkit.data.corpus import load_corpus, tokenize_corpus
    from evalkit.evals.perplexity.evaluation import PerplexityEval
    from evalkit.kv.scheme import parse_scheme

    lm = _load()
    with torch.inference_mode():  # one-time allocations (kernels, workspaces) are not the window's
        lm.model(torch.arange(1, 9)[None])
    ev = PerplexityEval(dict(window=length, max_windows=1, corpus="embedded", bos=False))
    if step == "tokenize":
        with _PeakRSS() as peak:
            tokenize_corpus(load_corpus("embedded"), lm.tokenizer, work)
        return peak.delta_mb
    if step == "prepare":
        with _PeakRSS() as peak:
            ev.prepare(lm, work)
        return peak.delta_mb
    ev.prepare(lm, work)  # cached on disk by the prepare step
    with _PeakRSS() as peak:
        if step == "evaluate":
            ev.evaluate(lm, parse_scheme(SCHEME))
        else:
            plain_loop(lm, _windows(ev))
    return peak.delta_mb


def memory(args) -> None:
    steps = ["tokenize", "prepare", "evaluate", "plain"]
    print("peak RSS above the level before the step, MB (a fresh process per window length and step;")
    print(f"evaluate = {SCHEME}; plain = model(ids, labels=ids))")
    print(f"{'window':>7s} " + " ".join(f"{s:>9s}" for s in steps))
    for length in [int(x) for x in args.lengths.split(",")]:
        out = []
        with tempfile.TemporaryDirectory() as work:
            for step in steps:
                res = subprocess.run(
                    [sys.executable, __file__, "memory-one", str(length), "--step", step, "--work", work],
                    capture_output=True,
                    text=True,
                    check=True,
                    env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
                )
                out.append(float(res.stdout.strip().splitlines()[-1]))
        print(f"{length:7d} " + " ".join(f"{v:9.0f}" for v in out), flush=True)


KL_SCHEMES = (
    "fp8_e4m3/tensor/dynamic",
    "fp8_e4m3/head/dynamic",
    "fp8_e4m3/block16/dynamic",
    "int4_asym/group8/dynamic",
    "int4/tensor/dynamic",
)


def _llama128k(folder: Path):
    """A random llama with a 131072-token vocabulary, saved with the embedded model's tokenizer."""
    import transformers as tf

    from evalkit.models.loading import load_model

    tok = _load().tokenizer
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        vocab_size=131072,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return load_model(str(folder))


def full_vocabulary_kl(lm, ev, scheme) -> float:
    """Mean KL over the scored tokens from the whole vocabulary: float64 log-softmax of the logits of
    ``model(ids)`` without and with the scheme."""
    from evalkit.integration.install import quantized_kv

    total, n = 0.0, 0
    with torch.inference_mode():
        for ids in _windows(ev):
            base = lm.model(ids).logits[0, :-1].double().log_softmax(-1)
            with quantized_kv(lm.model, scheme):
                quant = lm.model(ids).logits[0, :-1].double().log_softmax(-1)
            total += float((base.exp() * (base - quant)).sum())
            n += base.shape[0]
    return total / n


def kl(args) -> None:
    from evalkit.evals.perplexity.evaluation import PerplexityEval

    with tempfile.TemporaryDirectory() as work:
        lm = _load() if args.model == "embedded" else _llama128k(Path(work) / "llama128k")
        ev = PerplexityEval(
            dict(window=args.window, max_windows=args.windows, corpus="embedded", bos=False, bootstrap_samples=200)
        )
        t = time.perf_counter()
        ev.prepare(lm, Path(work))
        prep = time.perf_counter() - t
        n = int(ev.offsets[-1])
        disk = sum(f.stat().st_size for f in ev.backend.perplexity.dir.iterdir())
        vocab = ev.backend.perplexity.head.vocab
        print(
            f"{args.model}: vocabulary {vocab}, {len(ev.plan)} windows x {args.window} tokens, {n} scored tokens; "
            f"baseline {prep:.1f} s, {disk} bytes on disk = {disk / n:.0f} B per scored token "
            f"(full float16 distributions: {2 * vocab} B)"
        )
        print(
            f"{'scheme':28s} {'full KL':>10s} {'estimate':>10s} {'error':>8s} {'lower bd':>9s} {'se':>7s} {'tail mass':>9s}"
        )
        for name in args.schemes.split(","):
            row = next(r for r in ev.evaluate(lm, name) if r.metric == "kl_mean" and not r.labels)
            ref = full_vocabulary_kl(lm, ev, name)
            info = row.info
            print(
                f"{name:28s} {ref:10.6f} {row.value:10.6f} {100 * (row.value / ref - 1):+7.3f}% "
                f"{100 * (info['kl_lower_bound'] / ref - 1):+8.2f}% {100 * info['kl_sampling_se'] / ref:6.3f}% "
                f"{info['kl_tail_mass']:9.3f}",
                flush=True,
            )
        print("error, lower bd and se relative to the full-vocabulary KL")


def main() -> None:
    from evalkit.runtime import numerics

    numerics.configure()  # as the command line: batch-invariant BLAS, before the first matrix product
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["throughput", "memory", "memory-one", "kl"])
    p.add_argument("length", nargs="?", type=int)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--windows", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--lengths", default="1024,4096,8192")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--step", default="evaluate")
    p.add_argument("--work", type=Path)
    p.add_argument("--model", choices=["embedded", "llama128k"], default="embedded", help="kl: the model")
    p.add_argument("--schemes", default=",".join(KL_SCHEMES), help="kl: comma-separated schemes")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.mode == "throughput":
        throughput(args)
    elif args.mode == "memory":
        memory(args)
    elif args.mode == "kl":
        kl(args)
    else:
        print(memory_one(args.length, args.step, args.work))


if __name__ == "__main__":
    main()
