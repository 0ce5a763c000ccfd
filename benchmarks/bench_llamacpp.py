"""evalkit's ``--engine llamacpp`` perplexity against plain llama-cpp-python calls (target: <= 1.05x).

    python benchmarks/bench_llamacpp.py [--window 512] [--windows 4] [--rounds 2] [--scheme llamacpp:q8_0]

Same windows for both: ``--windows`` disjoint windows of ``--window`` tokens of the embedded corpus,
as ``evalkit run --eval perplexity`` cuts them, on the embedded GGUF, 2 threads, flash attention on.

- plain: what a user writes with llama-cpp-python's low-level API (the high-level ``Llama`` cannot turn
  off the AMX weight buffers that crash on this CPU): one f16-cache and one scheme-cache context, each
  window decoded with every position's logits, read with ``llama_get_logits``, then the scheme's NLL
  and KL(f16 || scheme) from a float64 log-softmax in numpy;
- evalkit: ``LlamaCppBackend.score`` on the prepared windows (the same two contexts and decodes, exact
  KL, top-1) and the evaluation's rows with their bootstrap intervals (``PerplexityEval.evaluate``).

Interleaved ABBA within each round (whichever runs right after the other pays its fresh allocations), the
best call each; both open their contexts inside the timed call. llama.cpp's
threads spin while they wait: run it alone (another process on one core slows a 2-thread run 100-fold).
"""

from __future__ import annotations

import argparse
import ctypes
import time

import numpy as np


def plain_run(llama_cpp, model, windows, type_k: int, type_v: int, n_ctx: int, threads: int) -> float:
    """Mean NLL of the scheme over the scored tokens, the way a user would compute it; KL computed too."""
    lib = llama_cpp

    def context(tk, tv):
        p = lib.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch = n_ctx, n_ctx, n_ctx
        p.n_threads = p.n_threads_batch = threads
        p.type_k, p.type_v = tk, tv
        p.flash_attn_type = 1
        p.n_outputs_max, p.n_outputs_max_per_seq = 0, 0
        return lib.llama_init_from_model(model, p)

    vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model))
    ctxs = [context(1, 1), context(type_k, type_v)]
    batch = lib.llama_batch_init(n_ctx, 0, 1)
    nll, kl = [], []
    try:
        for ids, t0 in windows:
            lps = []
            for ctx in ctxs:
                lib.llama_memory_clear(lib.llama_get_memory(ctx), True)
                for i, tok in enumerate(ids):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, i, 1
                    batch.seq_id[i][0], batch.logits[i] = 0, 1
                batch.n_tokens = len(ids)
                assert lib.llama_decode(ctx, batch) == 0
                ptr = ctypes.cast(lib.llama_get_logits(ctx), ctypes.POINTER(ctypes.c_float))
                x = np.ctypeslib.as_array(ptr, shape=(len(ids), vocab))[t0 - 1 : -1].astype(np.float64)
                x -= x.max(-1, keepdims=True)
                lps.append(x - np.log(np.exp(x).sum(-1, keepdims=True)))
            base, lq = lps
            targets = np.asarray(ids[t0:])
            nll.append(-lq[np.arange(len(targets)), targets])
            kl.append((np.exp(base) * (base - lq)).sum(-1))
    finally:
        lib.llama_batch_free(batch)
        for ctx in ctxs:
            lib.llama_free(ctx)
    return float(np.concatenate(nll).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--scheme", default="llamacpp:q8_0")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    from evalkit.engines.llamacpp import runtime
    from evalkit.engines.llamacpp.backend import LlamaCppBackend
    from evalkit.engines.llamacpp.cache_types import CACHE_TYPES
    from evalkit.engines.llamacpp.engine import cache_types
    from evalkit.engines.llamacpp.gguf import gguf_path
    from evalkit.evals.perplexity.evaluation import PerplexityEval
    from evalkit.kv.scheme import parse_scheme
    from evalkit.models.loading import cache_root, load_model

    llama_cpp = runtime.require()
    lm = load_model("embedded", dtype="float32")
    params = dict(corpus="embedded", window=args.window, stride=args.window, max_windows=args.windows)
    backend = LlamaCppBackend(n_threads=args.threads)
    ev = PerplexityEval(params, backend=backend)
    ev.prepare(lm, cache_root() / "work")
    scheme = parse_scheme(args.scheme)
    k, v = (CACHE_TYPES[t] for t in cache_types(scheme))
    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers, mp.use_extra_bufts = 0, False
    model = llama_cpp.llama_model_load_from_file(str(gguf_path("embedded")).encode(), mp)
    n_ctx = -(-max(len(ids) for ids, _ in backend.windows) // 256) * 256

    plain_times, evalkit_times = [], []
    evalkit_nll = float(ev.token_scores(lm, scheme).nll.mean())  # warms both up, untimed
    plain_nll = plain_run(llama_cpp, model, backend.windows, k, v, n_ctx, args.threads)
    rows = []

    def plain():
        t = time.perf_counter()
        plain_run(llama_cpp, model, backend.windows, k, v, n_ctx, args.threads)
        plain_times.append(time.perf_counter() - t)

    def evalkit():
        t = time.perf_counter()
        rows[:] = ev.evaluate(lm, scheme)
        evalkit_times.append(time.perf_counter() - t)

    for r in range(args.rounds):  # ABBA: whichever runs right after the other pays its fresh allocations
        for step in (plain, evalkit, evalkit, plain) if r % 2 == 0 else (evalkit, plain, plain, evalkit):
            step()
    plain_best, evalkit_best = min(plain_times), min(evalkit_times)
    n = sum(len(ids) - t0 for ids, t0 in backend.windows)
    print(f"{args.scheme}, {args.windows} windows of {args.window} ({n:,} scored tokens), {args.threads} threads")
    print(f"  plain llama-cpp-python: {plain_best:.3f} s (calls {', '.join(f'{x:.2f}' for x in plain_times)})")
    print(f"  evalkit:                {evalkit_best:.3f} s (calls {', '.join(f'{x:.2f}' for x in evalkit_times)})")
    print(f"  ratio evalkit / plain:  {evalkit_best / plain_best:.3f}  (target <= 1.05; {len(rows)} rows)")
    print(f"  mean NLL, plain vs evalkit: {plain_nll:.6f} vs {evalkit_nll:.6f}")
    llama_cpp.llama_model_free(model)
    backend.close()


if __name__ == "__main__":
    main()
