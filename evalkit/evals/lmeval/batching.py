"""Exact batched lm-eval: any batch size gives each item its batch-size-1 log-likelihoods.

``EvalkitHFLM`` (:func:`hflm_class`) subclasses lm-eval's HFLM, as lm-eval's own ``hf_steered``
adapter does; nothing is patched. lm-eval right-pads loglikelihood batches with token id 0 and
calls the model without an attention mask, so padding would enter dynamic KV scales (tensor and
head amax, block amax) and move the real tokens' log-likelihoods with the batch size. The
subclass knows every row's true length: before lm-eval batches a set of requests it builds each
request's model input as lm-eval does (``(context + continuation)[-(max_length+1):][:-1]``) and
keys it by its tokens without trailing zeros; in ``_model_call`` each row, stripped of its
trailing zeros, finds its length there (inputs that differ only by trailing zeros, a real token
0 at the end, go to separate lm-eval calls so that no call holds both). A padded batch is then
called with the attention mask its padding implies, so the storage cache leaves padding out of
every scale, and its attention runs row by row on each row's own tokens
(:func:`rowwise_attention`). The second part matters as much as the first: a quantized forward
is chaotic in float rounding. Attention over a padded batch rounds differently from attention
over one sequence (the kernel's blocking depends on the padded length), a 1e-7 difference flips
a few FP8 codes, the flips change the next layers' inputs and flip more codes: on the embedded
model a masked batch of 8 still moved MMLU log-likelihoods by up to 0.23 nats under
fp8_e4m3/tensor/dynamic, as much as the scheme itself moves them. With row-wise attention each
row sees the same kernels on the same shapes as at batch size 1 (the projections and MLP are
batch-invariant on CPU): batch 8 equals batch 1 bit for bit there. Where the backend's matrix
products depend on the batch (some GPU kernels), the equality is to float rounding, amplified by
quantization as above. A batch without padding, batch size 1 included, is called exactly as
lm-eval calls it, so batch size 1 stays equal to ``lm_eval --batch_size 1`` to the last digit.
Generation (``generate_until``) is left-padded with a mask by lm-eval already; the storage cache
keeps that padding out of the scales, and it is passed through unchanged. It is not bit-exact
across batch sizes, and row-wise attention would not make it so: every decode step multiplies B
one-token rows, and a matrix product with B rows picks other kernels than one with a single row
(on the embedded model the first step's bf16 logits differ by 3e-5). Under a quantized scheme that
rounding grows as above (up to 0.25 in logits over 12 greedy steps under fp8_e4m3/tensor/dynamic);
greedy continuations matched in the checks (8 passkey prompts on the embedded model, the tiny
model's tests), but a near-tie can flip a generated token where batch size 1 would not.

Default batch size from the device (:func:`default_batch_size`): ``auto`` on CUDA (lm-eval finds
the largest batch that fits, from 64 down), :data:`CPU_BATCH_SIZE` on CPU
(``benchmarks/bench_lmeval_batch.py`` measures the gain). lm-eval's probe runs full forwards of its
longest input; on the static decode paths a generating row also holds its static cache for that
length and one step's logits (:func:`static_row_bytes`), which the probe does not allocate: while
it probes, each of its forwards holds that many bytes per row beside it, so the batch it picks
leaves room for them.
"""

from __future__ import annotations

import contextlib
from functools import cache

from evalkit.errors import EvalkitError

CPU_BATCH_SIZE = 8  # CPU default (bench_lmeval_batch.py); CUDA: "auto"


def default_batch_size(device) -> int | str:
    """lm-eval's batch size when none is given: ``auto`` on CUDA, :data:`CPU_BATCH_SIZE` elsewhere."""
    import torch

    return "auto" if torch.device(device).type == "cuda" else CPU_BATCH_SIZE


def parse_batch_size(value) -> int | str | None:
    """A batch size from a flag or a grid: a whole number >= 1, ``auto``, or None (device default)."""
    if value is None:
        return None
    text = str(value).strip()
    if text.lower() == "auto":
        return "auto"
    if isinstance(value, bool) or not (isinstance(value, int) or text.isdecimal()) or int(text) < 1:
        raise EvalkitError(
            f"lmeval batch_size (--lmeval-batch-size) must be a whole number >= 1 or 'auto', got {value!r}"
        )
    return int(text)


def static_row_bytes(model, scheme, max_len: int, compiled: bool, sampled: bool = True) -> int:
    """What one generating row holds on the static decode path beyond the forward itself: its static
    storage cache for ``max_len`` tokens (the length a compiled step allocates: its bucket,
    :func:`~evalkit.integration.compile_cache.cache_length`; engine bytes,
    :func:`~evalkit.kv.memory.model_cache_bytes`) and one step's logits (the head's output in the
    model's dtype and its float32 copy, and when ``sampled`` the warped scores and probabilities,
    float32 each)."""
    import torch

    from evalkit.integration.compile_cache import cache_length
    from evalkit.kv.memory import model_cache_bytes
    from evalkit.models.info import kv_layout

    cache = model_cache_bytes(kv_layout(model.config), scheme, cache_length(max_len, compiled), batch=1)
    vocab = model.get_output_embeddings().weight.shape[0]
    head = torch.finfo(next(model.parameters()).dtype).bits // 8
    return cache + vocab * (head + 4 + (8 if sampled else 0))


def _strip_pad(tokens: list[int]) -> tuple[int, ...]:
    end = len(tokens)
    while end and tokens[end - 1] == 0:  # lm-eval right-pads with token id 0 (pad_and_concat)
        end -= 1
    return tuple(tokens[:end])


def loglikelihood_calls(requests, max_length: int) -> list[tuple[dict[tuple[int, ...], int], list[int]]]:
    """How to split lm-eval loglikelihood requests ``(strings, context, continuation)`` into calls
    of its ``_loglikelihood_tokens`` (one call, unless two inputs differ only by trailing zeros):
    per call, ``{input without trailing zeros: input length}`` and the request indices. The input is
    built as lm-eval builds it: ``(context + continuation)[-(max_length + 1):][:-1]``."""
    calls: list[tuple[dict[tuple[int, ...], int], list[int]]] = []
    seen: dict[tuple[int, ...], list[int]] = {}  # stripped input -> its distinct lengths, one call each
    for i, (_, context, continuation) in enumerate(requests):
        inp = (list(context) + list(continuation))[-(max_length + 1) :][:-1]
        key = _strip_pad(inp)
        lengths = seen.setdefault(key, [])
        if len(inp) not in lengths:
            lengths.append(len(inp))
        k = lengths.index(len(inp))
        while len(calls) <= k:
            calls.append(({}, []))
        calls[k][0][key] = len(inp)
        calls[k][1].append(i)
    return calls


def padded_lengths(rows: list[list[int]], lengths: dict[tuple[int, ...], int]) -> list[int]:
    """Each right-padded row's true length, looked up by its tokens without trailing zeros."""
    out = []
    for row in rows:
        n = lengths.get(_strip_pad(row))
        if n is None or n > len(row):
            raise RuntimeError("a row of lm-eval's batch matches none of its requests: evalkit cannot tell its padding")
        out.append(n)
    return out


ROWWISE_IMPLEMENTATIONS = ("sdpa", "eager")


@contextlib.contextmanager
def rowwise_attention(model, lengths: list[int]):
    """Inside the block, a right-padded prefill's attention runs row by row on each row's own
    tokens (``lengths``), with the mask a batch of one would get: the same kernel on the same
    shapes as batch size 1, so each row's attention output is bit for bit its batch-size-1 output
    wherever the rest of the forward (projections, norms, MLP) is batch-invariant, as it is on CPU.
    A no-op (the masked batch attention is used) for other attention implementations and when an
    attention handler is already active (``+attn=fa3``)."""
    from evalkit.integration.attention import PREFIX, attention_handler, attention_implementation

    impl = attention_implementation(model)
    if impl.startswith(PREFIX) or impl not in ROWWISE_IMPLEMENTATIONS:
        yield
        return
    with attention_handler(model, _rowwise_handler(lengths, skip_causal_mask=impl == "sdpa")):
        yield


def _rowwise_handler(lengths: list[int], skip_causal_mask: bool):
    import torch

    causal: dict[tuple[int, int], bool] = {}  # (mask storage, row) -> its (n, n) block is plain causal

    def handler(module, query, key, value, attention_mask, inner, **kwargs):
        b, _, q_len, _ = query.shape
        if b != len(lengths) or q_len != key.shape[2]:  # not the prefill of the padded batch: as is
            return inner(module, query, key, value, attention_mask, **kwargs)
        out = None
        for i, n in enumerate(lengths):
            mask = None if attention_mask is None else attention_mask[i : i + 1, ..., :n, :n]
            if mask is not None and skip_causal_mask:  # sdpa: a batch of one passes no mask for plain causal attention
                cache_key = (attention_mask.data_ptr(), i)
                if cache_key not in causal:
                    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
                    tril = torch.ones(n, n, dtype=torch.bool, device=mask.device).tril_()
                    causal[cache_key] = bool((allowed == tril).all())
                mask = None if causal[cache_key] else mask
            row, _ = inner(
                module, query[i : i + 1, :, :n], key[i : i + 1, :, :n], value[i : i + 1, :, :n], mask, **kwargs
            )
            if out is None:
                out = row.new_zeros(b, q_len, *row.shape[2:])
            out[i, :n] = row[0]
        return out, None

    return handler


@cache
def hflm_class(quiet: bool):
    from lm_eval.models.huggingface import HFLM

    class EvalkitHFLM(HFLM):
        """HFLM that gives the model the attention mask lm-eval's right padding implies (see the
        module docstring), so batched log-likelihoods equal batch size 1's under every scheme."""

        _lengths: dict | None = None  # {stripped input: length} of the requests being scored
        _static = None  # (session, compiled) while generate_until decodes through the static storage cache

        @contextlib.contextmanager
        def decode_through(self, session, path: str):
            """Within the block, ``generate_until`` decodes greedily through ``session``'s static storage
            cache (``path`` static or compiled: :mod:`evalkit.integration.static_decode`); eager: as is."""
            self._static = None if path == "eager" else (session, path == "compiled")
            try:
                yield self
            finally:
                self._static = None

        _hits = None  # a PrefixHits while generate_until serves prefix-cache hits (evalkit.evals.lmeval.prefix_hits)
        last_hits: list[int] | None = None  # the tokens each request of the last such run read from the prefix cache

        @contextlib.contextmanager
        def prefix_cache_hits(self, model, session):
            """Within the block, ``generate_until`` serves each prompt with the prefix-cache hit an earlier
            prompt of the block gives it (:mod:`evalkit.evals.lmeval.prefix_hits`); ``session`` None: the plain model."""
            from evalkit.evals.lmeval.prefix_hits import PrefixHits

            self._hits = PrefixHits(model, session)
            try:
                yield self
            finally:
                self.last_hits, self._hits = self._hits.hits, None

        def _model_generate(self, context, max_length, stop, **generation_kwargs):
            if self._hits is not None:
                from evalkit.evals.lmeval.prefix_hits import generate_with_hits

                tok = self.tokenizer
                pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
                parent = super()._model_generate
                return generate_with_hits(self._hits, parent, context, max_length, stop, pad, **generation_kwargs)
            if self._static is None:
                return super()._model_generate(context, max_length, stop, **generation_kwargs)
            import torch

            from evalkit.integration.static_decode import greedy_generate, sampling_warpers

            session, compiled = self._static
            settings = {k: v for k, v in generation_kwargs.items() if k != "attention_mask"}
            if settings.get("temperature") == 0.0 and not settings.get("do_sample"):  # as HFLM: greedy
                settings.pop("temperature")
                settings["do_sample"] = False
            warpers = sampling_warpers(self.model, **settings)  # None: greedy; other settings refused
            mask = generation_kwargs.get("attention_mask")
            mask = torch.ones_like(context) if mask is None else mask
            eos = self.model.generation_config.eos_token_id
            eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else (eos or [0])[0]
            new = max_length - context.shape[1]
            tokens = greedy_generate(session, self.model, context, mask, new, eos, pad, compiled, warpers=warpers)
            return torch.cat([context, tokens], dim=1)

        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs: int | None = None):
            if self.backend != "causal":
                return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
            out = [None] * len(requests)
            for lengths, idx in loglikelihood_calls(requests, self.max_length):
                self._lengths = lengths
                try:
                    res = super()._loglikelihood_tokens(
                        [requests[i] for i in idx], disable_tqdm=disable_tqdm, override_bs=override_bs
                    )
                finally:
                    self._lengths = None
                for i, r in zip(idx, res, strict=True):
                    out[i] = r
            return out

        _row_bytes = 0  # while probing on a static decode path: bytes each row holds beside the forward

        def _detect_batch_size(self, requests=None, pos: int = 0):
            saved, self._lengths = self._lengths, None  # its probe batches are unpadded rows of ones
            if self._static is not None:
                session, compiled = self._static
                self._row_bytes = static_row_bytes(self.model, session.binding.scheme, self.max_length, compiled)
            try:
                return super()._detect_batch_size(requests, pos)
            finally:
                self._lengths, self._row_bytes = saved, 0

        def _reserve(self, rows: int):
            """``rows`` static rows' bytes, held on the device while the probe's forward runs."""
            import torch

            return torch.empty(rows * self._row_bytes, dtype=torch.uint8, device=self.device)

        def _model_call(self, inps, attn_mask=None, labels=None):
            if self._row_bytes:  # lm-eval's batch-size probe on a static decode path
                held = self._reserve(inps.shape[0])
                try:
                    return super()._model_call(inps, attn_mask, labels)
                finally:
                    del held
            if self._lengths is None or attn_mask is not None or labels is not None or inps.shape[0] == 1:
                return super()._model_call(inps, attn_mask, labels)
            import torch

            lengths = padded_lengths(inps.tolist(), self._lengths)
            if all(n == inps.shape[1] for n in lengths):
                return super()._model_call(inps)
            n = torch.tensor(lengths, device=inps.device)
            mask = (torch.arange(inps.shape[1], device=inps.device)[None, :] < n[:, None]).long()
            with (
                torch.no_grad(),
                torch.autocast(
                    device_type=self.device.type,
                    dtype=self.mixed_precision_dtype,
                    enabled=self.mixed_precision_dtype is not None,
                ),
                rowwise_attention(self.model, lengths),
            ):
                return self.model(inps, attention_mask=mask).logits

        if quiet:  # lm-eval's evaluator cannot ask for quiet request loops

            def loglikelihood(self, requests, disable_tqdm: bool = False):
                return super().loglikelihood(requests, disable_tqdm=True)

            def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
                return super().loglikelihood_rolling(requests, disable_tqdm=True)

            def generate_until(self, requests, disable_tqdm: bool = False):
                return super().generate_until(requests, disable_tqdm=True)

    EvalkitHFLM.__name__ = EvalkitHFLM.__qualname__ = "QuietEvalkitHFLM" if quiet else "EvalkitHFLM"
    return EvalkitHFLM
