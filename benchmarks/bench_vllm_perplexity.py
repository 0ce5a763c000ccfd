"""evalkit's ``--engine vllm`` perplexity against plain vLLM, and the emulation's speed against vLLM-CPU's.

    /opt/vllm/bin/python benchmarks/bench_vllm_perplexity.py [--window 512] [--windows 4] [--rounds 3]
        [--scheme fp8_e4m3/tensor/unit] [--with-start]

Same prompts for everything: ``--windows`` disjoint windows of ``--window`` tokens of the embedded
corpus, as ``evalkit run --eval perplexity`` cuts them.

1. Overhead (the ratio, target <= 1.05). On one started engine for the scheme (after a warm-up
   call: vLLM's first call on a new engine pays one-off costs), interleaved round by round, best
   round each:
   - plain: ``LLM.generate(prompts, SamplingParams(max_tokens=1, prompt_logprobs=20))`` and the mean
     NLL read from its ``{token_id: Logprob}`` dicts, what a user would write;
   - lean: the one generate call evalkit makes (``flat_logprobs=True, detokenize=False``), nothing else;
   - evalkit: what ``PerplexityEval.evaluate`` does with a started engine (``VllmBackend.collect``:
     flat prompt log-probs into arrays; ``scores``: top-1 agreement and the top-k KL bound against the
     engine's baseline; the rows with their bootstrap intervals).
   The ratios are evalkit / plain (the target) and evalkit / lean (evalkit's own processing).
   ``--with-start`` also times both with the engine start included (``evaluate`` starts its own
   engine; plain: ``LLM(...)`` then ``generate``).
2. Throughput: scored tokens per second of the emulation (``fp8_e4m3/tensor/unit+rounding=rtz``
   through evalkit's storage cache, before any engine starts: in-process vLLM sets torch to one
   thread) and of vLLM-CPU (the plain call above), wall time.
"""

from __future__ import annotations

import argparse
import os
import time


def best_of(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scheme", default="fp8_e4m3/tensor/unit")
    ap.add_argument("--with-start", action="store_true", help="also time both with the engine start included")
    args = ap.parse_args()

    from evalkit.runtime import numerics

    numerics.configure()
    import torch

    from evalkit.engines.vllm.backend import VllmBackend
    from evalkit.engines.vllm.runner import DEFAULT_TOP_K, engine_config
    from evalkit.evals.perplexity.evaluation import PerplexityEval
    from evalkit.models.loading import cache_root, load_model

    lm = load_model("embedded")
    params = dict(corpus="embedded", window=args.window, stride=args.window, max_windows=args.windows)
    work = cache_root() / "work"
    config = engine_config(args.scheme)

    # 2a. the emulation, before any engine exists in this process
    emu = PerplexityEval(params)
    emu.prepare(lm, work)
    n_scored = int(emu.offsets[-1])
    threads = torch.get_num_threads()
    emu.token_scores(lm, config.emulation)  # warm-up
    t_emu = best_of(lambda: emu.token_scores(lm, config.emulation), args.rounds)

    # the engine's baseline (kv_cache_dtype auto), then one engine for the scheme
    eng = PerplexityEval(params, backend=VllmBackend())
    t = time.perf_counter()
    eng.prepare(lm, work)
    t_base = time.perf_counter() - t
    backend = eng.backend
    prompts = backend.prompts
    n_prompt = sum(len(p) for p in prompts)

    from vllm import SamplingParams

    plain_params = SamplingParams(max_tokens=1, prompt_logprobs=DEFAULT_TOP_K)

    lean_params = SamplingParams(max_tokens=1, prompt_logprobs=DEFAULT_TOP_K, flat_logprobs=True, detokenize=False)

    def plain(llm):
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], plain_params, use_tqdm=False)
        nll = [-d[tok].logprob for o, p in zip(outs, prompts) for d, tok in zip(o.prompt_logprobs[1:], p[1:])]
        return sum(nll) / len(nll)

    def lean(llm):  # the call evalkit makes, and nothing else
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], lean_params, use_tqdm=False)
        return sum(o.prompt_logprobs.logprobs[s] for o in outs for s in o.prompt_logprobs.start_indices[1:])

    with backend.start(config) as runner:
        info = runner.info()
        plain(runner.llm)  # warm-up: the first call on a new engine pays one-off costs
        engine_threads = torch.get_num_threads()
        backend.collect(runner)
        t_plain, t_lean, t_evalkit = [], [], []
        for _ in range(args.rounds):
            t = time.perf_counter()
            plain(runner.llm)
            t_plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            lean(runner.llm)
            t_lean.append(time.perf_counter() - t)
            t = time.perf_counter()
            scores = backend.scores(backend.collect(runner), info)
            eng._rows(scores)
            t_evalkit.append(time.perf_counter() - t)
    plain_best, lean_best, evalkit_best = min(t_plain), min(t_lean), min(t_evalkit)

    print(
        f"vLLM {info['engine_version']} ({info['engine_package']}, {info['attention_backend']}), "
        f"kv_cache_dtype {config.kv_cache_dtype}, {args.windows} x {args.window} tokens "
        f"({n_prompt} prompt tokens, {n_scored} scored), top-{DEFAULT_TOP_K}, best of {args.rounds}; "
        f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        f"overhead: evalkit --engine vllm {evalkit_best:.2f} s vs plain LLM.generate {plain_best:.2f} s: "
        f"ratio {evalkit_best / plain_best:.3f} (rounds: evalkit {', '.join(f'{x:.2f}' for x in t_evalkit)}; "
        f"plain {', '.join(f'{x:.2f}' for x in t_plain)})"
    )
    print(
        f"          vs the same generate call evalkit makes (flat log-probs, no detokenizing) {lean_best:.2f} s: "
        f"ratio {evalkit_best / lean_best:.3f} (rounds: {', '.join(f'{x:.2f}' for x in t_lean)})"
    )
    print(f"engine baseline (kv auto: start + scoring, once per eval): {t_base:.1f} s")
    print(
        f"throughput: emulation ({config.emulation}, {threads} torch threads) {n_scored / t_emu:.0f} tokens/s; "
        f"vLLM-CPU ({engine_threads} torch thread(s) in-process) {n_prompt / plain_best:.0f} prompt tokens/s "
        f"({n_scored / plain_best:.0f} scored tokens/s): emulation / vLLM {plain_best / t_emu:.2f}x"
    )

    if args.with_start:
        import vllm

        t = time.perf_counter()
        eng.evaluate(lm, args.scheme)
        t_eval = time.perf_counter() - t
        t = time.perf_counter()
        llm = vllm.LLM(
            model=str(lm.path),
            dtype=backend.dtype,
            kv_cache_dtype=config.kv_cache_dtype,
            enforce_eager=True,
            max_model_len=backend.max_model_len,
            kv_cache_memory_bytes=backend.kv_cache_bytes,
            enable_prefix_caching=False,
        )
        plain(llm)
        t_llm = time.perf_counter() - t
        llm.llm_engine.engine_core.shutdown()
        print(
            f"with the engine start: evalkit evaluate {t_eval:.1f} s vs plain LLM() + generate {t_llm:.1f} s: "
            f"ratio {t_eval / t_llm:.3f} (one round each, not interleaved)"
        )


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    main()
