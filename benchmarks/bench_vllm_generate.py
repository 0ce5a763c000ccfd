"""An engine generation run through evalkit against vLLM's own ``LLM.generate`` on the same prompts (target <= 1.10x).

    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 python \\
        benchmarks/bench_vllm_generate.py [--samples 4] [--max-gen-toks 16] [--rounds 2] [--eager|--compiled]

One engine (lm-eval's ``VLLM`` model through :func:`evalkit.engines.vllm.lmeval.lmeval_vllm`, the path
``run --engine vllm --eval generation`` takes) is started once for the embedded model under
``kv_cache_dtype auto``; its start is in neither time, and the evaluation's own baseline pass is skipped
(the pass timed is one scheme's). Then, interleaved round by round:

- evalkit: the generation evaluation's pass over its shipped task ``evalkit_arith`` (8 items x
  ``--samples`` seeded samples, temperature 0.6, chat template, at most ``--max-gen-toks`` tokens):
  :func:`evalkit.evals.generation.serving.run_samples` (lm-eval's ``generate_until`` through
  ``LLM.generate``, evalkit's item records and scores), then the per-task rows against the same pass
  taken as baseline (:func:`evalkit.evals.generation.rows.task_rows`);
- plain: ``LLM.generate`` on the same engine with the very prompts and ``SamplingParams`` that evalkit's
  first pass handed it (recorded there), call for call, texts decoded, nothing else.

Printed: the ratio evalkit / plain (best rounds and medians), every round's times, the prompts and
generated tokens per pass, and the machine's load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=4, help="seeded samples per item (8 items each)")
    ap.add_argument("--max-gen-toks", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument(
        "--eager", dest="eager", action="store_true", default=None, help="enforce_eager (the CPU default)"
    )
    mode.add_argument("--compiled", dest="eager", action="store_false", help="vLLM's default: dynamo + inductor")
    args = ap.parse_args()

    from evalkit.engines.vllm.backend import VllmBackend
    from evalkit.engines.vllm.config import EngineConfig
    from evalkit.engines.vllm.lmeval import lmeval_vllm
    from evalkit.evals.backend import use_backend
    from evalkit.evals.generation.evaluation import GenerationEval
    from evalkit.evals.generation.rows import task_rows
    from evalkit.evals.generation.serving import run_samples
    from evalkit.models.loading import cache_root, load_model

    lm = load_model("embedded")
    params = dict(
        tasks="evalkit_arith", samples=args.samples, temperature=0.6, max_gen_toks=args.max_gen_toks, batch_size=64
    )
    options = {} if args.eager is None else {"enforce_eager": args.eager}
    ev = use_backend(GenerationEval(params), VllmBackend(engine_args=options))
    ev._run = lambda lm, scheme: {"tasks": {}, "task_info": {}, "traces": []}  # no baseline pass: not timed here
    ev.prepare(lm, cache_root() / "work")
    del ev._run
    b, p = ev.backend, ev.params
    t0 = time.perf_counter()
    with lmeval_vllm(
        b.model_dir, EngineConfig("auto"), dtype=b.dtype, batch_size=p["batch_size"], kv_cache_bytes=b.kv_cache_bytes,
        seed=b.seed, engine_args=b.engine_args,
    ) as model:  # fmt: skip
        start = time.perf_counter() - t0
        llm = model.model
        shown = llm.generate  # evalkit's wrapper (vLLM's bar on the terminal), as a run has it
        calls = []

        def recording(prompts, sampling_params=None, *a, **kw):
            calls.append((prompts, sampling_params))
            return shown(prompts, sampling_params, *a, **kw)

        def evalkit():
            items, info = run_samples(model, ev._tasks, p, ev.gen_kwargs, lm.tokenizer)
            return task_rows(items, items, lm.tokenizer, info)

        llm.generate = recording
        evalkit()  # warm-up, and the prompts and sampling parameters evalkit hands the engine
        llm.generate = shown
        tokenizer = lm.tokenizer

        def plain():
            texts = []
            for prompts, sp in calls:
                outs = llm.generate(prompts, sp, use_tqdm=False)
                texts += [tokenizer.decode(o.outputs[0].token_ids, skip_special_tokens=True) for o in outs]
            return texts

        n_prompts = sum(len(c[0]) for c in calls)
        n_tokens = sum(len(o.outputs[0].token_ids) for c in calls for o in llm.generate(c[0], c[1], use_tqdm=False))
        te, tp = [], []
        for _ in range(args.rounds):
            t = time.perf_counter()
            plain()
            tp.append(time.perf_counter() - t)
            t = time.perf_counter()
            evalkit()
            te.append(time.perf_counter() - t)
    med = statistics.median(te) / statistics.median(tp)
    print(
        f"engine generation, embedded model, kv_cache_dtype auto, {model_mode(options)}: {len(calls)} LLM.generate "
        f"calls, {n_prompts} prompts, {n_tokens} generated tokens per pass; engine start {start:.1f} s (not timed)"
    )
    print(
        f"evalkit {min(te):.2f} s vs plain LLM.generate {min(tp):.2f} s: ratio {min(te) / min(tp):.3f} "
        f"(medians: {med:.3f}; rounds: evalkit {', '.join(f'{x:.2f}' for x in te)}; "
        f"plain {', '.join(f'{x:.2f}' for x in tp)}); load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
        flush=True,
    )


def model_mode(options: dict) -> str:
    eager = options.get("enforce_eager", True)  # vllm-cpu's default in evalkit: eager
    return "enforce_eager" if eager else "compiled (dynamo + inductor)"


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("EVALKIT_PROGRESS", "0")
    main()
