"""The perplexity evaluation's size for ``sweep --dry-run``, from its parameters and the model's facts.

The window plan of :func:`evalkit.evals.perplexity.evaluation.plan_windows` over the corpus,
tokenized with the model's tokenizer when both are on this machine (exact); otherwise the
corpus's known token count (:data:`WIKITEXT2_TEST_TOKENS`) or ~4 characters per token
(approximate). Tokens = windows x window (every window is forwarded whole). The baseline stores
:data:`~evalkit.evals.kl_topk.BYTES_PER_POSITION` (2008) bytes per scored token. With
``float_noise_seeds`` N, both run N + 1 times (the perturbed-weight copies' reruns and baselines).
"""

from __future__ import annotations

from evalkit.errors import EvalkitError
from evalkit.evals.kl_topk import BYTES_PER_POSITION
from evalkit.evals.perplexity.windows import plan_windows, position_bucket_edges
from evalkit.evals.sizing import CHARS_PER_TOKEN, ROW_BYTES, Forwards, Work, batches, count_tokens

# wikitext-2-raw-v1 test split, tokens of the whole split (no special tokens), per tokenizer family.
# gpt2: 287,644 (Hugging Face transformers docs, "Perplexity of fixed-length models");
# llama-2 (32k SentencePiece): ~341k (GPTQ/Wanda-style evaluations cut it into 83 windows of 4096
# and 166 of 2048); llama-3 (128k tiktoken BPE): ~289k (140-141 windows of 2048 in the same
# evaluations). Rows of the evalkit corpus are joined as they are, as in those counts.
WIKITEXT2_TEST_TOKENS = {"gpt2": 287_644, "llama-2": 341_000, "llama-3": 289_000}
WIKITEXT2_TEST_CHARS = 1_288_556  # characters of the raw test split (for other tokenizers, / CHARS_PER_TOKEN)


def _corpus_tokens(spec: str, facts) -> tuple[int, bool | None, str]:
    """(tokens in the corpus, whether the tokenizer adds BOS or None if unknown, why approximate)."""
    from evalkit.data.corpus import SHORT_NAMES, load_corpus, tokenizer_adds_bos
    from evalkit.evals.lmeval.adapter import offline_datasets

    tok = facts.tokenizer
    try:
        with offline_datasets(True):  # a dry run never downloads: a corpus not here is sized from its known count
            corpus = load_corpus(spec)
    except (EvalkitError, ImportError):
        corpus = None
    bos = tokenizer_adds_bos(tok) if tok is not None else None
    if corpus is not None and tok is not None:
        return count_tokens(tok, corpus.text), bos, ""
    if corpus is not None:
        return (
            count_tokens(None, corpus.text),
            bos,
            f"corpus {spec} at ~{CHARS_PER_TOKEN:g} characters per token (no tokenizer here)",
        )
    if SHORT_NAMES.get(spec.strip().lower(), spec) == SHORT_NAMES["wikitext2"]:
        name = facts.name.lower()
        family = next((f for f in ("llama-3", "llama-2", "gpt2") if f in name or f.replace("-", "") in name), None)
        if family is None and facts.vocab:
            family = {128256: "llama-3", 32000: "llama-2", 50257: "gpt2"}.get(facts.vocab)
        if family:
            return (
                WIKITEXT2_TEST_TOKENS[family],
                bos,
                f"wikitext-2 test not cached here: ~{WIKITEXT2_TEST_TOKENS[family]:,} tokens ({family} tokenizer)",
            )
        n = round(WIKITEXT2_TEST_CHARS / CHARS_PER_TOKEN)
        return n, bos, f"wikitext-2 test not cached here: ~{n:,} tokens at ~{CHARS_PER_TOKEN:g} characters per token"
    raise EvalkitError(
        f"corpus {spec!r} is not on this machine and its size is unknown: cannot size the perplexity runs"
    )


def perplexity_work(params: dict, facts) -> Work:
    n, bos, approx = _corpus_tokens(params["corpus"], facts)
    if bos is None:
        bos = True  # Llama-family tokenizers add BOS
    if params["max_tokens"] is not None:
        n = min(n, params["max_tokens"])
    window = params["window"]
    if facts.max_length is not None and window > facts.max_length:
        raise EvalkitError(f"perplexity window {window} is longer than {facts.name}'s maximum {facts.max_length}")
    plan = plan_windows(n, window, params["stride"], bos, params["max_windows"])
    scored = sum(window - t0 for _, t0 in plan)
    # float_noise_seeds N: the scheme and the baseline run again on N perturbed weight copies
    copies = 1 + int(params.get("float_noise_seeds") or 0)
    fw = tuple(Forwards(c * copies, r, window) for c, r in batches(len(plan), params["batch_size"]))
    rows = 8 * len(position_bucket_edges(window)) + 4  # 8 metrics, overall and per bucket; 4 KL percentiles
    return Work(
        "perplexity",
        copies * len(plan) * window,
        fw,
        baseline=fw,
        baseline_bytes=copies * (scored * BYTES_PER_POSITION + 8 * len(plan)),
        cache_bytes=4 * n,
        store_bytes=rows * ROW_BYTES + 90 * len(plan),
        approximate=approx,
    )
