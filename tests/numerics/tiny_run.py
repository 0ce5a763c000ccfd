"""Perplexity and decode end to end on a tiny model whose weights are exact values.

The model is the tests' tiny llama (:func:`tests.tiny_models.tiny_config`) with its trained byte-level
tokenizer, but every weight matrix is set from :func:`tests.numerics.exact.exact_normal` (norm
weights keep their ones), so the weights are the same bits on every platform, not whatever torch's
initialisation draws there. The corpus is a slice of the frozen embedded text.

Float64, and why. What still differs between processors is the summation order of reductions (matrix
products, softmax, norms): in float32 the K/V reaching the quantizer then differ in their last bits,
codes flip near rounding boundaries, and the flips propagate (evalkit.runtime.numerics). Measured
here by running this file's metrics under ``ATEN_CPU_CAPABILITY=default``, ``avx2`` and ``avx512``:
in float32 the NVFP4 decode ``nll_delta`` moved by 31 % between the first and the last, and most
quantized metrics by 1e-5 to 1e-3 relative; with the model in float64 the K/V agree to ~1e-16, no
code flips, and what remains is evalkit's float32 scoring (log-softmax, the KL estimate's
differences of large sums): at most 9e-8 nats on KL and NLL changes, 2e-5 on a perplexity of 1073,
1e-5 relative on p-values. The pins therefore hold each metric to :data:`TOLERANCE` of its own
scale (:func:`scale`) plus its own value: 1e-6 of a perplexity for perplexities and their changes,
1e-6 nats (or of a share, a count) for the rest, 1e-5 for p-values.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from tests.numerics.exact import exact_normal

DTYPE = torch.float64  # see the module docstring
SCHEMES = ("auto", "bf16", "fp8_e4m3/tensor/dynamic", "int4_asym/group16/dynamic", "nvfp4")
PERPLEXITY = dict(window=64, max_windows=4, batch_size=2, bootstrap_samples=100)
DECODE = dict(prefill=16, decode=16, sequences=6, buckets=2, batch_size=12, bootstrap_samples=100)
WEIGHT_SCALE = 0.25  # exact_normal's spread is 0.58 x this: sharp next-token distributions, some greedy flips
CORPUS_CHARS = 20_000
TOLERANCE = 1e-6  # of each metric's scale (see the module docstring), plus 1e-6 of its value


def build_model(folder: Path) -> Path:
    """The tiny llama with exact weights and the tiny tokenizer, saved as a model folder."""
    import transformers as tf

    from tests.tiny_models import make_tokenizer_dir, tiny_config

    tok = tf.AutoTokenizer.from_pretrained(make_tokenizer_dir(folder / "tokenizer"))
    cfg = tiny_config("llama", vocab=len(tok))
    cfg.eos_token_id, cfg.bos_token_id, cfg.pad_token_id = tok.eos_token_id, tok.bos_token_id, tok.pad_token_id
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    with torch.no_grad():
        for i, (_, p) in enumerate(sorted(model.named_parameters())):
            if p.dim() >= 2:
                p.copy_(torch.from_numpy(exact_normal(tuple(p.shape), seed=900 + i, scale=WEIGHT_SCALE)))
    out = folder / "model"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def corpus_file(folder: Path) -> str:
    from evalkit.data.corpus import load_corpus

    path = folder / "prose.txt"
    path.write_text(load_corpus("embedded").text[:CORPUS_CHARS], encoding="utf-8")
    return f"file:{path}"


def metrics(folder: Path) -> dict[str, list[float | None]]:
    """``"eval|scheme|metric"`` -> [value, ci_low, ci_high] of every summary metric (overall rows)."""
    from evalkit.evals.decode.evaluation import DecodeEval
    from evalkit.evals.perplexity.evaluation import PerplexityEval
    from evalkit.kv.scheme import parse_scheme
    from evalkit.models.loading import load_model

    folder = Path(folder)
    lm = load_model(str(build_model(folder)), dtype=DTYPE)
    corpus = corpus_file(folder)
    out = {}
    for cls, params in ((PerplexityEval, PERPLEXITY), (DecodeEval, DECODE)):
        ev = cls({**params, "corpus": corpus})
        ev.prepare(lm, folder / "work")
        for text in SCHEMES:
            for row in ev.evaluate(lm, parse_scheme(text)):
                if not row.labels and row.metric in cls.summary_metrics:
                    out[f"{cls.name}|{text}|{row.metric}"] = [
                        _plain(row.value),
                        _plain(row.ci_low),
                        _plain(row.ci_high),
                    ]
    return out


def _plain(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def scale(key: str, want: dict) -> float:
    """The magnitude a metric's float noise is relative to: the baseline perplexity for perplexities and
    their changes, 10 for a p-value (a t test of differences of per-window NLL), 1 for nats, shares, counts."""
    evaluation, _, metric = key.split("|")
    if metric in ("ppl", "ppl_delta"):
        return abs(want[f"{evaluation}|auto|ppl"][0])
    return 10.0 if metric == "p_value" else 1.0


def differences(want: dict, got: dict) -> list[str]:
    """Where ``got`` leaves ``want`` by more than ``TOLERANCE * (scale + |pinned|)`` (or a key or a
    missing value differs)."""
    bad = [f"{k}: pinned but not computed" for k in want if k not in got]
    bad += [f"{k}: computed but not pinned" for k in got if k not in want]
    for key in sorted(set(want) & set(got)):
        for name, w, g in zip(("value", "ci_low", "ci_high"), want[key], got[key]):
            if w is None or g is None:
                same = w is None and g is None
            else:
                same = abs(g - w) <= TOLERANCE * (scale(key, want) + abs(w))
            if not same:
                bad.append(f"{key} {name}: pinned {w!r}, got {g!r}")
    return bad
