"""lm-eval plumbing: find tasks, wrap the loaded model once, run lm-eval's own evaluator per scheme.

evalkit never imitates an lm-eval task: it calls ``lm_eval.simple_evaluate`` on an ``HFLM`` that
wraps the model already in memory (built once per loaded model), with the KV scheme switched
around each call by :func:`evalkit.quantized_kv` (loglikelihood and ``generate_until`` alike).

* Tasks come from ``tasks/lmeval`` (evalkit's offline YAMLs, always indexed; the checkout's
  folder or the installed package's copy, see :mod:`evalkit.resources`) and, only when a
  requested name is not there, from lm-eval's built-in index (``include_defaults=True``; indexing
  its ~15k tasks takes tens of seconds, so it is built once per process).
* lm-eval's request cache is never used (``use_cache=None``): it keys on the request only and would
  hand every scheme the baseline's answers.
* Offline: when the Hugging Face hub cannot be reached, datasets run in offline mode during task
  loading (so cached datasets still work) and a task whose data is not cached fails at once with
  one line, instead of ~25 s of retries.
* Exact batching (:class:`EvalkitHFLM`). lm-eval right-pads loglikelihood batches with token id 0
  and calls the model without an attention mask, so padding would enter dynamic KV scales (tensor
  and head amax, block amax) and change the real tokens' log-likelihoods with the batch size. The
  subclass knows every row's true length: before lm-eval batches a set of requests it computes
  each request's model input exactly as lm-eval does (``(context + continuation)[-(max_length+1):][:-1]``)
  and keys it by its tokens without trailing zeros; in ``_model_call`` each row, stripped of its
  trailing zeros, finds its length there, and a padded batch is called with the attention mask
  that padding implies. The storage cache then leaves padding out of every scale (its
  ``Padding``), so every row's log-likelihoods equal its batch-size-1 values to float tolerance.
  Two inputs that differ only by trailing zeros (real token 0 at the end) would read alike: such
  requests go to separate lm-eval calls, so no call holds both. A batch without padding, batch
  size 1 included, is called exactly as lm-eval calls it (no mask): batch size 1 stays equal to
  ``lm_eval --batch_size 1`` to the last digit. Nothing is patched: it is a subclass, as lm-eval's
  own ``hf_steered`` adapter is. Generation (``generate_until``) is left-padded with a mask by
  lm-eval already; it is passed through unchanged.
* Default batch size from the device (:func:`default_batch_size`): ``auto`` on CUDA (lm-eval finds
  the largest batch that fits, from 64 down), :data:`CPU_BATCH_SIZE` on CPU
  (``benchmarks/bench_lmeval_batch.py`` measures the gain).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from evalkit.errors import EvalkitError
from evalkit.hub import hub_reachable
from evalkit.resources import resource_dir

TASKS_DIR = resource_dir("tasks") / "lmeval"
_NETWORK_ERRORS = ("ConnectionError", "OfflineModeIsEnabled", "LocalEntryNotFoundError", "DatasetNotFoundError")


def lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


def include_paths(extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    paths = [str(TASKS_DIR)] + [str(Path(p).resolve()) for p in extra]
    for p in paths:
        if not Path(p).is_dir():
            raise EvalkitError(f"lm-eval task folder {p} does not exist: pass an existing folder of task YAMLs")
    return paths


@lru_cache(maxsize=8)
def task_manager(paths: tuple[str, ...], include_defaults: bool, metadata_json: str = "{}"):
    """A TaskManager (cached per process: indexing lm-eval's built-ins takes tens of seconds).

    ``metadata`` reaches every task's config and its ``custom_dataset`` function, as the
    ``lm_eval`` command line does with ``--model_args`` (ruler, for one, reads ``pretrained``)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(paths), include_defaults=include_defaults,
                       metadata=json.loads(metadata_json) or None)


@dataclass(frozen=True)
class TaskSet:
    """Requested task names, the TaskManager that knows them, and those not defined by evalkit's own
    offline YAMLs (their data may need the network)."""

    names: tuple[str, ...]
    manager: Any
    external: tuple[str, ...]


def resolve_tasks(names: list[str], extra_paths: tuple[str, ...] = (), metadata: dict | None = None) -> TaskSet:
    """Find every name (evalkit's YAMLs and ``extra_paths`` first, lm-eval's built-ins only when needed).

    Unknown names raise EvalkitError listing the nearest known names.
    """
    paths = tuple(include_paths(extra_paths))
    ours = task_manager((str(TASKS_DIR),), False).all_tasks
    external = tuple(n for n in names if n not in ours)
    meta = json.dumps(metadata or {}, sort_keys=True)
    local = task_manager(paths, False, meta)
    if all(n in local.all_tasks for n in names):
        return TaskSet(tuple(names), local, external)
    full = task_manager(paths, True, meta)
    unknown = [n for n in names if n not in full.all_tasks]
    if unknown:
        parts = []
        for n in unknown:
            near = difflib.get_close_matches(n, full.all_tasks, n=5, cutoff=0.6)
            parts.append(f"{n!r} (nearest: {', '.join(near)})" if near else repr(n))
        raise EvalkitError(f"unknown lm-eval task {'; '.join(parts)}: see `lm_eval ls tasks` or the YAMLs in {TASKS_DIR}")
    return TaskSet(tuple(names), full, external)


@contextlib.contextmanager
def offline_datasets(enabled: bool):
    """Inside the block, ``datasets`` and ``huggingface_hub`` read only their local caches."""
    import datasets
    from huggingface_hub import constants

    if not enabled:
        yield
        return
    saved = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE, os.environ.get("HF_DATASETS_OFFLINE")
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved[0], saved[1]
        if saved[2] is None:
            os.environ.pop("HF_DATASETS_OFFLINE", None)
        else:
            os.environ["HF_DATASETS_OFFLINE"] = saved[2]


def _network_error(exc: BaseException) -> bool:
    while exc is not None:
        if type(exc).__name__ in _NETWORK_ERRORS or isinstance(exc, ConnectionError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@contextlib.contextmanager
def network_guard(tasks: TaskSet):
    """Offline mode when the hub is unreachable (checked only if a task outside evalkit's offline
    YAMLs is requested), and one clear line when a task's data cannot be fetched."""
    offline = bool(tasks.external) and not hub_reachable()
    try:
        with offline_datasets(offline):
            yield
    except Exception as exc:
        if _network_error(exc):
            where = ("the Hugging Face hub is unreachable (offline) and its data is not in the local datasets cache"
                     if offline else "its data could not be downloaded")
            raise EvalkitError(f"lm-eval task {', '.join(tasks.external or tasks.names)} needs the network: {where}; "
                               f"run it online once to fill the cache, or use the offline tasks in {TASKS_DIR}") from None
        raise


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
        raise EvalkitError(f"lmeval batch_size (--lmeval-batch-size) must be a whole number >= 1 or 'auto', got {value!r}")
    return int(text)


def make_hflm(model, tokenizer, batch_size: int | str | None = None):
    """lm-eval's HFLM around an already loaded model (no reload, no copy), batching exactly
    (:class:`EvalkitHFLM`); without its per-request progress bars when ``EVALKIT_PROGRESS=0``
    (``evalkit sweep --no-progress``). ``batch_size`` None: :func:`default_batch_size`."""
    batch_size = parse_batch_size(batch_size)
    if batch_size is None:
        batch_size = default_batch_size(next(model.parameters()).device)
    cls = _hflm_class(quiet=os.environ.get("EVALKIT_PROGRESS") == "0")
    return cls(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)


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
        inp = (list(context) + list(continuation))[-(max_length + 1):][:-1]
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
            mask = None if attention_mask is None else attention_mask[i:i + 1, ..., :n, :n]
            if mask is not None and skip_causal_mask:  # sdpa: a batch of one passes no mask for plain causal attention
                cache_key = (attention_mask.data_ptr(), i)
                if cache_key not in causal:
                    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
                    tril = torch.ones(n, n, dtype=torch.bool, device=mask.device).tril_()
                    causal[cache_key] = bool((allowed == tril).all())
                mask = None if causal[cache_key] else mask
            row, _ = inner(module, query[i:i + 1, :, :n], key[i:i + 1, :, :n], value[i:i + 1, :, :n], mask, **kwargs)
            if out is None:
                out = row.new_zeros(b, q_len, *row.shape[2:])
            out[i, :n] = row[0]
        return out, None

    return handler


@cache
def _hflm_class(quiet: bool):
    from lm_eval.models.huggingface import HFLM

    class EvalkitHFLM(HFLM):
        """HFLM that gives the model the attention mask lm-eval's right padding implies (see the
        module docstring), so batched log-likelihoods equal batch size 1's under every scheme."""

        _lengths: dict | None = None  # {stripped input: length} of the requests being scored

        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs: int | None = None):
            if self.backend != "causal":
                return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
            out = [None] * len(requests)
            for lengths, idx in loglikelihood_calls(requests, self.max_length):
                self._lengths = lengths
                try:
                    res = super()._loglikelihood_tokens([requests[i] for i in idx], disable_tqdm=disable_tqdm,
                                                        override_bs=override_bs)
                finally:
                    self._lengths = None
                for i, r in zip(idx, res, strict=True):
                    out[i] = r
            return out

        def _detect_batch_size(self, requests=None, pos: int = 0):
            saved, self._lengths = self._lengths, None  # its probe batches are unpadded rows of ones
            try:
                return super()._detect_batch_size(requests, pos)
            finally:
                self._lengths = saved

        def _model_call(self, inps, attn_mask=None, labels=None):
            if self._lengths is None or attn_mask is not None or labels is not None or inps.shape[0] == 1:
                return super()._model_call(inps, attn_mask, labels)
            import torch

            lengths = padded_lengths(inps.tolist(), self._lengths)
            if all(n == inps.shape[1] for n in lengths):
                return super()._model_call(inps)
            n = torch.tensor(lengths, device=inps.device)
            mask = (torch.arange(inps.shape[1], device=inps.device)[None, :] < n[:, None]).long()
            with torch.no_grad(), torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                                                 enabled=self.mixed_precision_dtype is not None), \
                    rowwise_attention(self.model, lengths):
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


@contextlib.contextmanager
def _without_env_report():
    """Skip lm-eval's environment report (``add_env_info``: torch's collect_env, which shells out
    to pip and takes ~10 s per call; it is not a metric). Scoped to one call and restored after.
    evalkit records the library versions that decide the numbers in every row instead."""
    import lm_eval.evaluator as evaluator

    if not hasattr(evaluator, "add_env_info"):
        yield
        return
    original = evaluator.add_env_info
    evaluator.add_env_info = lambda results: None
    try:
        yield
    finally:
        evaluator.add_env_info = original


LOGGERS = ("lm_eval", "lm-eval")  # lm-eval's modules log under lm_eval.*; some task utils use "lm-eval"
LOG_NAME = "lmeval.log"


def run_lm_eval(hflm, tasks: TaskSet, *, num_fewshot: int | None, limit: int | None,
                bootstrap_iters: int = 100000) -> dict[str, Any]:
    """One call of lm-eval's evaluator with per-item samples logged and no request cache.

    Inside a sweep run (:func:`evalkit.runlog.run_folder`), lm-eval's log records (task-config
    warnings and all), its progress bars and any other stderr output of the call go to
    ``lmeval.log`` in the run's folder instead of the terminal; otherwise lm-eval logs warnings only."""
    import lm_eval

    from evalkit.runlog import current_log, to_log

    log = current_log(LOG_NAME)
    with network_guard(tasks), _without_env_report(), to_log(log, LOGGERS, f"lm-eval {', '.join(tasks.names)}"):
        results = lm_eval.simple_evaluate(
            model=hflm, tasks=list(tasks.names), num_fewshot=num_fewshot, limit=limit, task_manager=tasks.manager,
            log_samples=True, use_cache=None, cache_requests=False, bootstrap_iters=bootstrap_iters,
            verbosity=None if log else "WARNING")  # None: lm-eval leaves the logging set-up to_log made alone
    if results is None:
        raise EvalkitError("lm-eval returned no results (non-zero rank?): run evalkit in a single process")
    return results
