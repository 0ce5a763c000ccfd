"""The published llama.cpp table reproduces: the ``llamacpp`` block (docs/llamacpp.md) is `report` of the committed
store ``published/llamacpp``, the store is the grid ``sweeps/llamacpp.yaml`` (every scheme on the
emulation and on llama.cpp) from this tree's code with nothing failed, and re-running a perplexity run
on each side gives the stored rows.

Made by ``python -m evalkit sweep llamacpp --out published/llamacpp`` (llama-cpp-python installed) and
rendered by ``python -m evalkit report published/llamacpp --format md``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.doc_blocks import doc_block
from tests.report.test_published import FOREIGN_TOLERANCE, _agrees, check_store_is_its_grid, report_md, store_records

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "published" / "llamacpp"
SPEC_KEYS = ("model", "scheme", "eval", "params", "engine")


def records() -> list[dict]:
    return store_records(STORE)


def test_readme_llamacpp_block_is_the_report_of_the_committed_store():
    assert doc_block("llamacpp").strip() == report_md(STORE), (
        "regenerate: python -m evalkit report published/llamacpp --format md"
    )


def test_store_holds_the_grid_on_both_engines_from_the_current_code():
    recs = check_store_is_its_grid(STORE, "llamacpp", SPEC_KEYS)
    backends = {r["info"].get("backend") for r in recs if r["type"] == "metric"}
    assert "emulation" in backends and any(b.startswith("llama-cpp-python") for b in backends if b)


def test_every_cache_type_is_in_the_store_on_both_engines():
    from evalkit.engines.llamacpp.cache_types import CACHE_TYPES

    recs = records()
    engine_of = {r["run_id"]: r["spec"].get("engine", "emulation") for r in recs if r["type"] == "complete"}
    metrics = [r for r in recs if r["type"] == "metric" and r["eval"] == "perplexity"]
    for engine in ("emulation", "llamacpp"):
        schemes = {r["scheme"] for r in metrics if engine_of[r["run_id"]] == engine}
        types = {t for s in schemes if s.startswith("llamacpp:") for t in s.split(":", 1)[1].split("/")}
        assert set(CACHE_TYPES) - {"f32"} <= types, (engine, sorted(set(CACHE_TYPES) - types))


@pytest.mark.slow
def test_rerunning_a_perplexity_run_on_each_engine_gives_the_stored_rows(tmp_path):
    """llamacpp:q4_0 on the emulation and on llama.cpp, recomputed here: equal to the stored rows (bit for
    bit on the store's platform; elsewhere within check_reruns' foreign tolerance: q4_0 flips codes where
    another CPU rounds a float differently, 1.5e-4 relative in ppl measured between AMD and Intel)."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is in the test extras: pip install -e '.[test]'")
    from evalkit.evals.backend import use_backend
    from evalkit.evals.base import get_eval
    from evalkit.kv.scheme import parse_scheme
    from evalkit.models.loading import load_model
    from evalkit.runtime.numerics import platform_record, same_platform
    from evalkit.sweep.runner import _use_engine

    recs = records()
    runs = [r for r in recs if r["type"] == "complete" and r["spec"]["eval"] == "perplexity"]
    lm = load_model("embedded", dtype="float32")
    for engine in ("emulation", "llamacpp"):
        done = next(
            r for r in runs if r["spec"]["scheme"] == "llamacpp:q4_0" and r["spec"].get("engine", "emulation") == engine
        )
        ev = get_eval("perplexity")(done["spec"]["params"])
        if engine == "emulation":
            use_backend(ev, None)
        else:
            _use_engine(ev, engine, lm, done["spec"].get("engine_options"))
        ev.prepare(lm, tmp_path)
        fresh = {
            (r.metric, json.dumps(r.labels, sort_keys=True)): r.value
            for r in ev.evaluate(lm, parse_scheme("llamacpp:q4_0"))
        }
        stored = {
            (r["metric"], json.dumps(r["labels"], sort_keys=True)): r["value"]
            for r in recs
            if r["type"] == "metric" and r["run_id"] == done["run_id"]
        }
        assert fresh.keys() == stored.keys()
        exact = same_platform(done["info"].get("platform", {}), platform_record())
        for key, value in stored.items():
            if exact:
                assert fresh[key] == value or (value != value and fresh[key] != fresh[key]), (engine, key)
            elif key[0] in FOREIGN_TOLERANCE:  # another CPU: within the float spread check_reruns allows
                assert _agrees(key[0], fresh[key], value, False), (engine, key, fresh[key], value)


def test_lmeval_rows_are_on_both_engines_and_llamacpps_come_from_llamacpp():
    """lm-eval (evalkit_mmlu4's loglikelihoods, evalkit_passkey's greedy generations) for every scheme on
    the emulation and through llama.cpp in process, one request at a time."""
    recs = records()
    engine_of = {r["run_id"]: r["spec"].get("engine", "emulation") for r in recs if r["type"] == "complete"}
    rows = [r for r in recs if r["type"] == "metric" and r["eval"] == "lmeval"]
    schemes = {r["scheme"] for r in recs if r["type"] == "metric" and r["eval"] == "perplexity"}
    for engine in ("emulation", "llamacpp"):
        mine = [r for r in rows if engine_of[r["run_id"]] == engine]
        for metric in ("evalkit_mmlu4/acc", "evalkit_mmlu4/flip_rate", "evalkit_passkey/exact_match"):
            assert {r["scheme"] for r in mine if r["metric"] == metric} == schemes, (engine, metric)
    engine_rows = [r for r in rows if engine_of[r["run_id"]] == "llamacpp"]
    assert all(r["info"]["backend"].startswith("llama-cpp-python") for r in engine_rows)
    assert all(r["info"]["batch_size"] == 1 for r in engine_rows if "batch_size" in r["info"])
