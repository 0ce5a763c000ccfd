"""The decode evaluation's cost per step against plain transformers, side by side in one run, and
its cache memory against length.

    python benchmarks/bench_decode.py [--batch 4] [--context 512] [--steps 32] [--rounds 5] [--threads 1]
        [--schemes fp8_e4m3/tensor/dynamic,...] [--lengths 256,512,1024,2048] [--profile SCHEME]

On the embedded model (float32 on CPU unless --device/--dtype say otherwise), ``--batch`` rows
(``batch / 2`` sequences, each a teacher-forced and a free-running row, as the eval runs them),
``--context`` prefill tokens, then ``--steps`` decode steps. Three arms per step:

* ``plain``: transformers alone: ``model(token, attention_mask, position_ids, <cache>=DynamicCache)``
  and the argmax of its logits (what ``generate`` does per greedy step); no evalkit anywhere;
* ``loop``: the eval's loop (:func:`evalkit.evals.decode.loop.decode_logits`) through the storage
  cache under the scheme: one decode forward of the backbone, the output head, the argmax;
* ``eval``: :meth:`evalkit.evals.emulation.decode.DecodeEmulation.run_pass` with its own scorer: the loop plus log-softmax, NLL,
  KL against the stored baseline distribution (read from disk) and top-1, i.e. a whole step of
  ``evalkit run --eval decode``.

Rounds are interleaved (every arm once per round, order rotated, each arm a full prefill + steps);
per round and arm the median step time; reported: the median over rounds of each arm's ratio to
``plain`` in the same round, and the ratio of the per-arm minima. ``--profile SCHEME`` prints
torch.profiler's table of the ``loop`` arm's decode steps (top operators by self CPU time): where a
step's time goes.

Memory: the storage cache after ``L - 1`` tokens (a prefill of ``L - 17``, then 16 decode steps)
for each ``--lengths`` L: the bytes an engine would hold (``cache.nbytes()``: codes and scales) and
what this process holds (dequantized copy + codes + scales + growth slack), per token, against
transformers' DynamicCache in the model's dtype. Constant bytes per token = memory linear in P + T.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from evalkit.integration.hf_compat import cache_inputs

SCHEMES = [
    "bf16",
    "fp8_e4m3/tensor/dynamic",
    "fp8_e4m3/head/dynamic",
    "fp8_e5m2/tensor/unit",
    "fp8_e4m3/block16/dynamic",
]


def plain_arm(lm, ids, prefill, steps, sync):
    """Step times of plain transformers decoding (DynamicCache, no evalkit), teacher-forced on ``ids``."""
    from transformers import DynamicCache

    from evalkit.evals.decode.loop import position_ids

    model, mask = lm.model, torch.ones_like(ids)
    pos = position_ids(mask)
    times = []
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(
            ids[:, :prefill],
            attention_mask=mask[:, :prefill],
            position_ids=pos[:, :prefill],
            **cache_inputs(model, cache),
            logits_to_keep=1,
        )
        sync()
        times.append(time.perf_counter())
        for t in range(prefill, prefill + steps):
            out = model(
                ids[:, t : t + 1],
                attention_mask=mask[:, : t + 1],
                position_ids=pos[:, t : t + 1],
                **cache_inputs(model, cache),
            )
            out.logits[:, -1].argmax(-1)
            sync()
            times.append(time.perf_counter())
    return [b - a for a, b in zip(times, times[1:])]


def loop_arm(lm, head, scheme, ids, prefill, sync, keep=None):
    """Step times of the eval's loop through the storage cache (backbone + output head + argmax)."""
    from evalkit import quantized_kv
    from evalkit.evals.decode.loop import decode_logits

    times = []
    with torch.inference_mode(), quantized_kv(lm.model, scheme) as session:
        if keep is not None:  # hand the cache to the caller (memory part)
            make = session.new_cache
            session.new_cache = lambda mask=None: keep.append(make(mask)) or keep[-1]
        for logits in decode_logits(lm.model, head, session, ids.clone(), torch.ones_like(ids), prefill):
            logits.argmax(-1)
            sync()
            times.append(time.perf_counter())
    return [b - a for a, b in zip(times, times[1:])]


def eval_arm(ev, lm, scheme, sync):
    """Step times of the emulation's decode pass with its own scorer (a whole step of the eval)."""
    from evalkit.kv.scheme import parse_scheme

    emulation = ev.backend.decode  # the emulation backend's decode state (evalkit.evals.emulation.decode)
    record, _ = emulation.scorer(lm.device)
    times = []

    def timed(*args):
        record(*args)
        sync()
        times.append(time.perf_counter())

    emulation.run_pass(lm, parse_scheme(scheme), ev.inputs.clone(), timed)
    return [b - a for a, b in zip(times, times[1:])]


def main() -> None:
    from evalkit.runtime import numerics

    numerics.configure()  # as the command line: batch-invariant BLAS, before the first matrix product
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4, help="rows per forward (even: batch / 2 sequences)")
    ap.add_argument("--context", type=int, default=512, help="prefill tokens")
    ap.add_argument("--steps", type=int, default=32, help="decode steps per arm and round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--lengths", default="256,512,1024,2048", help="P + T for the memory part ('' skips it)")
    ap.add_argument(
        "--profile", default=None, metavar="SCHEME", help="profile the loop arm's decode steps under SCHEME"
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    if args.batch < 2 or args.batch % 2:
        ap.error("--batch must be even (each sequence is two rows)")
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("EVALKIT_PROGRESS", "0")
    from evalkit.evals.decode.evaluation import DecodeEval
    from evalkit.models.loading import load_model

    lm = load_model("embedded", device=args.device, dtype=args.dtype)
    sync = torch.cuda.synchronize if lm.device.type == "cuda" else (lambda: None)
    schemes = [s for s in args.schemes.split(",") if s]
    print(
        f"model {lm.name} {next(lm.model.parameters()).dtype} on {lm.device}, threads {args.threads}, "
        f"load average {os.getloadavg()[0]:.1f}; batch {args.batch} rows, context {args.context}, {args.steps} steps",
        flush=True,
    )
    work = tempfile.mkdtemp(prefix="bench-decode-")
    ev = DecodeEval(
        dict(
            prefill=args.context,
            decode=args.steps + 1,
            sequences=args.batch // 2,
            batch_size=args.batch,
            bootstrap_samples=100,
        )
    )
    start = time.perf_counter()
    ev.prepare(lm, work)  # the baseline pass (bf16), cached under a temporary folder
    print(f"baseline pass {time.perf_counter() - start:.1f} s", flush=True)
    ids = ev.inputs.to(lm.device)

    arms = {("plain", None): lambda: plain_arm(lm, ids, args.context, args.steps, sync)}
    for s in schemes:
        arms[("loop", s)] = lambda s=s: loop_arm(lm, ev.backend.decode.head, s, ids, args.context, sync)
        arms[("eval", s)] = lambda s=s: eval_arm(ev, lm, s, sync)
    rounds: list[dict] = []
    keys = list(arms)
    for r in range(args.rounds):
        order = keys[r % len(keys) :] + keys[: r % len(keys)]
        rounds.append({k: statistics.median(arms[k]()) for k in order})
        print(f"  round {r + 1}: plain {rounds[-1][('plain', None)] * 1e3:.1f} ms/step", flush=True)

    best = {k: min(rd[k] for rd in rounds) for k in keys}
    plain = best[("plain", None)]
    print(
        f"\n1. decode step, {args.batch} rows at {args.context}-{args.context + args.steps} context: plain transformers "
        f"{plain * 1e3:.1f} ms (min over {args.rounds} rounds of the per-round median)"
    )
    print(
        f"{'scheme':28s} {'loop ms':>8s} {'eval ms':>8s} {'loop/plain':>11s} {'eval/plain':>11s} {'(median of round ratios)':>26s}"
    )
    for s in schemes:
        med = [statistics.median(rd[(arm, s)] / rd[("plain", None)] for rd in rounds) for arm in ("loop", "eval")]
        print(
            f"{s:28s} {best[('loop', s)] * 1e3:8.1f} {best[('eval', s)] * 1e3:8.1f} {best[('loop', s)] / plain:11.3f} "
            f"{best[('eval', s)] / plain:11.3f} {med[0]:12.3f} {med[1]:12.3f}"
        )

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if lm.device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            loop_arm(lm, ev.backend.decode.head, args.profile, ids, args.context, sync)
        print(
            f"\nprofile of the loop arm under {args.profile} (prefill + {args.steps} steps), top operators by self CPU time:"
        )
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))

    lengths = [int(v) for v in args.lengths.split(",") if v]
    if lengths:
        from transformers import DynamicCache

        print(f"\n2. cache memory against length (batch {args.batch}): bytes per token (all rows, all layers)")
        print(f"{'scheme':28s} " + " ".join(f"{'L=' + str(n):>22s}" for n in lengths))
        print(f"{'':28s} " + " ".join(f"{'engine / held':>22s}" for _ in lengths))
        dyn = []
        for n in lengths:
            x = torch.randint(100, 10000, (args.batch, n - 1), generator=torch.Generator().manual_seed(n)).to(lm.device)
            with torch.inference_mode():
                cache = DynamicCache(config=lm.model.config)
                lm.model.base_model(input_ids=x, **cache_inputs(lm.model.base_model, cache))
            dyn.append(sum(layer.keys.numel() * layer.keys.element_size() * 2 for layer in cache.layers) / (n - 1))
        print(f"{'DynamicCache (held)':28s} " + " ".join(f"{d:22,.0f}" for d in dyn))
        for s in schemes:
            cells = []
            for n in lengths:
                x = torch.randint(100, 10000, (args.batch, n), generator=torch.Generator().manual_seed(n)).to(lm.device)
                keep: list = []
                loop_arm(lm, ev.backend.decode.head, s, x, n - 16, sync, keep)
                cache, tokens = keep[0], n - 1
                held = sum(st.held_bytes() for layer in cache.storage_layers() for st in (layer.k, layer.v))
                cells.append(f"{cache.nbytes() / tokens:10,.0f} / {held / tokens:9,.0f}")
            print(f"{s:28s} " + " ".join(f"{c:>22s}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
