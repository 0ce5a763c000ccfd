"""lm-eval plumbing: find tasks, wrap the loaded model once, run lm-eval's own evaluator per scheme.

evalkit never imitates an lm-eval task: it calls ``lm_eval.simple_evaluate`` on an ``HFLM`` that
wraps the model already in memory (built once per loaded model), with the KV scheme switched
around each call by :func:`evalkit.quantized_kv` (loglikelihood and ``generate_until`` alike).

* Tasks come from ``tasks/lmeval`` (evalkit's offline YAMLs, always indexed; the checkout's
  folder or the installed package's copy, see :mod:`evalkit.data.resources`) and, only when a
  requested name is not there, from lm-eval's built-in index (``include_defaults=True``; indexing
  its ~15k tasks takes tens of seconds, so it is built once per process).
* lm-eval's request cache is never used (``use_cache=None``): it keys on the request only and would
  hand every scheme the baseline's answers.
* Offline: when the Hugging Face hub cannot be reached, datasets run in offline mode during task
  loading (so cached datasets still work) and a task whose data is not cached fails at once with
  one line, instead of the hub client's retries.
* Batching is exact (:mod:`evalkit.evals.lmeval.batching`): any ``--lmeval-batch-size`` gives each item
  its batch-size-1 log-likelihoods under every scheme; the default comes from the device.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from evalkit.data.resources import resource_dir
from evalkit.errors import EvalkitError
from evalkit.models.hub import hub_reachable

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

    return TaskManager(
        include_path=list(paths), include_defaults=include_defaults, metadata=json.loads(metadata_json) or None
    )


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
        raise EvalkitError(
            f"unknown lm-eval task {'; '.join(parts)}: see `lm_eval ls tasks` or the YAMLs in {TASKS_DIR}"
        )
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
            where = (
                "the Hugging Face hub is unreachable (offline) and its data is not in the local datasets cache"
                if offline
                else "its data could not be downloaded"
            )
            raise EvalkitError(
                f"lm-eval task {', '.join(tasks.external or tasks.names)} needs the network: {where}; "
                f"run it online once to fill the cache, or use the offline tasks in {TASKS_DIR}"
            ) from None
        raise


def make_hflm(model, tokenizer, batch_size: int | str | None = None):
    """lm-eval's HFLM around an already loaded model (no reload, no copy), batching exactly
    (:mod:`evalkit.evals.lmeval.batching`); without its per-request progress bars when ``EVALKIT_PROGRESS=0``
    (``evalkit sweep --no-progress``). ``batch_size`` None: the device default (``default_batch_size``)."""
    from evalkit.evals.lmeval.batching import default_batch_size, hflm_class, parse_batch_size

    batch_size = parse_batch_size(batch_size)
    if batch_size is None:
        batch_size = default_batch_size(next(model.parameters()).device)
    cls = hflm_class(quiet=os.environ.get("EVALKIT_PROGRESS") == "0")
    from evalkit.runtime.runlog import current_log, to_log

    with to_log(current_log(LOG_NAME), LOGGERS, "lm-eval model"):  # its warnings about an in-memory `pretrained`
        return cls(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)


@contextlib.contextmanager
def _without_env_report():
    """Skip lm-eval's environment report (``add_env_info``: torch's collect_env, which shells out
    to pip, slowly; it is not a metric). Scoped to one call and restored after.
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


def run_lm_eval(
    hflm,
    tasks: TaskSet,
    *,
    num_fewshot: int | None,
    limit: int | None,
    bootstrap_iters: int = 100000,
    loaded: list | None = None,
    samples: dict[str, list[int]] | None = None,
    **options,
) -> dict[str, Any]:
    """One call of lm-eval's evaluator with per-item samples logged and no request cache; ``options``:
    more of ``simple_evaluate``'s arguments (the generation evaluation's chat template, ``gen_kwargs``, seeds).

    ``loaded``: lm-eval Task objects built once (run instead of ``tasks.names``, which then only name
    them in messages); ``samples``: lm-eval's per-task document indices (instead of ``limit``).

    Inside a sweep run (:func:`evalkit.runtime.runlog.run_folder`), lm-eval's log records (task-config
    warnings and all), its progress bars and any other stderr output of the call go to
    ``lmeval.log`` in the run's folder instead of the terminal; otherwise lm-eval logs warnings only."""
    import lm_eval

    from evalkit.runtime.runlog import current_log, to_log

    log = current_log(LOG_NAME)
    with network_guard(tasks), _without_env_report(), to_log(log, LOGGERS, f"lm-eval {', '.join(tasks.names)}"):
        results = lm_eval.simple_evaluate(
            model=hflm,
            tasks=list(loaded) if loaded is not None else list(tasks.names),
            num_fewshot=num_fewshot,
            limit=limit,
            samples=samples,
            task_manager=tasks.manager,
            log_samples=True,
            use_cache=None,
            cache_requests=False,
            bootstrap_iters=bootstrap_iters,
            verbosity=None if log else "WARNING",
            **options,
        )  # None: lm-eval leaves the logging set-up to_log made alone
    if results is None:
        raise EvalkitError("lm-eval returned no results (non-zero rank?): run evalkit in a single process")
    return results
