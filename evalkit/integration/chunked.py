"""Chunked prefill and prefix-cache hits: a prompt written to the storage cache in pieces, as a serving
engine writes it, so that later pieces read the earlier ones through the stored bytes.

What vLLM does (read in the released wheels 0.32.0, 0.33.0 and 0.34.0; the logic is the same in all three,
line numbers are 0.32.0's):

* **Chunk size.** The scheduler prefills a long prompt ``max_num_batched_tokens`` tokens per step
  (``vllm/config/scheduler.py:134`` ``enable_chunked_prefill: bool = True``). Without a user setting the
  engine arguments pick it by device and entry point (``vllm/engine/arg_utils.py:2923-2982``
  ``get_batch_defaults``; 0.33: 2973-3036, 0.34: 3010-3073): GPUs of 160 GiB or more 16384 (``LLM``) /
  16384 (``vllm serve``); 70 GiB or more, not A100 (H100, H200) 16384 / 8192; other GPUs 8192 / 2048;
  CPU 4096 / 2048 per rank. :data:`DEFAULT_CHUNK` is 8192: ``vllm serve`` on an H100/H200, and the
  offline ``LLM`` class on a smaller GPU. A request alone in the batch is cut at multiples of the chunk.
* **What a chunk reads** (``vllm/v1/attention/backends/turboquant_attn.py`` ``_prefill_attention``,
  ``ultraquant_attn.py`` the same by subclassing): every token's K/V is stored before attention runs
  (``do_kv_cache_update``, :498). A *first-chunk* prefill (``q_len == seq_len``, :740 and :799) attends
  over the raw K/V it was given. A *continuation* chunk (``seq_len > q_len``: a chunk after the first,
  or the rest of a prompt after a prefix-cache hit) of at most ``_CONTINUATION_DECODE_THRESHOLD`` = 128
  tokens (:84, :833; ``ultraquant_attn.py:439``) runs the decode kernel per query: every key and value,
  its own chunk's included, read from the quantized cache. A longer continuation chunk
  (``_continuation_prefill``, :907) dequantizes the cached tokens and concatenates the current chunk's
  **raw** K/V (:1053-1056; ``ultraquant_attn.py:537-540``). :func:`continuation_reads_raw_chunk` says
  which, and the storage cache (:mod:`evalkit.integration.storage`) reads accordingly.
* The FP8 backends (``flash_attn.py:1401``, ``triton_attn.py:665``, and the CPU backend's
  ``cpu_attention_with_kv_cache``) attend from the paged cache, first chunk included: for them, and
  for every evalkit scheme that stores on write and reads back everything, cutting the prompt changes
  what is read only where a dynamic scale is taken from the first write (a shorter first write) and
  in float summation order.
* **Prefix-cache hits.** Prefix caching is on by default (``vllm/config/cache.py:141``
  ``enable_prefix_caching: bool = True``). A request reuses the full cached blocks
  (``CacheConfig.DEFAULT_BLOCK_SIZE`` = 16 tokens, ``cache.py:72``) of its longest cached prefix, at most
  ``num_tokens - 1`` tokens (``vllm/v1/core/kv_cache_manager.py:289-298``: the last token is always
  recomputed for its logits); the rest of its prompt is a continuation chunk over those quantized blocks.
  :func:`prefix_hit_length` gives that length.

Not modelled: TurboQuant's long-continuation path dequantizes into a float16 workspace
(``turboquant_attn.py:942-945``) and rotates keys back in float16; here the earlier tokens are read at
the precision the decode path reads (the model's dtype). Batches of several requests whose chunks the
scheduler interleaves are cut as each request alone would be.
"""

from __future__ import annotations

import torch

DEFAULT_CHUNK = 8192  # max_num_batched_tokens: `vllm serve` on an H100/H200 (see the module docstring)
CONTINUATION_DECODE_THRESHOLD = 128  # turboquant_attn.py:84 _CONTINUATION_DECODE_THRESHOLD
PREFIX_BLOCK = 16  # vllm/config/cache.py:72 CacheConfig.DEFAULT_BLOCK_SIZE: prefix hits are whole blocks


def reads_raw_first_write(scheme) -> bool:
    """Whether ``scheme`` (a Scheme or its string)'s engine attends a first-chunk prefill from the raw K/V and
    evalkit models its later chunks (its slot codec's ``chunked_like_turboquant``: vLLM TurboQuant and
    UltraQuant; Octave attends raw too, past 128 tokens, but its continuation chunks are not modelled)."""
    from evalkit.kv.codec import codec_for
    from evalkit.kv.scheme import parse_scheme

    scheme = parse_scheme(scheme) if isinstance(scheme, str) else scheme
    codec = codec_for(scheme.kv_format.recipe)
    return codec is not None and codec.chunked_like_turboquant


def continuation_reads_raw_chunk(q_len: int) -> bool:
    """Whether a continuation chunk of ``q_len`` tokens reads its own K/V raw (vLLM's
    ``_continuation_prefill``, chunks over :data:`CONTINUATION_DECODE_THRESHOLD`) rather than from the cache
    (the decode kernel, chunks of at most that many tokens), for a ``prefill_reads_raw`` codec."""
    return q_len > CONTINUATION_DECODE_THRESHOLD


def chunk_bounds(length: int, chunk: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each prefill chunk of a ``length``-token prompt, ``chunk`` tokens each (the last shorter)."""
    if chunk < 1:
        raise ValueError(f"chunk {chunk} must be at least 1")
    return [(a, min(a + chunk, length)) for a in range(0, length, chunk)]


def chunked_prefill_applies(scheme, length: int, chunk: int | None) -> bool:
    """Whether a ``length``-token prompt under ``scheme`` is prefilled in chunks here: only where the
    engine's first-chunk prefill reads raw K/V (elsewhere chunking changes no value read, and the one
    forward stays: its numbers are kept bit for bit) and the prompt is longer than one chunk."""
    return chunk is not None and length > chunk and reads_raw_first_write(scheme)


def prefill_in_chunks(backbone, ids: torch.Tensor, chunk: int, cache) -> torch.Tensor:
    """The last hidden states (B, L, hidden) of ``ids`` (B, L, no padding) run through ``backbone`` one
    chunk of ``chunk`` tokens at a time into ``cache`` (a storage cache of the enclosing ``quantized_kv``
    block): every chunk after the first is a continuation over the stored tokens. Positions follow the
    cache's length, as in one forward."""
    from evalkit.integration.hf_compat import cache_inputs, output_cache  # transformers: only when prefilling

    hidden = []
    for a, b in chunk_bounds(ids.shape[1], chunk):
        out = backbone(input_ids=ids[:, a:b], **cache_inputs(backbone, cache))
        cache = output_cache(out) or cache
        hidden.append(out.last_hidden_state)
        del out
    return torch.cat(hidden, dim=1)


def prefill_note(chunk: int) -> str:
    """What a row measured through chunked prefill says of its path."""
    return f"chunked prefill, chunk {chunk}"


def prefix_hit_length(shared: int, total: int, block: int = PREFIX_BLOCK) -> int:
    """Tokens a request of ``total`` tokens reads from the prefix cache when its first ``shared`` tokens
    are cached: whole blocks of ``block`` tokens, at most ``total - 1`` (vLLM recomputes the last token)."""
    usable = max(0, min(shared, total - 1))
    return usable // block * block


def common_prefix(a, b) -> int:
    """The length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def shared_prefixes(prompts: list, block: int = PREFIX_BLOCK) -> list[int]:
    """For each prompt (a token sequence), the prefix-cache hit it gets when every other prompt of the
    set has been served before it (a warm cache): its longest common prefix with any other prompt,
    in whole blocks, at most its length - 1 (:func:`prefix_hit_length`). Sorting the prompts makes the
    longest common prefix with any other that of a neighbour."""
    order = sorted(range(len(prompts)), key=lambda i: list(prompts[i]))
    shared = [0] * len(prompts)
    for x, y in zip(order, order[1:]):
        n = common_prefix(prompts[x], prompts[y])
        shared[x], shared[y] = max(shared[x], n), max(shared[y], n)
    return [prefix_hit_length(s, len(p), block) for s, p in zip(shared, prompts)]
