"""llama.cpp's own rounding floor: KL between runs that differ only in the attention path's rounding.

    python benchmarks/llamacpp_floor.py      # about 40 s, alone (llama.cpp's threads spin)

Against its f16 cache, llama.cpp gives about 0.004 nats per token of KL for every other cache type on the
embedded model, bf16 included. This script tells the two readings apart on 4 windows of 256 tokens of
the embedded corpus (flash attention on, 2 threads): if the floor were "the f16 path against the rest",
two non-f16 caches (bf16 against q8_0) would agree closely and the f16 cache against itself would give
0; if any change of rounding in attention is amplified through the forward (the Q4_1 weights' matmuls
re-quantize their activations to q8_1 at every layer), every pair gives about the floor, the f16 cache
decoded in batches of 32 (another CPU flash-attention path, the same cache bytes) included.
"""

import numpy as np
from scipy.special import log_softmax

from evalkit.data.corpus import load_corpus
from evalkit.engines.llamacpp.model import LlamaCppModel
from evalkit.models.loading import embedded_gguf

W, N = 256, 4
with LlamaCppModel.open(embedded_gguf("smollm2-135m"), n_threads=2) as model:
    ids = model.tokenize(load_corpus("embedded").text)
    windows = [ids[i * W : (i + 1) * W] for i in range(N)]

    def run(k, v, fa=True, n_batch=512):
        out = []
        with model.context(k, v, flash_attn=fa, n_ctx=512, n_batch=n_batch, n_threads=2) as ctx:
            for w in windows:
                out.append(log_softmax(ctx.logits(w).astype(np.float64), axis=-1))
        return np.concatenate(out)

    def kl(a, b):
        return float((np.exp(a) * (a - b)).sum(-1).mean())

    runs = {
        "f16/f16": run("f16", "f16"),
        "bf16/bf16": run("bf16", "bf16"),
        "q8_0/q8_0": run("q8_0", "q8_0"),
        "f16/q8_0": run("f16", "q8_0"),
        "f16/f16 n_batch=32": run("f16", "f16", n_batch=32),
    }
    for a, b in [
        ("f16/f16", "bf16/bf16"),
        ("f16/f16", "q8_0/q8_0"),
        ("bf16/bf16", "q8_0/q8_0"),
        ("bf16/bf16", "f16/q8_0"),
        ("f16/f16", "f16/f16 n_batch=32"),
        ("f16/f16 n_batch=32", "bf16/bf16"),
    ]:
        print(f"KL({a} || {b}) = {kl(runs[a], runs[b]):.5f}")
