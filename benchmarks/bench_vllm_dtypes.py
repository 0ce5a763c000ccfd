"""The storage path's decode step under each ``vllm:<kv_cache_dtype>`` against FP8 per-tensor, side by side.

    python benchmarks/bench_vllm_dtypes.py [--context 2048] [--steps 16] [--rounds 3] [--threads N]
        [--schemes vllm:int8_per_token_head,...] [--no-mla] [--profile SCHEME] [--json FILE]

Target (issue 30, item 6): each new dtype's decode step within 1.3x the FP8 per-tensor step
(``fp8_e4m3/tensor/unit``, what ``vllm:fp8`` resolves to) at 2k context.

GQA arms, on the embedded model (float32 on CPU unless --device/--dtype say otherwise): one plain
transformers prefill of ``--context`` tokens of the embedded corpus gives every layer's K/V; each arm
writes those K/V through its own storage cache (``cache.update`` per layer: the store a prefill
makes, without the prefill's compute), then times ``--steps`` teacher-forced decode steps (the
corpus' next tokens, one forward of the model per step, as the decode eval runs). So every arm
attends the same 2k-token cache and only the storage work differs.

MLA arms (unless ``--no-mla``): the same on a tiny random DeepSeek-V3-shaped model (latent 512,
RoPE key 64, 2 layers) with random K/V of ``--context`` tokens: ``vllm:fp8_ds_mla`` and
``vllm:nvfp4_ds_mla`` against ``fp8_e4m3/tensor/unit``. Its step is tiny, so the store's share of it
is much larger than on a real model: read those ratios as an upper bound.

Store: the per-step storage work alone, one token's K and V written (``cache.update``: quantize,
pack, append) into every quantized layer of a storage cache holding the context, timed separately
(what the ratio's numerator adds over FP8's), and the torch calls one layer's write makes
(``calls``). Where K and V are stored alike per token (INT8/FP8/INT4 per token-head, NVFP4), the
cache writes the two in one quantize call (``evalkit.integration.stored.append_pair``).

Threads: torch's default unless ``--threads`` is given, as ``evalkit run`` and ``sweep`` leave it. On
torch 2.13 CPU, after an explicit ``torch.set_num_threads(2)`` on a loaded 2-core host, about one
``torch.trunc`` of a 192-value tensor in four stalled 12-24 ms (a scheduler tick; median 3 us, and no
stall without the call), and the INT8, INT4 and TurboQuant value stores call it once per layer and
step: ``--threads 2`` measures that (it was 27 % of a TurboQuant decode step's profile).

Rounds are interleaved (every arm once per round, order rotated); per arm the minimum over rounds of
its median step (wall time, and this process's CPU time, which a shared machine's other work does not
inflate), and the median over rounds of its wall-time ratio to the FP8 arm in the same round.
``--profile SCHEME`` prints torch.profiler's table of that arm's decode steps (top operators by self
CPU time). ``--json FILE`` writes every figure, the load average and the versions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from evalkit.integration.hf_compat import cache_inputs

REFERENCE = "fp8_e4m3/tensor/unit"  # vllm:fp8 / fp8_e4m3 as the vllm-cuda profile maps it
GQA = [
    "vllm:int8_per_token_head",
    "vllm:fp8_per_token_head",
    "vllm:int4_per_token_head",
    "vllm:turboquant_k8v4",
    "vllm:turboquant_4bit_nc",
    "vllm:turboquant_k3v4_nc",
    "vllm:turboquant_3bit_nc",
    "vllm:ultraquant_4bit",
    "vllm:nvfp4",
    "vllm:nvfp4_4over6",
]
MLA = ["vllm:fp8_ds_mla", "vllm:nvfp4_ds_mla"]
TARGET = 1.3


def mla_model(device, dtype):
    import transformers as tf

    config = tf.DeepseekV3Config(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        kv_lora_rank=512,
        q_lora_rank=128,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
        n_group=1,
        topk_group=1,
        max_position_embeddings=8192,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = tf.AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def prefill_kv(model, prompt):
    """Each layer's (K, V) after a plain prefill of ``prompt`` (what ``cache.update`` received)."""
    with torch.inference_mode():
        out = model(prompt, use_cache=True)
    return [(layer.keys.clone(), layer.values.clone()) for layer in out.past_key_values.layers]


def random_kv(model, batch, context, device, dtype):
    """Random (latent, RoPE key) per MLA layer, shaped as DeepSeek-V3's ``cache.update`` receives them."""
    cfg = model.config
    g = torch.Generator(device=device).manual_seed(0)
    shape = lambda d: (batch, 1, context, d)  # noqa: E731
    return [
        (
            torch.randn(shape(cfg.kv_lora_rank), generator=g, device=device, dtype=dtype),
            torch.randn(shape(cfg.qk_rope_head_dim), generator=g, device=device, dtype=dtype),
        )
        for _ in range(cfg.num_hidden_layers)
    ]


def decode_arm(model, scheme, kv, tokens, context, sync, profile=False):
    """Median step time (s) of teacher-forced decode steps on a cache filled with ``kv`` under ``scheme``."""
    from evalkit import quantized_kv

    steps = tokens.shape[1]
    times, cpu = [], []
    with torch.inference_mode(), quantized_kv(model, scheme) as session:
        cache = session.new_cache(None)
        for i, (k, v) in enumerate(kv):
            cache.update(k, v, i)
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profile else None
        if prof is not None:
            prof.__enter__()
        for j in range(steps):
            pos = torch.full((tokens.shape[0], 1), context + j, dtype=torch.long, device=tokens.device)
            sync()
            t, c = time.perf_counter(), time.process_time()
            model(tokens[:, j : j + 1], position_ids=pos, **cache_inputs(model, cache))
            sync()
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        if prof is not None:
            prof.__exit__(None, None, None)
            print(f"\nprofile of {scheme}: {steps} decode steps at {context} context")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
    skip = 1 if steps > 2 else 0  # the first step warms the arm's code paths
    return statistics.median(times[skip:]), statistics.median(cpu[skip:])


class CallCounter(TorchFunctionMode):
    """Counts the torch calls (functions and tensor methods) made while active."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def store_arm(model, scheme, kv, reps, sync):
    """Seconds per decode step of the store alone: one token's K and V written into every layer of a
    storage cache that holds the context (``cache.update``: quantize, pack and append, as a decode
    step's attention calls it), and the torch calls one quantized layer's write makes."""
    from evalkit import quantized_kv

    with torch.inference_mode(), quantized_kv(model, scheme) as session:
        cache = session.new_cache(None)
        for i, (k, v) in enumerate(kv):
            cache.update(k[:, :, : -reps - 2], v[:, :, : -reps - 2], i)
        layers = [layer for layer in cache.storage_layers() if layer.active]
        tok = [(kv[layer.layer_idx][0][:, :, -1:], kv[layer.layer_idx][1][:, :, -1:]) for layer in layers]
        counter = CallCounter()
        with counter:  # deterministic: the torch calls one layer's write makes (dispatch is its cost)
            cache.update(*tok[0], layers[0].layer_idx)
        best = float("inf")
        for _ in range(reps):
            sync()
            t = time.perf_counter()
            for layer, (k, v) in zip(layers, tok):
                cache.update(k, v, layer.layer_idx)
            sync()
            best = min(best, time.perf_counter() - t)
    return best, len(layers), counter.calls


def bench(title, model, kv, tokens, context, schemes, rounds, sync, profile):
    arms = [REFERENCE, *schemes]
    for s in arms:  # warm-up: one short pass per arm (first calls build codebooks, sign vectors, kernels)
        decode_arm(model, s, kv, tokens[:, :2], context, sync)
    per_round: dict[str, list[float]] = {s: [] for s in arms}
    cpu_round: dict[str, list[float]] = {s: [] for s in arms}
    for r in range(rounds):
        order = arms[r % len(arms) :] + arms[: r % len(arms)]
        for s in order:
            wall, cpu = decode_arm(model, s, kv, tokens, context, sync)
            per_round[s].append(wall)
            cpu_round[s].append(cpu)
    rows = []
    for s in arms:
        ratios = [a / b for a, b in zip(per_round[s], per_round[REFERENCE], strict=True)]
        store, layers, calls = store_arm(model, s, kv, 5, sync)
        rows.append(
            {
                "scheme": s,
                "step_ms": min(per_round[s]) * 1e3,
                "ratio_of_minima": min(per_round[s]) / min(per_round[REFERENCE]),
                "ratio_median": statistics.median(ratios),
                "cpu_step_ms": min(cpu_round[s]) * 1e3,
                "cpu_ratio_of_minima": min(cpu_round[s]) / min(cpu_round[REFERENCE]),
                "store_ms": store * 1e3,
                "quantized_layers": layers,
                "store_calls_per_layer": calls,
                "rounds_ms": [t * 1e3 for t in per_round[s]],
                "rounds_cpu_ms": [t * 1e3 for t in cpu_round[s]],
            }
        )
    print(f"\n{title}")
    print(
        f"{'scheme':28s} {'ms/step':>8s} {'x fp8 (min)':>11s} {'x fp8 (med)':>11s} {'cpu ms':>7s} {'x fp8 cpu':>9s} "
        f"{'store ms':>9s} {'calls':>6s} {'layers':>6s}  target <= {TARGET} (wall, min)"
    )
    for row in rows:
        worst = row["ratio_of_minima"]
        mark = "" if row["scheme"] == REFERENCE else ("ok" if worst <= TARGET else f"MISS by {worst / TARGET - 1:.0%}")
        print(
            f"{row['scheme']:28s} {row['step_ms']:8.1f} {row['ratio_of_minima']:11.3f} {row['ratio_median']:11.3f} "
            f"{row['cpu_step_ms']:7.1f} {row['cpu_ratio_of_minima']:9.3f} {row['store_ms']:9.2f} "
            f"{row['store_calls_per_layer']:6d} {row['quantized_layers']:6d}  {mark}",
            flush=True,
        )
    if profile and profile in arms:
        decode_arm(model, profile, kv, tokens, context, sync, profile=True)
    return rows


def main() -> None:
    from evalkit.runtime import numerics

    numerics.configure()  # as the command line: batch-invariant BLAS, before the first matrix product
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=16, help="timed decode steps per arm and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own, not set)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--schemes", default=",".join(GQA), help="GQA arms (the FP8 reference is always run)")
    ap.add_argument("--no-mla", action="store_true", help="skip the tiny MLA model's arms")
    ap.add_argument("--profile", default=None, help="print torch.profiler's table for this arm's decode steps")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from evalkit.data.corpus import load_corpus, tokenize_corpus
    from evalkit.models.loading import load_model

    load_start = os.getloadavg()
    lm = load_model("embedded", device=args.device, dtype=args.dtype)
    model = lm.model
    ids = tokenize_corpus(load_corpus("embedded"), lm.tokenizer, None)
    prompt = ids[: args.context][None].to(lm.device)
    tokens = ids[args.context : args.context + args.steps][None].to(lm.device)
    sync = torch.cuda.synchronize if lm.device.type == "cuda" else (lambda: None)
    dtype = next(model.parameters()).dtype
    print(
        f"model {lm.name} {dtype} on {lm.device}, threads {torch.get_num_threads()}"
        f"{' (set)' if args.threads else ' (torch default)'}, context {args.context}, "
        f"{args.steps} steps x {args.rounds} rounds, load average {load_start[0]:.1f}",
        flush=True,
    )
    kv = prefill_kv(model, prompt)
    schemes = [s for s in args.schemes.split(",") if s]
    result = {
        "gqa": bench(
            f"GQA: decode step at {args.context} context, embedded model ({lm.name})",
            model,
            kv,
            tokens,
            args.context,
            schemes,
            args.rounds,
            sync,
            args.profile,
        )
    }
    del kv
    if not args.no_mla:
        mla = mla_model(lm.device, dtype)
        mkv = random_kv(mla, 1, args.context, lm.device, dtype)
        g = torch.Generator().manual_seed(1)
        mtok = torch.randint(10, mla.config.vocab_size, (1, args.steps), generator=g).to(lm.device)
        result["mla"] = bench(
            f"MLA: decode step at {args.context} context, tiny DeepSeek-V3-shaped model (2 layers, latent 512 + RoPE 64)",
            mla,
            mkv,
            mtok,
            args.context,
            MLA,
            args.rounds,
            sync,
            args.profile,
        )
    load_end = os.getloadavg()
    print(f"\nload average {load_start[0]:.1f} at the start, {load_end[0]:.1f} at the end")
    if args.json:
        import transformers

        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "script": "benchmarks/bench_vllm_dtypes.py",
                    "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                    "reference": REFERENCE,
                    "threads": torch.get_num_threads(),
                    "target": TARGET,
                    "load_average": {"start": load_start, "end": load_end},
                    "versions": {
                        "python": platform.python_version(),
                        "torch": torch.__version__,
                        "transformers": transformers.__version__,
                    },
                    **result,
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
