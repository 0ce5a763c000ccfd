"""What FA3's FP8 tensor-core accumulation (``+attn=fa3:acc1`` / ``:acc2``) does at long context.

Two measurements, both against ``+attn=fa3`` (the same FP8 Q and P, products summed exactly):

* ``attention``: one decode query over N random keys (head_dim 64, one head), with a needle key along
  the query at the middle holding a third of the attention at every length: the output's norm relative to exact accumulation and its relative
  error, for N from 1k to 128k. Seconds on a CPU; this is the length the published needle drop is at.
* ``model``: the embedded model (SmolLM2-135M, 8k context) on passkey prompts at the given lengths,
  teacher-forced on the answer: the answer's log-probability, whether every answer token is the argmax,
  and the mean KL of the answer positions' next-token distributions from ``+attn=fa3``.

    python benchmarks/fa3_accumulation.py attention
    python benchmarks/fa3_accumulation.py model --lengths 1024,4096 --samples 2
"""

from __future__ import annotations

import argparse
import math
import random
import time

import torch

from evalkit.integration.fa3 import ONE_LEVEL, TWO_LEVEL, fa3_attention

STORE = "fp8_e4m3/tensor/dynamic"
MODES = {"fa3": "+attn=fa3", "acc1": "+attn=fa3:acc1", "acc2": "+attn=fa3:acc2"}


def attention(lengths: list[int], seeds: int) -> None:
    d = 64
    print("keys     acc1 |o|/|o_exact|  acc1 rel. error  acc2 |o|/|o_exact|  acc2 rel. error")
    for n in lengths:
        ratio = {1: [], 2: []}
        error = {1: [], 2: []}
        for seed in range(seeds):
            g = torch.Generator().manual_seed(seed)
            q = torch.randn(1, 1, 1, d, generator=g)
            k = torch.randn(1, 1, n, d, generator=g)
            v = torch.randn(1, 1, n, d, generator=g)
            # the needle, a key along the query whose weight is half the haystack's total at every length
            score = math.log(n) + 0.5 - math.log(2.0)  # the haystack's scores are N(0, 1): E[exp] = e**0.5
            k[0, 0, n // 2] = q[0, 0, 0] * score / (float(q.norm()) ** 2 * d**-0.5)
            exact = fa3_attention(torch.nn.Module(), q, k, v, None, scaling=d**-0.5)[0]
            for levels in (ONE_LEVEL, TWO_LEVEL):
                out = fa3_attention(torch.nn.Module(), q, k, v, None, scaling=d**-0.5, accumulation=levels)[0]
                ratio[levels].append(float(out.norm() / exact.norm()))
                error[levels].append(float((out - exact).norm() / exact.norm()))
        mean = {key: sum(vals) / len(vals) for key, vals in (*ratio.items(), *((-k, v) for k, v in error.items()))}
        print(f"{n:>7}  {mean[1]:>18.4f}  {mean[-1]:>15.4f}  {mean[2]:>18.4f}  {mean[-2]:>15.4f}", flush=True)


FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def passkey_prompt(tokenizer, length: int, key: str, depth: float) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids): filler of about ``length`` tokens, the key at ``depth``, then the question."""
    head = "There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it.\n"
    needle = f"The pass key is {key}. Remember it. {key} is the pass key. "
    tail = "What is the pass key? The pass key is"
    fixed = len(tokenizer(head + needle + tail).input_ids)
    per = len(tokenizer(FILLER).input_ids)
    reps = max(1, (length - fixed) // per)
    before = int(reps * depth)
    text = head + FILLER * before + needle + FILLER * (reps - before) + tail
    return tokenizer(text).input_ids, tokenizer(" " + key).input_ids


def model(lengths: list[int], samples: int) -> None:
    from evalkit import quantized_kv
    from evalkit.models.loading import load_model

    lm = load_model("embedded")
    rng = random.Random(0)
    print("length  sample  mode  answer logprob  argmax  KL from fa3 (nats)  seconds")
    for length in lengths:
        for s in range(samples):
            key = str(rng.randint(10000, 99999))
            prompt, answer = passkey_prompt(lm.tokenizer, length, key, depth=(s + 1) / (samples + 1))
            ids = torch.tensor([prompt + answer])
            pos = torch.arange(len(prompt) - 1, len(prompt) + len(answer) - 1)
            target = torch.tensor(answer)
            ref = None
            for name, option in MODES.items():
                start = time.time()
                with torch.no_grad(), quantized_kv(lm.model, STORE + option):
                    logits = lm.model(ids).logits[0, pos].double()
                logp = torch.log_softmax(logits, -1)
                answer_lp = float(logp[torch.arange(len(answer)), target].sum())
                hit = bool((logits.argmax(-1) == target).all())
                kl = 0.0 if ref is None else float((ref.exp() * (ref - logp)).sum(-1).mean())
                ref = logp if ref is None else ref
                print(
                    f"{ids.shape[1]:>6}  {s:>6}  {name:>4}  {answer_lp:>14.4f}  {hit!s:>6}  {kl:>18.6f}  "
                    f"{time.time() - start:>7.0f}",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("attention", "model"))
    parser.add_argument("--lengths", default=None, help="comma-separated key counts / prompt lengths")
    parser.add_argument("--samples", type=int, default=2)
    args = parser.parse_args()
    if args.what == "attention":
        lengths = [int(x) for x in (args.lengths or "1024,4096,8192,32768,131072").split(",")]
        attention(lengths, args.samples)
    else:
        model([int(x) for x in (args.lengths or "1024,4096").split(",")], args.samples)


if __name__ == "__main__":
    main()
