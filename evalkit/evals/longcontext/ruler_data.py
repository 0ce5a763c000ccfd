"""RULER's offline data: its QA sources cached once on disk, and NLTK's ``punkt_tab`` checked before a run.

lm-eval's RULER QA tasks (``ruler_qa_squad``, ``ruler_qa_hotpot``; ``lm_eval/tasks/ruler/qa_utils.py``)
download SQuAD v2 dev and HotpotQA dev (distractor) with ``requests`` every time the task is built: no
disk cache, so on a machine without network they fail. evalkit ships two task YAMLs of the same names in
``tasks/longcontext`` (the include path takes precedence over lm-eval's built-ins, so the ``ruler`` group
picks them too) whose loaders read the JSON from evalkit's cache folder
(``$EVALKIT_CACHE/ruler``, :func:`source_path`) and then make the items with lm-eval's own code
(``qa_utils.get_dataset`` with the model's tokenizer): the same items as lm-eval's download, parsed as
:func:`read_squad` / :func:`read_hotpotqa` (lm-eval's ``read_squad``/``read_hotpotqa`` over a file; a test
holds them equal). The URLs are lm-eval's own defaults, read from its installed functions.

A source not cached is downloaded once into the cache (written to a temporary file and renamed, so a
partial download is never read) unless offline mode is set (``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE``);
offline or unreachable, the run stops in one line naming the file and the command that fetches it:
``python -m evalkit.evals.longcontext.ruler_data`` (both sources and ``punkt_tab``, once, online).

RULER's needle tasks (``niah_*``: ``prepare_niah.py``) need NLTK's ``punkt_tab`` data and download it at
import when it is missing; :func:`check_punkt` stops an offline run first, in one line.
"""

from __future__ import annotations

import inspect
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from evalkit.errors import EvalkitError

FETCH_COMMAND = "python -m evalkit.evals.longcontext.ruler_data"
PUNKT_COMMAND = "python -m nltk.downloader punkt_tab"


@dataclass(frozen=True)
class Source:
    task: str  # the lm-eval task that reads it
    what: str  # what it is, for people
    reader: str  # lm-eval's function in qa_utils whose ``url`` default names it
    file: str  # its name in the cache folder

    @property
    def url(self) -> str:
        """lm-eval's own URL for it (the default of its reader's ``url`` argument)."""
        from lm_eval.tasks.ruler import qa_utils

        return inspect.signature(getattr(qa_utils, self.reader)).parameters["url"].default


SOURCES = {
    "squad": Source("ruler_qa_squad", "SQuAD v2 dev", "read_squad", "squad-dev-v2.0.json"),
    "hotpotqa": Source(
        "ruler_qa_hotpot", "HotpotQA dev (distractor)", "read_hotpotqa", "hotpot_dev_distractor_v1.json"
    ),
}
QA_TASKS = {s.task: name for name, s in SOURCES.items()}
NIAH_PREFIX = "niah_"  # RULER's tasks that import prepare_niah (punkt_tab); the group "ruler" holds them


def cache_folder() -> Path:
    from evalkit.models.loading import cache_root

    return cache_root() / "ruler"


def source_path(name: str) -> Path:
    return cache_folder() / SOURCES[name].file


def is_cached(name: str) -> bool:
    return source_path(name).is_file()


def _offline() -> bool:
    """Offline mode set by the user (``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE``), as evalkit's hub probe reads it."""
    from evalkit.models.hub import offline_mode

    return offline_mode()


class MissingRulerData(EvalkitError):
    """A RULER source or NLTK's punkt_tab is not here and cannot be fetched: the line names the command."""


def _missing(name: str, why: str) -> EvalkitError:
    s = SOURCES[name]
    return MissingRulerData(
        f"RULER's {s.task} needs {s.what} ({s.url}), not cached at {source_path(name)} ({why}): "
        f"fetch it once online with `{FETCH_COMMAND}`, or copy that file there"
    )


def fetch(name: str, timeout: float = 60.0) -> Path:
    """Download source ``name`` into the cache (temporary file, then renamed); its path."""
    import requests

    path = source_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    response = requests.get(SOURCES[name].url, timeout=timeout)
    response.raise_for_status()
    json.loads(response.content)  # a JSON document, or nothing is written
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(response.content)
    tmp.replace(path)
    return path


def load_source(name: str):
    """The parsed JSON of source ``name``: from the cache, downloaded into it first when online."""
    if not is_cached(name):
        if _offline():
            raise _missing(name, "offline mode is set")
        try:
            fetch(name)
        except Exception as exc:  # requests' connection errors, HTTP errors, a non-JSON answer
            raise _missing(name, f"download failed: {type(exc).__name__}") from None
    with open(source_path(name), encoding="utf-8") as f:
        return json.load(f)


def read_squad(data: dict) -> tuple[list[dict], list[str]]:
    """(questions, documents) from SQuAD v2's JSON, as lm-eval's ``qa_utils.read_squad`` makes them."""
    docs = sorted({p["context"] for d in data["data"] for p in d["paragraphs"]})
    index = {c: i for i, c in enumerate(docs)}
    qas = []
    for d in data["data"]:
        more = [index[p["context"]] for p in d["paragraphs"]]
        for p in d["paragraphs"]:
            own = index[p["context"]]
            for qa in p["qas"]:
                if not qa["is_impossible"]:
                    qas.append(
                        {
                            "query": qa["question"],
                            "outputs": [a["text"] for a in qa["answers"]],
                            "context": [own],
                            "more_context": [i for i in more if i != own],
                        }
                    )
    return qas, docs


def read_hotpotqa(data: list) -> tuple[list[dict], list[str]]:
    """(questions, documents) from HotpotQA's JSON, as lm-eval's ``qa_utils.read_hotpotqa`` makes them."""
    docs = sorted({f"{t}\n{''.join(p)}" for d in data for t, p in d["context"]})
    index = {c: i for i, c in enumerate(docs)}
    qas = [
        {
            "query": d["question"],
            "outputs": [d["answer"]],
            "context": [index[f"{t}\n{''.join(p)}"] for t, p in d["context"]],
        }
        for d in data
    ]
    return qas, docs


READERS = {"squad": read_squad, "hotpotqa": read_hotpotqa}


def qa_dataset(name: str, **kwargs):
    """lm-eval's ``get_qa_dataset`` over the cached source: ``{"test": Dataset}`` at every length of
    ``max_seq_lengths`` (lm-eval's RULER metadata), the items made by lm-eval's ``get_dataset``."""
    import itertools

    import datasets
    from lm_eval.tasks.ruler import qa_utils
    from lm_eval.tasks.ruler.common_utils import DEFAULT_SEQ_LENGTHS, get_tokenizer, resolve_tokenizer_name

    tokenizer = get_tokenizer(resolve_tokenizer_name(kwargs))
    qas, docs = READERS[name](load_source(name))
    lengths = kwargs.pop("max_seq_lengths", DEFAULT_SEQ_LENGTHS)
    items = itertools.chain.from_iterable(
        qa_utils.get_dataset(tokenizer=tokenizer, docs=docs, qas=qas, max_seq_length=n) for n in lengths
    )
    return {"test": datasets.Dataset.from_list(list(items), split=datasets.Split.TEST)}


def punkt_available() -> bool:
    try:
        import nltk
    except ImportError:
        return True  # the missing extra is reported by its own line (lm_eval[ruler])
    try:
        nltk.data.find("tokenizers/punkt_tab")
    except LookupError:
        return False
    return True


def check_punkt(tasks) -> None:
    """EvalkitError in one line when a RULER needle task is asked for offline without NLTK's punkt_tab
    (lm-eval's prepare_niah would try to download it at import)."""
    needle = sorted(t for t in tasks if t.startswith(NIAH_PREFIX) or t == "ruler")
    if needle and not punkt_available() and (_offline() or not _reachable("raw.githubusercontent.com")):
        import importlib.util

        extra = (
            "" if importlib.util.find_spec("wonderwords") else "pip install 'lm_eval[ruler]' (wonderwords, nltk), then "
        )
        raise MissingRulerData(
            f"RULER's {', '.join(needle)} needs NLTK's punkt_tab tokenizer data, which is not installed and "
            f"cannot be downloaded here: {extra}run `{PUNKT_COMMAND}` once online (or set NLTK_DATA to a folder "
            "holding it)"
        )


def _reachable(host: str, timeout: float = 3.0) -> bool:
    import socket

    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def offline_ready(task: str) -> bool:
    """Whether ``task`` reads only local data here (a RULER QA task whose source is cached)."""
    return task in QA_TASKS and is_cached(QA_TASKS[task])


def main(argv: list[str] | None = None) -> int:
    """Fetch both QA sources into the cache and NLTK's punkt_tab (once, online)."""
    import argparse

    parser = argparse.ArgumentParser(prog=FETCH_COMMAND, description=main.__doc__)
    parser.parse_args(argv)
    for name, s in SOURCES.items():
        where = source_path(name) if is_cached(name) else fetch(name)
        print(f"{s.what}: {where}")
    if not punkt_available():
        import nltk

        if not nltk.download("punkt_tab", quiet=True):
            print(f"punkt_tab could not be downloaded: run `{PUNKT_COMMAND}`", file=sys.stderr)
            return 1
    print("NLTK punkt_tab: installed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
