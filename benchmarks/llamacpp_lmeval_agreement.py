"""lm-eval through llama.cpp against the emulation: how far apart their unquantized answers are.

    python benchmarks/llamacpp_lmeval_agreement.py      # about 3 min on a busy 2-core machine

The same lm-eval requests (evalkit_mmlu4, 8 items x 4 answer choices) through the emulation's unquantized
HFLM (the GGUF's dequantized weights in float32) and through llama.cpp in process (1 thread) with its f16
cache, then llama.cpp's own float noise (its bf16 cache against its f16 cache: bf16 quantizes nothing that
matters, so what it moves is rounding) and two quantized caches for scale. Prints the mean and largest
|difference| of the choices' log-likelihoods (nats) and how many answers agree.
"""

import numpy as np

from evalkit.engines.llamacpp.backend import LlamaCppBackend
from evalkit.evals.lmeval.adapter import make_hflm, resolve_tasks, run_lm_eval
from evalkit.models.handle import open_model
from evalkit.models.loading import load_model

tasks = resolve_tasks(["evalkit_mmlu4"])


def choices(model) -> dict[int, list[float]]:
    results = run_lm_eval(model, tasks, num_fewshot=None, limit=8, bootstrap_iters=0)
    return {s["doc_id"]: [float(r[0]) for r in s["filtered_resps"]] for s in results["samples"]["evalkit_mmlu4"]}


def compare(name: str, a: dict, b: dict) -> None:
    d = np.abs([np.subtract(a[k], b[k]) for k in a])
    same = sum(np.argmax(a[k]) == np.argmax(b[k]) for k in a)
    print(f"{name:32s} mean |d| {d.mean():.3f}  max |d| {d.max():.3f}  same answer {same}/{len(a)}")


lm = load_model("embedded", dtype="float32")
emulated = choices(make_hflm(lm.model, lm.tokenizer, 1))
handle = open_model("embedded")
backend = LlamaCppBackend(n_threads=1)
backend.prepare_lmeval(None, handle)
runs = {}
for scheme in (None, "llamacpp:bf16", "llamacpp:q8_0", "llamacpp:q4_0"):
    with backend.lmeval_model(None, handle, scheme) as model:
        runs[scheme] = choices(model)
backend.close()
compare("llama.cpp f16 vs emulation auto", runs[None], emulated)
for scheme in ("llamacpp:bf16", "llamacpp:q8_0", "llamacpp:q4_0"):
    compare(f"llama.cpp {scheme.split(':')[1]} vs f16", runs[scheme], runs[None])
