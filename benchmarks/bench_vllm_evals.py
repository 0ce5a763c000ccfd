"""evalkit's overhead over plain vLLM calls, per evaluation run through the engine (``--engine vllm``).

    VLLM_ENABLE_V1_MULTIPROCESSING=0 /opt/vllm/bin/python benchmarks/bench_vllm_evals.py [--rounds 3]
        [--scheme fp8_e4m3/tensor/unit] [--evals decode,retrieval,lmeval]

For each eval, one engine is started for the scheme (the start is the same in both and not timed;
a warm-up call first: vLLM's first call on a new engine pays one-off costs), then, interleaved round
by round, best round each:

- decode (embedded corpus, 4 sequences, P = 128, T = 64): plain = ``LLM.generate`` greedy (T tokens,
  EOS ignored) then ``LLM.generate(prompt_logprobs=20)`` over the P + T rows, NLL read from vLLM's
  ``{token_id: Logprob}`` dicts; evalkit = :func:`evalkit.engines.vllm.decode.decode_run` and
  ``decode_positions`` against the engine baseline, then the eval's rows (bootstrap intervals,
  first divergence);
- retrieval (passkey at 512 tokens, 3 depths x 2 samples): plain = ``LLM.generate`` greedy with EOS
  as the stop token and the texts decoded; evalkit = ``generate_texts``, scoring and the rows;
- lmeval (evalkit_mmlu4, 16 items): plain = ``lm_eval.simple_evaluate`` on lm-eval's ``VLLM`` model;
  evalkit = its lm-eval call (:func:`evalkit.evals.lmeval.adapter.run_lm_eval`) on the same model,
  the items, metric rows and flip rates against the baseline.

Printed: the ratio evalkit / plain per eval (target <= 1.05), of the best rounds and of the medians,
with every round's times, and the load.
"""

from __future__ import annotations

import argparse
import os
import time


def interleaved(plain, evalkit, rounds: int) -> tuple[list[float], list[float]]:
    plain()  # warm-up
    tp, te = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        plain()
        tp.append(time.perf_counter() - t)
        t = time.perf_counter()
        evalkit()
        te.append(time.perf_counter() - t)
    return tp, te


def report(name: str, tp: list[float], te: list[float]) -> None:
    import statistics

    med = statistics.median(te) / statistics.median(tp)  # on a loaded machine the best round can be an outlier
    print(
        f"{name}: evalkit {min(te):.2f} s vs plain {min(tp):.2f} s: ratio {min(te) / min(tp):.3f} (medians: {med:.3f}) "
        f"(rounds: evalkit {', '.join(f'{x:.2f}' for x in te)}; plain {', '.join(f'{x:.2f}' for x in tp)})",
        flush=True,
    )


def bench_decode(lm, work, scheme, rounds):
    from vllm import SamplingParams

    from evalkit.engines.vllm.backend import VllmBackend
    from evalkit.engines.vllm.decode import decode_positions, decode_run
    from evalkit.engines.vllm.runner import DEFAULT_TOP_K, engine_config
    from evalkit.evals.backend import use_backend
    from evalkit.evals.decode.evaluation import DecodeEval

    ev = use_backend(
        DecodeEval(dict(corpus="embedded", prefill=128, decode=64, sequences=4, bootstrap_samples=2000)), VllmBackend()
    )
    ev.prepare(lm, work)
    b, p = ev.backend, ev.p
    n = p.sequences
    prompts = ev.inputs[:n, : p.prefill].tolist()
    greedy = SamplingParams(max_tokens=p.decode, temperature=0.0, ignore_eos=True)
    scored = SamplingParams(max_tokens=1, prompt_logprobs=DEFAULT_TOP_K)
    with b.start(engine_config(scheme), b.decode_len) as runner:

        def plain():
            outs = runner.llm.generate([{"prompt_token_ids": q} for q in prompts], greedy, use_tqdm=False)
            rows = ev.inputs.tolist()
            for i, o in enumerate(outs):
                rows[n + i][p.prefill :] = list(o.outputs[0].token_ids)
            outs = runner.llm.generate([{"prompt_token_ids": r} for r in rows], scored, use_tqdm=False)
            return [
                [-d[t].logprob for d, t in zip(o.prompt_logprobs[p.prefill :], r[p.prefill :])]
                for o, r in zip(outs, rows)
            ]

        def evalkit():
            run = decode_run(runner, ev.inputs, p.prefill, p.decode, b.decode_base.generated)
            return ev.rows(decode_positions(b.decode_base, run, (2 * n, p.decode), {}))

        report("decode", *interleaved(plain, evalkit, rounds))


def bench_retrieval(lm, work, scheme, rounds):
    from vllm import SamplingParams

    from evalkit.engines.vllm.backend import VllmBackend
    from evalkit.engines.vllm.decode import generate_texts
    from evalkit.engines.vllm.runner import engine_config
    from evalkit.evals.backend import use_backend
    from evalkit.evals.retrieval import grid as G
    from evalkit.evals.retrieval.evaluation import RetrievalEval

    ev = use_backend(
        RetrievalEval(dict(tasks="passkey", lengths="512", depths="0,50,100", samples=2, batch_size=6)), VllmBackend()
    )
    ev.prepare(lm, work)
    base = ev.baseline(lm)
    order = G.batches(ev.samples, ev.params["batch_size"])
    work_items = [([list(ev.samples[i].ids) for i in o], max(ev.samples[i].max_new_tokens for i in o)) for o in order]
    tok = lm.tokenizer
    longest = max(len(q) + m for qs, m in work_items for q in qs) + 1
    with ev.backend.start(engine_config(scheme), longest) as runner:

        def plain():
            texts = []
            for qs, m in work_items:
                params = SamplingParams(max_tokens=m, temperature=0.0, stop_token_ids=[tok.eos_token_id])
                outs = runner.llm.generate([{"prompt_token_ids": q} for q in qs], params, use_tqdm=False)
                texts.append([tok.decode(o.outputs[0].token_ids, skip_special_tokens=True) for o in outs])
            return texts

        def evalkit():
            texts = generate_texts(runner, tok, work_items)
            gens = [""] * len(ev.samples)
            for o, batch in zip(order, texts):
                for i, t in zip(o, batch):
                    gens[i] = t
            return ev.rows(ev.frame(gens, base))

        report("retrieval", *interleaved(plain, evalkit, rounds))


def bench_lmeval(lm, work, scheme, rounds):
    import lm_eval

    from evalkit.engines.vllm.backend import VllmBackend
    from evalkit.engines.vllm.lmeval import lmeval_vllm
    from evalkit.engines.vllm.runner import engine_config
    from evalkit.evals.backend import use_backend
    from evalkit.evals.lmeval.adapter import run_lm_eval
    from evalkit.evals.lmeval.evaluation import LmEvalEval, flip_rows, metric_rows
    from evalkit.evals.lmeval.items import items_from_results

    ev = use_backend(LmEvalEval(dict(tasks="evalkit_mmlu4", limit=16, batch_size=16)), VllmBackend())
    ev.prepare(lm, work)
    b, p = ev.backend, ev.params
    with lmeval_vllm(
        b.model_dir,
        engine_config(scheme),
        dtype=b.dtype,
        batch_size=p["batch_size"],
        kv_cache_bytes=b.kv_cache_bytes,
        seed=b.seed,
    ) as model:

        def plain():
            return lm_eval.simple_evaluate(
                model=model,
                tasks=list(ev._tasks.names),
                limit=p["limit"],
                task_manager=ev._tasks.manager,
                log_samples=True,
                use_cache=None,
                cache_requests=False,
                verbosity="ERROR",
            )

        def evalkit():
            results = run_lm_eval(
                model, ev._tasks, num_fewshot=p["num_fewshot"], limit=p["limit"], bootstrap_iters=p["bootstrap_iters"]
            )
            items = items_from_results(results)
            params = {**p, "batch_size": model.batch_size}
            return metric_rows(results, params) + flip_rows(results, items, ev.baseline_items, params)

        report("lmeval", *interleaved(plain, evalkit, rounds))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scheme", default="fp8_e4m3/tensor/unit")
    ap.add_argument("--evals", default="decode,retrieval,lmeval")
    args = ap.parse_args()

    from evalkit.models.loading import cache_root, load_model

    lm = load_model("embedded")
    work = cache_root() / "work"
    print(
        f"embedded model, {args.scheme}, best of {args.rounds}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
        flush=True,
    )
    for name in args.evals.split(","):
        {"decode": bench_decode, "retrieval": bench_retrieval, "lmeval": bench_lmeval}[name](
            lm, work, args.scheme, args.rounds
        )
    print(f"load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("EVALKIT_PROGRESS", "0")
    main()
