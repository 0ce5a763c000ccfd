"""The published engine table reproduces: the engine block (docs/engines.md) is `report` of the committed store
``published/engine``, the store is the engine grid (``sweeps/engine.yaml``: every run through evalkit's
emulation and through vLLM, the serving eval through vLLM only) from one code identity with nothing
failed, and the engine's measured capacity agrees with evalkit's count.

Made in the vLLM environment (docs/install.md) by ``python -m evalkit sweep engine --out published/engine``
and rendered by ``python -m evalkit report published/engine --format md`` (no vLLM needed to read it).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.doc_blocks import doc_block
from tests.report.store_code import stale_runs
from tests.report.test_published import report_md

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "published" / "engine"
SPEC_KEYS = ("model", "scheme", "eval", "params", "engine")


def records() -> list[dict]:
    return [json.loads(line) for line in (STORE / "results.jsonl").read_text().splitlines() if line.strip()]


def test_readme_engine_block_is_the_report_of_the_committed_store():
    published = doc_block("engine").strip()
    assert published == report_md(STORE), "regenerate: python -m evalkit report published/engine --format md"


def test_store_holds_the_engine_grid_from_one_code_identity():
    """Every run of the engine grid completed once (emulation and vLLM; serving on vLLM only), nothing
    failed, all rows from one code identity, and each row says which backend computed it."""
    from evalkit.sweep.grid import canonical_json, parse_grid

    recs = records()
    complete = [r for r in recs if r["type"] == "complete"]
    grid = parse_grid(ROOT / "sweeps" / "engine.yaml")
    key = lambda d: canonical_json({k: d.get(k, "emulation") for k in SPEC_KEYS})  # noqa: E731
    assert sorted(key(r["spec"]) for r in complete) == sorted(key(run.to_dict()) for run in grid.runs), (
        "the store is not the engine grid: rerun the sweep into published/engine"
    )
    assert {r.engine for r in grid.runs} == {"emulation", "vllm"}
    assert {r.engine for r in grid.runs if r.eval == "serving"} == {"vllm"}
    assert not [r for r in recs if r["type"] == "failed"]
    assert not stale_runs(complete), stale_runs(complete)[:5]
    engine_runs = {r["run_id"] for r in complete if r["spec"].get("engine") == "vllm"}
    for r in recs:
        if r["type"] == "metric":
            backend = r["info"]["backend"]
            assert backend.startswith("vllm") if r["run_id"] in engine_runs else backend == "emulation", backend


def test_engine_capacity_matches_evalkits_count():
    """The done-when figure: bf16 against fp8_e4m3, the capacity multiplier from vLLM's allocator
    (its KV tokens in one budget) is within 1 % of evalkit's computed one (bytes per token); and the
    engine stores exactly evalkit's bytes per token for both (the grid's model is bfloat16)."""
    rows = {
        (r["scheme"], r["metric"]): r["value"] for r in records() if r["type"] == "metric" and r["eval"] == "serving"
    }
    fp8 = next(s for s, m in rows if s.startswith("fp8_e4m3/tensor/unit"))
    engine = rows[(fp8, "kv_tokens")] / rows[("auto", "kv_tokens")]
    computed = rows[("auto", "computed_bytes_per_token")] / rows[(fp8, "computed_bytes_per_token")]
    assert computed == 2.0 and abs(engine / computed - 1) <= 0.01, (engine, computed)
    for scheme in ("auto", fp8):
        assert rows[(scheme, "engine_bytes_per_token")] == rows[(scheme, "computed_bytes_per_token")]
        assert abs(rows[(scheme, "capacity_ratio_vs_computed")] - 1) <= 0.01


def test_store_rows_come_from_the_current_code():
    """The engine store's code identity equals this tree's (evalkit.sweep.code_identity), and its
    vLLM runs name the engine distribution and version that computed them (part of their run ids)."""
    complete = [r for r in records() if r["type"] == "complete"]
    stale = stale_runs(complete)
    assert not stale, (
        f"published/engine has runs computed by other code than this tree's ({stale[:3]}): re-make them in the vLLM "
        "environment (python -m evalkit sweep engine --out published/engine) and its report"
    )
    engines = {r["info"]["versions"].get("engine_package") for r in complete if r["spec"].get("engine") == "vllm"}
    assert len(engines) == 1 and str(next(iter(engines))).startswith("vllm"), engines
