"""RULER's QA sources read from evalkit's disk cache: lm-eval's own parse and items, no network once cached,
and one line naming the fetch command when a source or NLTK's punkt_tab is missing offline."""

from __future__ import annotations

import json
import uuid

import pytest

from evalkit.errors import EvalkitError
from evalkit.evals.longcontext import ruler_data

QUESTIONS = 500  # lm-eval's RULER QA generator makes 500 samples per length and reads that many questions


def squad_json(n: int = QUESTIONS) -> dict:
    """SQuAD v2-shaped: articles of paragraphs, each with answerable and impossible questions."""
    articles = []
    for a in range(n // 10):
        paragraphs = []
        for p in range(5):
            i = a * 5 + p
            qas = [
                {
                    "question": f"What colour is item {i}-{j}?",
                    "answers": [{"text": f"c{i}x{j}"}],
                    "is_impossible": False,
                }
                for j in range(2)
            ]
            qas.append({"question": f"Who wrote {i}?", "answers": [], "is_impossible": True})
            paragraphs.append({"context": f"Item {i}-0 is c{i}x0 and item {i}-1 is c{i}x1.", "qas": qas})
        articles.append({"title": f"a{a}", "paragraphs": paragraphs})
    return {"version": "v2.0", "data": articles}


def hotpot_json(n: int = QUESTIONS) -> list:
    """HotpotQA-shaped: each question with its (title, sentences) context, shared titles across questions."""
    return [
        {
            "question": f"Where was person {i} born?",
            "answer": f"town{i}",
            "context": [[f"Person {i}", [f"Person {i} was born ", f"in town{i}."]], [f"Town {i % 7}", ["A town."]]],
        }
        for i in range(n)
    ]


@pytest.fixture
def ruler_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALKIT_CACHE", str(tmp_path / "cache"))
    folder = ruler_data.cache_folder()
    folder.mkdir(parents=True)
    (folder / ruler_data.SOURCES["squad"].file).write_text(json.dumps(squad_json()))
    (folder / ruler_data.SOURCES["hotpotqa"].file).write_text(json.dumps(hotpot_json()))
    return folder


@pytest.mark.parametrize("name", ["squad", "hotpotqa"])
def test_the_readers_give_lm_evals_questions_and_documents(name, monkeypatch):
    from lm_eval.tasks.ruler import qa_utils

    data = squad_json() if name == "squad" else hotpot_json()
    monkeypatch.setattr(qa_utils, "download_json", lambda url: data)  # lm-eval's parse of the same JSON
    theirs = getattr(qa_utils, ruler_data.SOURCES[name].reader)(url=f"test://{uuid.uuid4()}")
    assert ruler_data.READERS[name](data) == theirs
    assert len(theirs[0]) == QUESTIONS


def test_the_urls_are_lm_evals_own():
    assert ruler_data.SOURCES["squad"].url.endswith("dev-v2.0.json")
    assert ruler_data.SOURCES["hotpotqa"].url.endswith("hotpot_dev_distractor_v1.json")


def test_an_offline_ruler_qa_run_with_the_sources_cached_touches_no_network(
    ruler_cache, network_lookups, tiny_tokenizer_dir
):
    from evalkit.evals.longcontext.tasks import load_tasks, resolve

    names = ["ruler_qa_squad", "ruler_qa_hotpot"]
    taskset = resolve(names, (), {"pretrained": str(tiny_tokenizer_dir), "max_seq_lengths": [384]})
    assert taskset.external == ()  # cached: no hub probe either
    loaded = load_tasks(taskset, names)["tasks"]
    assert network_lookups == []
    squad = loaded["ruler_qa_squad"]
    assert squad.config.custom_dataset.__module__.endswith("ruler_qa")  # evalkit's YAML took the name
    docs = list(squad.test_docs())
    assert len(docs) == QUESTIONS and all(d["max_length"] == 384 and d["length"] <= 384 for d in docs)
    first = docs[0]
    assert first["outputs"] == ["c0x0"] and "Item 0-0 is c0x0" in first["input"]
    hotpot = list(loaded["ruler_qa_hotpot"].test_docs())
    assert hotpot[3]["outputs"] == ["town3"] and "Person 3 was born in town3." in hotpot[3]["input"]


def test_a_missing_source_offline_stops_in_one_line_naming_the_fetch(tmp_path, monkeypatch, network_lookups):
    import evalkit.models.hub as hub

    monkeypatch.setenv("EVALKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(hub, "offline_mode", lambda: True)
    with pytest.raises(EvalkitError) as err:
        ruler_data.load_source("squad")
    msg = str(err.value)
    assert "\n" not in msg and ruler_data.FETCH_COMMAND in msg and "SQuAD v2 dev" in msg
    assert network_lookups == []  # offline mode: not even tried
    monkeypatch.setattr(hub, "offline_mode", lambda: False)
    with pytest.raises(EvalkitError, match="download failed") as err:
        ruler_data.load_source("hotpotqa")  # online but the network refuses: the same line, after one try
    assert "\n" not in str(err.value) and ruler_data.FETCH_COMMAND in str(err.value)
    assert len(network_lookups) == 1 and not any(tmp_path.rglob("*.json"))


def test_a_missing_punkt_tab_offline_stops_needle_tasks_only(monkeypatch, network_lookups):
    import nltk

    import evalkit.models.hub as hub

    def not_found(resource, *args, **kwargs):
        raise LookupError(resource)

    monkeypatch.setattr(nltk.data, "find", not_found)
    monkeypatch.setattr(hub, "offline_mode", lambda: True)
    ruler_data.check_punkt(["ruler_qa_squad", "ruler_vt"])  # these do not read punkt_tab
    with pytest.raises(EvalkitError) as err:
        ruler_data.check_punkt(["niah_single_1", "ruler_qa_squad"])
    assert "\n" not in str(err.value) and ruler_data.PUNKT_COMMAND in str(err.value)
    assert network_lookups == []


def test_evalkits_qa_yamls_replace_lm_evals_inside_the_ruler_group_and_its_tag():
    from lm_eval.tasks import TaskManager

    from evalkit.evals.longcontext.tasks import RULER_TASKS, TASKS_DIR

    index = TaskManager(include_path=str(TASKS_DIR), include_defaults=True).task_index
    for task in ruler_data.QA_TASKS:
        assert str(index[task].yaml_path) == str(TASKS_DIR / f"{task}.yaml")
    # the tag lm-eval's RULER tasks carry still lists all 13 (a tag declared again would replace the list)
    assert set(index["longcxt"].tags) == set(RULER_TASKS)
