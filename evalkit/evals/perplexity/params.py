"""The perplexity evaluation's parameters: its ``--perplexity-<field>`` flags, grid keys, defaults and checks
(:class:`PerplexityParams`). A module of its own that imports no torch, scipy or pandas, so that ``run --help``
lists the evaluation's flags without importing the evaluation (:func:`evalkit.evals.registry.flag_declarations`).
"""

from __future__ import annotations

from dataclasses import dataclass

from evalkit.errors import EvalkitError
from evalkit.evals.interval_methods import parse_method
from evalkit.evals.params import Params, param


@dataclass(frozen=True)
class PerplexityParams(Params):
    """The perplexity evaluation's parameters: grid keys are the field names, CLI flags ``--perplexity-<field>``."""

    corpus: str = param(
        "embedded", "embedded (default), wikitext2, file:PATH (.txt/.jsonl) or hf:NAME[/CONFIG]:SPLIT[:COLUMN]"
    )
    window: int = param(1024, "tokens per window incl. BOS (default 1024)", baseline=True)
    stride: int | None = param(None, "tokens between window starts (default: window, disjoint)", baseline=True)
    max_windows: int | None = param(20, "evaluate at most N windows (default 20)", low=1, baseline=True)
    max_tokens: int | None = param(None, "use only the first N corpus tokens", low=2, baseline=True)
    batch_size: int = param(1, "windows per forward (default 1)", low=1, baseline=True)
    bos: bool | None = param(
        None, "start each window with BOS (default: when the tokenizer adds BOS itself)", baseline=True
    )
    interval: str = param(
        "t",
        "interval over windows: t (studentized jackknife, default; its coverage holds at a few windows) or "
        "bootstrap (percentile; too narrow below about 20 windows)",
        parse=parse_method,
    )
    bootstrap_samples: int = param(
        2000, "bootstrap resamples, with --perplexity-interval bootstrap (default 2000)", low=100
    )
    seed: int = param(0, "bootstrap seed (default 0)")
    float_noise_seeds: int = param(
        0,
        "also rerun baseline and scheme on N weight copies perturbed by a few ulps (seeds 1..N) and widen the "
        "intervals by that float spread (default 0: off; costs N extra forwards per scheme and N model copies in memory)",
        low=0,
    )

    prefill_chunk: int = param(
        8192,  # evalkit.integration.chunked.DEFAULT_CHUNK (a test holds them equal): this module imports no torch
        "the engine's prefill chunk (vLLM max_num_batched_tokens; default 8192, `vllm serve` on an H100/H200): "
        "a window longer than it is prefilled chunk by chunk under a scheme whose first chunk reads raw K/V "
        "(vLLM TurboQuant, UltraQuant), so later chunks read the earlier ones quantized",
        low=1,
    )

    def check(self) -> None:
        if self.window < 2:
            raise EvalkitError(f"window {self.window} is too short: use {self.flag('window')} 2 or more")
        if self.stride is None:
            self._set("stride", self.window)
        if not 0 < self.stride <= self.window:
            raise EvalkitError(f"stride {self.stride} must be in 1..window ({self.window}): fix {self.flag('stride')}")
