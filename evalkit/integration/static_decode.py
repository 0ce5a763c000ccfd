"""Decoding through a static storage cache, one step optionally compiled: the GPU-class decode path.

The decode-bound evaluations (decode, retrieval's generation, lm-eval's ``generate_until``) run
their decode steps on one of three paths, chosen per model (``--decode-path``, a grid model's
``decode_path``; :func:`resolve_decode_path`):

* ``eager``: the dynamic storage cache (:class:`~evalkit.integration.storage.StorageCache`), one
  eager forward per token; the default on CPU, and what every published store was made with;
* ``static``: a :class:`~evalkit.integration.static_cache.StaticStorageCache` of the run's longest
  sequence, one eager forward per token over the same shapes every step;
* ``compiled``: the ``static`` step under ``torch.compile`` (``fullgraph``; on CUDA with CUDA graphs,
  ``mode="reduce-overhead"``), so a step is one graph replay instead of about a thousand kernel
  launches from Python; the default on CUDA (``auto``).

What is compiled is exactly the eager static step (the model's forward with the storage cache's
quantize / store / dequantize ops): with a backend that runs the same kernels (``aot_eager`` on
CPU, the tests' choice; ``cudagraphs``) the compiled step equals the eager one bit for bit, and
under the identity scheme the static path equals transformers' own static-cache decode bit for bit
(tests). Inductor (the default backend) fuses the elementwise work into its own kernels, as it does
for transformers' compiled decode; its logits then differ from the eager ones at the level of
float rounding, as that of the plain model does.

Compiled steps are kept across batches and schemes: a cache is as long as its length's bucket and
a graph is reused wherever its guards hold (one compile per bucket, batch size and scheme code
path), counted and timed per run (:mod:`evalkit.integration.compile_cache`).

The prefill runs eagerly (its shapes change with the prompt), then every step feeds one token per
sequence. :class:`StaticDecoder` drives that and is what the evaluations call; the 2-D attention
mask it hands the model covers all ``max_len`` positions (ones for tokens not decoded yet, whose
keys the causal mask hides), so its shape never changes either.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable

import torch

from evalkit.errors import EvalkitError
from evalkit.integration.compile_cache import cache_length, compiled_call
from evalkit.integration.hf_compat import cache_keyword
from evalkit.models.decode_path import DECODE_PATHS, resolve_decode_path

__all__ = [
    "DECODE_PATHS",
    "StaticDecoder",
    "greedy_generate",
    "position_ids",
    "resolve_decode_path",
    "sampling_warpers",
]


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Position of each token among its sequence's real tokens (padding gets 0), as ``generate()``."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def compile_options(device: torch.device | str) -> dict:
    """``torch.compile`` keywords for the decode step: CUDA graphs on CUDA (``reduce-overhead``);
    ``EVALKIT_COMPILE_BACKEND`` picks another backend (e.g. ``aot_eager``, ``cudagraphs``)."""
    backend = os.environ.get("EVALKIT_COMPILE_BACKEND", "inductor")
    options: dict = {"backend": backend, "fullgraph": True, "dynamic": False}
    if backend == "inductor" and torch.device(device).type == "cuda":
        options["mode"] = "reduce-overhead"
    return options


def _accepts(module, name: str) -> bool:
    return name in inspect.signature(type(module).forward).parameters


def _step(
    backbone, head, cache, ids, positions, padding, kv_positions, keyword: str, pass_position: bool, additive: bool
):
    """One decode forward over the static cache (and ``head`` over its last hidden state, when given);
    the 4-D mask is made here, from the cache's length."""
    position = cache.layers[0].k.length.view(1)  # the new token's place (a device tensor)
    allowed = (kv_positions <= position) & padding  # (B, 1, 1, max_len): causal, and no padded key
    mask = (
        allowed
        if not additive
        else torch.zeros(allowed.shape, dtype=padding_dtype(backbone)).masked_fill(
            ~allowed, torch.finfo(padding_dtype(backbone)).min
        )
    )
    kwargs = {keyword: cache, "use_cache": True}
    if pass_position:  # transformers < 5.20 index the static cache and its mask by cache_position
        kwargs["cache_position"] = position
    out = backbone(input_ids=ids, attention_mask=mask, position_ids=positions, **kwargs)
    hidden = out.last_hidden_state[:, -1]
    return hidden if head is None else head(hidden)


def padding_dtype(backbone) -> torch.dtype:
    return next(backbone.parameters()).dtype


class StaticDecoder:
    """Prefill into a static storage cache of ``max_len`` tokens, then decode one token per
    :meth:`step`; the step compiled when ``compiled``. Hidden states out (B, hidden). The cache holds
    ``max_len`` rounded up to 16 positions, or to its bucket when ``bucketed`` (default: ``compiled``;
    :func:`~evalkit.integration.compile_cache.cache_length`); the extra positions are masked and
    change no number.

    ``mask`` (B, >= max_len): which positions of each row are real (left padding only; every
    position from the prefill's last on is real). The prefill's mask is transformers' own (from the
    2-D mask); each step's is made here as a 4-D mask (causal up to the new token, no padded key),
    in the form the model's attention takes (boolean for sdpa, additive for eager), so an eager and
    a compiled step get the same mask."""

    def __init__(
        self,
        session,
        backbone,
        mask: torch.Tensor,
        prefill: int,
        max_len: int,
        compiled: bool,
        head=None,
        bucketed: bool | None = None,
    ):
        if not 0 < prefill <= max_len <= mask.shape[1]:
            raise EvalkitError(f"a static decode needs 0 < prefill ({prefill}) <= max_len ({max_len}) <= mask length")
        # a compiled step's cache is as long as its length's bucket, so batches of nearby lengths share a graph;
        # either way a multiple of 16 positions, so the bucket changes no number (compile_cache)
        length = cache_length(max_len, compiled if bucketed is None else bucketed)
        self.backbone, self.max_len, self.head = backbone, length, head  # head: applied inside the step
        self.cache = session.new_static_cache(length, mask[:, :prefill])
        self.prefill_mask = mask[:, :prefill]
        device = mask.device
        padding = mask[:, :max_len]
        if length > max_len:  # bucket positions past the real length: keys the causal mask hides
            padding = torch.cat([padding, padding.new_ones(padding.shape[0], length - max_len)], dim=1)
        self.padding = padding[:, None, None, :].bool().contiguous()
        self.kv_positions = torch.arange(length, device=device).view(1, 1, 1, length)
        self.keyword = cache_keyword(backbone)
        self.pass_position = _accepts(backbone, "cache_position")
        self.additive = getattr(backbone.config, "_attn_implementation", "sdpa") != "sdpa"
        # graphs are kept across decoders (batches, schemes): dynamo reuses one whose guards hold
        self.compiled = compiled
        self._step = torch.compile(_step, **compile_options(device)) if compiled else _step

    def prefill(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The first write (eager): ``ids``/``positions`` (B, prefill); the last position's hidden state."""
        kwargs = {self.keyword: self.cache, "use_cache": True}
        if self.pass_position:
            kwargs["cache_position"] = torch.arange(ids.shape[1], device=ids.device)
        out = self.backbone(input_ids=ids, attention_mask=self.prefill_mask, position_ids=positions, **kwargs)
        return out.last_hidden_state[:, -1]

    def step(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One token per sequence (B, 1) at the next position; its hidden state (B, hidden), or the
        head's output over it when the decoder was given a head."""
        args = (
            self.backbone,
            self.head,
            self.cache,
            ids.contiguous(),  # a slice's strides differ with the batch's length: a compiled graph guards on them
            positions.contiguous(),
            self.padding,
            self.kv_positions,
            self.keyword,
            self.pass_position,
            self.additive,
        )
        if self.compiled:
            hidden = compiled_call(self._step, (ids.shape[0], self.max_len), *args)
        else:
            hidden = self._step(*args)
        return hidden.clone()  # a CUDA graph's output is overwritten by its next replay


# generation settings the static path reproduces (transformers' sampling warpers, in generate()'s order)
SAMPLING_KEYS = ("do_sample", "temperature", "top_k", "top_p")
_UNSUPPORTED = ("top_h", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "repetition_penalty", "num_beams")


def sampling_warpers(model, **settings):
    """transformers' own sampling warpers for ``settings`` (``temperature``, ``top_k``, ``top_p``) over
    the model's generation config, in ``generate()``'s order (temperature, top-k, top-p), or None
    when ``do_sample`` is off: so a static-path sample draws what ``generate()`` draws. Other
    sampling settings are refused in one line (they run on the eager path)."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    unknown = sorted(set(settings) - set(SAMPLING_KEYS))
    if unknown:
        raise EvalkitError(
            f"generation setting(s) {', '.join(unknown)} run on the eager decode path only: pass --decode-path eager"
        )
    config, _ = model._prepare_generation_config(None, **settings)  # generate()'s own resolution (its defaults too)
    if not config.do_sample:
        return None
    odd = [k for k in _UNSUPPORTED if getattr(config, k, None) not in (None, 0, 1)]  # 0 / 1: inactive
    if odd:
        raise EvalkitError(
            f"the model's generation config sets {', '.join(odd)}, which the static decode path does not "
            "reproduce: pass --decode-path eager"
        )
    warpers = LogitsProcessorList()
    if config.temperature is not None and config.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(config.temperature))
    if config.top_k is not None and config.top_k != 0:
        warpers.append(TopKLogitsWarper(top_k=config.top_k, min_tokens_to_keep=1))
    if config.top_p is not None and config.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=config.top_p, min_tokens_to_keep=1))
    return warpers


def greedy_generate(
    session,
    model,
    ids: torch.Tensor,
    mask: torch.Tensor,
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    compiled: bool,
    check_every: int = 8,
    on_logits: Callable[[torch.Tensor], None] | None = None,
    warpers=None,
    bucketed: bool | None = None,
) -> torch.Tensor:
    """Decoding as ``generate()`` does it, through a :class:`StaticDecoder`: ``ids``/``mask`` (B, P),
    left-padded. Greedy (the argmax of the float32 logits) unless ``warpers``
    (:func:`sampling_warpers`) are given: then each step's float32 logits go through them, then a
    softmax and one ``torch.multinomial`` draw per row from torch's global generator, exactly as
    ``generate(do_sample=True)`` draws (so a seed gives the same tokens on both paths where the
    logits are the same). A row that produced an EOS token feeds ``pad_id`` from then on and gets
    ``pad_id``. Returns the new tokens (B, max_new_tokens, ``pad_id`` after EOS, cut where every row
    has finished, checked every ``check_every`` steps).

    A step's logits (B, vocab, float32) live for that step only: ``on_logits``, when given, receives
    them and keeps what the evaluation writes (statistics, the logprobs it reports); nothing else
    holds them. A long generation therefore holds its tokens, the cache and one step's logits per
    row, whatever its length (at 32k steps and a 128k vocabulary, keeping every step's would be
    16.8 GB per row).

    ``bucketed`` (default: ``compiled``): the cache is as long as its length's bucket
    (:func:`~evalkit.integration.compile_cache.bucket_length`), so batches share compiled graphs; the
    tokens and logits are the same either way (:mod:`~evalkit.integration.compile_cache`)."""
    b, p = ids.shape
    full = torch.cat([mask, mask.new_ones(b, max_new_tokens)], dim=1)
    positions = position_ids(full)
    # the last new token is never fed back: the cache holds p + max_new_tokens - 1 tokens, as generate()'s
    decoder = StaticDecoder(
        session, model.base_model, full, p, p + max(max_new_tokens - 1, 0), compiled, bucketed=bucketed
    )
    head = model.get_output_embeddings()
    eos = torch.tensor(eos_ids or [-1], device=ids.device)
    done = torch.zeros(b, dtype=torch.bool, device=ids.device)
    hidden = decoder.prefill(ids, positions[:, :p])
    tokens = []
    for t in range(max_new_tokens):
        step_logits = head(hidden).float()
        if on_logits is not None:
            on_logits(step_logits)
        if warpers is None:
            chosen = step_logits.argmax(-1)
        else:
            scores = warpers(ids, step_logits)  # the warpers read no input ids
            chosen = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
            del scores
        del step_logits  # dropped before the next step's are made
        nxt = torch.where(done, torch.full_like(done, pad_id, dtype=torch.long), chosen)
        tokens.append(nxt)
        done = done | torch.isin(nxt, eos)
        if t + 1 == max_new_tokens or ((t + 1) % check_every == 0 and bool(done.all())):
            break
        hidden = decoder.step(nxt[:, None], positions[:, p + t : p + t + 1])
    session.check_finite()
    return torch.stack(tokens, dim=1)
