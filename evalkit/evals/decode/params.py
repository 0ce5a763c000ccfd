"""The decode evaluation's parameters (:class:`DecodeParams`) and the two plain functions of its
protocol that sizing shares with the evaluation: where the sequences start in the corpus
(:func:`sequence_starts`) and the edges of its position buckets (:func:`step_bucket_edges`)."""

from __future__ import annotations

from dataclasses import dataclass

from evalkit.errors import EvalkitError
from evalkit.evals.interval_methods import parse_method
from evalkit.evals.params import Params, param


@dataclass(frozen=True)
class DecodeParams(Params):
    """The decode evaluation's parameters: grid keys are the field names, CLI flags ``--decode-<field>``."""

    corpus: str = param(
        "embedded", "corpus: embedded (default), wikitext2, file:PATH (.txt/.jsonl) or hf:NAME[/CONFIG]:SPLIT[:COLUMN]"
    )
    prefill: int = param(512, "prompt tokens P per sequence, BOS included (default 512)", low=1, baseline=True)
    decode: int = param(
        1536, "generated tokens T per sequence (default 1536)", low=1, baseline=True, flag="--decode-tokens"
    )
    sequences: int = param(4, "sequences N cut from the corpus (default 4)", low=1, baseline=True)
    batch_size: int = param(
        8,
        "rows per forward; each sequence is two rows, teacher-forced and free-running (default 8)",
        low=1,
        baseline=True,
    )
    buckets: int = param(8, "equal-width position buckets over the decoded tokens (default 8)", low=1)
    bos: bool | None = param(
        None, "start each sequence with BOS (default: when the tokenizer adds BOS itself)", baseline=True
    )
    interval: str = param(
        "t",
        "interval over sequences: t (studentized jackknife, default; its coverage holds at a few sequences) or "
        "bootstrap (percentile; too narrow below about 20 sequences)",
        parse=parse_method,
    )
    bootstrap_samples: int = param(
        2000, "bootstrap resamples, with --decode-interval bootstrap (default 2000)", low=100
    )
    seed: int = param(0, "bootstrap seed (default 0)", low=0)

    @property
    def length(self) -> int:
        return self.prefill + self.decode


def step_bucket_edges(decode: int, buckets: int) -> list[int]:
    """Edges of ``min(buckets, decode)`` equal-width groups of decode steps 0..decode (widths differ by at most 1)."""
    k = min(buckets, decode)
    return [i * decode // k for i in range(k + 1)]


def sequence_starts(n_tokens: int, span: int, sequences: int) -> list[int]:
    """Evenly spaced, non-overlapping starts of ``sequences`` spans of ``span`` corpus tokens."""
    need = sequences * span
    if n_tokens < need:
        raise EvalkitError(
            f"the corpus has {n_tokens} tokens, fewer than {sequences} sequences x {span} tokens = {need}: "
            "use a longer corpus or fewer --decode-sequences / a shorter --decode-prefill or --decode-tokens"
        )
    if sequences == 1:
        return [0]
    return [i * (n_tokens - span) // (sequences - 1) for i in range(sequences)]
