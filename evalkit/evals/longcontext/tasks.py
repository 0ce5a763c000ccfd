"""Which long-context tasks exist, where their data comes from, and loading them once per model.

Real tasks are lm-eval's own: RULER's 13 (group ``ruler``; lengths from the ``max_seq_lengths``
metadata) and LongBench v2's 20 (group ``longbench2``). Their data is made or fetched when lm-eval
builds the task: RULER generates its items with the model's tokenizer (and lm-eval's ``ruler`` extra:
``wonderwords``, ``nltk``), reading Paul Graham's essays (``baber/paul_graham_essays`` on the hub) for
its essay haystacks and SQuAD v2 / HotpotQA for its QA tasks (cached once on disk and read from there:
:mod:`evalkit.evals.longcontext.ruler_data`, which also stops an offline run lacking NLTK's ``punkt_tab``
in one line); LongBench v2 reads
``recursal/longbench-v2`` from the hub. :data:`DATA_SOURCES` says which for each, so that a task
whose data is neither cached here nor reachable fails with one line naming it and how to get it.

Offline stand-ins live in ``tasks/longcontext`` (:data:`STANDINS`: stand-in -> the real task it stands
in for): lm-eval YAMLs with the real prompts and metrics over a few shipped items. LongBench v2 runs two
ways: lm-eval's log-likelihood ``longbench2`` (and ``longctx_longbench2``), and its authors' protocol
``longbench2_published`` / ``longbench2_published_cot`` (hub data) with their stand-ins
(:data:`PUBLISHED_STANDINS`), named, not run by default.
"""

from __future__ import annotations

import json
import warnings

from evalkit.data.resources import resource_dir
from evalkit.errors import EvalkitError

TASKS_DIR = resource_dir("tasks") / "longcontext"

STANDINS = {
    "longctx_ruler_niah_single_1": "niah_single_1",
    "longctx_ruler_vt": "ruler_vt",
    "longctx_longbench2": "longbench2",
}
DEFAULT_TASKS = tuple(STANDINS)
# LongBench v2 in its authors' protocol (generation, chat template, middle truncation; with and without chain of
# thought: evalkit.evals.longcontext.longbench2), asked for by name beside the log-likelihood variants above
PUBLISHED_STANDINS = {
    "longctx_longbench2_published": "longbench2_published",
    "longctx_longbench2_published_cot": "longbench2_published_cot",
}
OFFLINE = (*STANDINS, *PUBLISHED_STANDINS)

RULER_TASKS = (
    "niah_single_1",
    "niah_single_2",
    "niah_single_3",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multiquery",
    "niah_multivalue",
    "ruler_vt",
    "ruler_cwe",
    "ruler_fwe",
    "ruler_qa_squad",
    "ruler_qa_hotpot",
)
_ESSAYS = "Paul Graham's essays (hub dataset baber/paul_graham_essays)"
_TOKENIZER = "the model's tokenizer (a local folder, or its hub id cached here)"
DATA_SOURCES = {
    **{t: f"items it generates with {_TOKENIZER} (lm_eval[ruler]: wonderwords, nltk)" for t in RULER_TASKS},
    **{
        t: f"{_ESSAYS} and {_TOKENIZER}"
        for t in ("niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multiquery", "niah_multivalue")
    },
    "ruler_qa_squad": "SQuAD v2 dev (cached once in evalkit's cache, ruler_data.py) and the model's tokenizer",
    "ruler_qa_hotpot": "HotpotQA dev, distractor (cached once in evalkit's cache, ruler_data.py) and the model's tokenizer",
    "longbench2": "the hub dataset recursal/longbench-v2 (~465 MB)",
    "longbench2_published": "the hub dataset THUDM/LongBench-v2 (~465 MB)",
    "longbench2_published_cot": "the hub dataset THUDM/LongBench-v2 (~465 MB)",
}


def data_source(task: str) -> str:
    if task in DATA_SOURCES:
        return DATA_SOURCES[task]
    if task.startswith("longbench2"):
        return DATA_SOURCES["longbench2"]
    return "its lm-eval dataset"


def _missing_extra(exc: BaseException) -> str | None:
    while exc is not None:
        if isinstance(exc, ImportError) and getattr(exc, "name", None) in ("wonderwords", "nltk"):
            return exc.name
        if isinstance(exc, ImportError) and "wonderwords" in str(exc):
            return "wonderwords"
        exc = exc.__cause__ or exc.__context__
    return None


def load_tasks(taskset, names: list[str]) -> dict:
    """lm-eval's ``TaskManager.load`` of ``names`` (data made or read once), one name at a time so that a
    failure names its task; ``{"tasks": leaf name -> Task, "groups": group -> members, "members": asked-for
    name -> its leaf names}``: EvalkitError in one line when lm-eval's RULER extra is missing or the data is
    neither cached here nor reachable."""
    from evalkit.evals.lmeval.adapter import LOGGERS, network_guard
    from evalkit.evals.longcontext.ruler_data import MissingRulerData, check_punkt
    from evalkit.runtime.runlog import current_log, to_log

    check_punkt(names)
    tasks: dict = {}
    groups: dict = {}
    members: dict = {}
    for name in names:
        try:
            with network_guard(taskset), warnings.catch_warnings(), to_log(current_log("lmeval.log"), LOGGERS):
                warnings.simplefilter("ignore", DeprecationWarning)
                loaded = taskset.manager.load([name])
        except MissingRulerData:
            raise
        except EvalkitError as exc:
            raise EvalkitError(
                f"longcontext task {name} needs {data_source(name)}: it is neither in the local Hugging Face "
                "cache nor reachable; run it once online (HF_HUB_OFFLINE unset) to fill the cache, or use the "
                f"offline stand-ins {', '.join(STANDINS)} ({TASKS_DIR})"
            ) from exc
        except Exception as exc:
            if "offline stand-in" in str(exc):  # tasks/longcontext/utils.py: a length it holds no items at
                raise EvalkitError(f"longcontext {exc}: give those lengths or leave lengths unset") from None
            extra = _missing_extra(exc)
            if extra is None:
                raise
            raise EvalkitError(
                f"longcontext task {name} needs lm-eval's RULER extra ({extra} is not installed): "
                "pip install 'lm_eval[ruler]' (wonderwords, nltk), or use the offline stand-ins "
                f"{', '.join(STANDINS)}"
            ) from None
        tasks.update(loaded["tasks"])
        members[name] = list(loaded["tasks"])
        groups.update(loaded["group_map"])
        if name not in loaded["tasks"] and name not in loaded["group_map"]:  # a tag: its tasks form the group
            groups[name] = list(loaded["tasks"])
    return {"tasks": tasks, "groups": groups, "members": members}


def resolve(names: list[str], include: tuple[str, ...], metadata: dict | None = None):
    """The lmeval adapter's :class:`~evalkit.evals.lmeval.adapter.TaskSet` with ``tasks/longcontext`` on the
    include path; the stand-ins count as offline (no hub probe for them)."""
    from evalkit.evals.lmeval.adapter import TaskSet, resolve_tasks

    found = resolve_tasks(list(names), (str(TASKS_DIR), *include), metadata)
    from evalkit.evals.longcontext.ruler_data import offline_ready

    external = tuple(n for n in found.external if n not in OFFLINE and not offline_ready(n))
    return TaskSet(found.names, found.manager, external)


def to_json(obj):
    from lm_eval.utils import handle_non_serializable

    return json.loads(json.dumps(obj, default=handle_non_serializable))
