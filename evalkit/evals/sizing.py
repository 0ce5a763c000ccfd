"""What one run of an evaluation processes, in the terms ``evalkit sweep --dry-run`` prices.

Each evaluation sizes itself (:meth:`evalkit.evals.base.Evaluation.workload`) from its parameters
and the model's facts (:mod:`evalkit.models.facts`), without running: a :class:`Work` holds the
forward calls one scheme's pass makes (batched prefills and one-token decode steps, with the
context they attend to), the tokens they process, the baseline pass (once per model x
evaluation, as the evaluations cache it), and the disk its baseline cache and its results take.
The sweep turns Works into time and disk (:mod:`evalkit.sweep.estimate`).

Result rows and per-run artifacts are sized from the published default sweep (:data:`ROW_BYTES`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

CHARS_PER_TOKEN = 4.0  # English prose, when no tokenizer is here (GPT-2/Llama-3 tokenizers: 4-4.5)
ROW_BYTES = 1100  # one results.jsonl row with its info (published/default: 1.09 MB / 1040 rows)


@dataclass(frozen=True)
class Forwards:
    """``calls`` forward calls of ``rows`` sequences x ``length`` new tokens, each row attending to
    ``context`` tokens already cached (a mean over the calls). ``cache``: the tokens a preallocated
    (static) cache holds for these calls, the run's longest sequence, which a compiled decode step
    reads in full whatever its position (0: only ``context``)."""

    calls: int
    rows: int
    length: int
    context: float = 0.0
    cache: float = 0.0

    @property
    def tokens(self) -> int:
        return self.calls * self.rows * self.length


@dataclass(frozen=True)
class Work:
    """What one run of an evaluation processes, and what it stores."""

    eval: str
    tokens: int  # tokens one scheme's pass processes
    forwards: tuple[Forwards, ...]  # one scheme's pass
    baseline: tuple[Forwards, ...] = ()  # once per model x evaluation (cached afterwards)
    identity_is_baseline: bool = False  # the auto run reuses the baseline pass (retrieval)
    baseline_bytes: int = 0  # baseline cache, once per model x evaluation (under the cache folder)
    cache_bytes: int = 0  # other caches (tokenized corpus), once per model x evaluation
    store_bytes: int = 0  # results rows and artifacts of one run (under the output folder)
    approximate: str = ""  # why the counts are approximate ("" when exact)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def baseline_tokens(self) -> int:
        return self.tokens if self.baseline else 0  # the baseline pass runs the same inputs


def count_tokens(tokenizer, text: str) -> int:
    """Tokens of ``text`` (no special tokens); ~:data:`CHARS_PER_TOKEN` characters each without a tokenizer."""
    if tokenizer is None:
        return max(1, round(len(text) / CHARS_PER_TOKEN))
    return len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def batches(n: int, batch: int) -> list[tuple[int, int]]:
    """(calls, rows) groups covering n rows in batches of ``batch`` (the last one may be smaller)."""
    full, rest = divmod(n, batch)
    return [(c, r) for c, r in ((full, batch), (1 if rest else 0, rest)) if c]


AUTO_BATCH = 32  # lm-eval's batch size "auto" searches down from 64 on the device: 32 assumed
KV_TOKENS_PER_BATCH = 262_144  # prompt + generation tokens one batch holds (32 GiB of Llama-3.1-8B bf16 K/V)


def item_forwards(n: int, prompt: int, gen: int, samples: int, batch: int) -> list[Forwards]:
    """The forward calls of ``n`` items (``samples`` generations each), batched as lm-eval batches them."""
    rows = max(1, min(batch, KV_TOKENS_PER_BATCH // max(1, prompt + gen)))
    out = []
    full, rest = divmod(n * samples, rows)
    for calls, r in ((full, rows), (1, rest)):
        if calls and r:
            out.append(Forwards(calls, r, prompt))
            if gen > 1:
                out.append(Forwards(calls * (gen - 1), r, 1, prompt + gen / 2, prompt + gen))
    return out
