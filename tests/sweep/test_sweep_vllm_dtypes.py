"""sweeps/vllm-dtypes.yaml: it parses, every scheme resolves and applies to the embedded model, it holds
every vLLM kv_cache_dtype that applies to that model, and its analytic estimate is under 30 minutes
(no timing here: a fixed speed, calibrated on the default grid's measured run times)."""

from __future__ import annotations

import pytest

from evalkit.errors import SchemeError
from evalkit.kv.codec import check_layout
from evalkit.kv.codecs.vllm.dtypes import VLLM_DTYPES, Status
from evalkit.kv.codecs.vllm.family import vllm_scheme
from evalkit.kv.scheme import parse_scheme
from evalkit.sweep.estimate import estimate_sweep
from evalkit.sweep.grid import parse_grid, resolve_grid

EMBEDDED = dict(is_mla=False, head_dims=(64, 64))  # SmolLM2-135M: GQA, head_dim 64 for K and V
# The default grid's measured seconds of runs per eval (docs/performance.md: "default sweep (52 runs)",
# 767.2 s of runs at load ~2 on this 2-core machine), the yardstick for the analytic estimate.
DEFAULT_MEASURED_S = {"decode": 421.0, "retrieval": 136.0, "perplexity": 111.0, "lmeval": 98.0}
LIMIT_S = 30 * 60


@pytest.fixture(scope="module")
def grid():
    return parse_grid(resolve_grid("vllm-dtypes"))


def test_grid_parses_with_every_eval_and_the_contrast_rows(grid):
    assert grid.name == "vllm-dtypes"
    assert {r.model.name for r in grid.runs} == {"embedded"}
    assert {r.eval for r in grid.runs} == {"perplexity", "decode", "retrieval", "lmeval"}
    schemes = list(dict.fromkeys(r.scheme for r in grid.runs))
    assert schemes[0] == "auto" and len(grid.runs) == 4 * len(schemes)
    # vllm:fp8 / fp8_e4m3 / fp8_e5m2 are evalkit's per-tensor unit rows, which the grid lists by their own names
    for name in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        assert str(vllm_scheme(name)) in schemes, name
    assert "fp8_e4m3/tensor/dynamic" in schemes


def test_every_scheme_resolves_and_applies_to_the_embedded_model(grid):
    for text in dict.fromkeys(r.scheme for r in grid.runs):
        check_layout(parse_scheme(text), **EMBEDDED)  # raises SchemeError if vLLM would not run it here


def test_every_applicable_vllm_dtype_is_in_the_grid(grid):
    schemes = {str(parse_scheme(r.scheme)) for r in grid.runs}
    applicable, refused = set(), set()
    for name, d in VLLM_DTYPES.items():
        if d.status is not Status.MODELLED:
            continue
        scheme = vllm_scheme(name)
        try:
            check_layout(scheme, **EMBEDDED)
        except SchemeError:
            refused.add(name)
            continue
        applicable.add(name)
        assert str(scheme) in schemes, name
    assert refused == {"fp8_ds_mla", "nvfp4_ds_mla"}  # MLA rows only
    assert len(applicable) == 16  # the 3 per-tensor FP8 dtypes, 10 new ones of 0.32 and 0.33's 3 Octave caches


def test_analytic_estimate_is_under_30_minutes(grid, tmp_path):
    """Each eval's analytic estimate, scaled by the default grid's measured / estimated time for that eval
    (the estimate's speed is fixed, so nothing is timed and the load does not matter)."""
    from evalkit.sweep import throughput as T

    speed = T.Speed(30e9, 10e9, 0.002, 2.0, "probe", "fixed for the test")

    def by_eval(g) -> dict[str, float]:
        est = estimate_sweep(g, g.runs, tmp_path / "o", tmp_path / "c", speed_for=lambda spec, facts, speeds: speed)
        assert all(r.seconds is not None for r in est.runs)
        out: dict[str, float] = {}
        for r in est.runs:
            out[r.eval] = out.get(r.eval, 0.0) + r.seconds
        return out

    default = by_eval(parse_grid(resolve_grid("default")))
    mine = by_eval(grid)
    scaled = {e: mine[e] * DEFAULT_MEASURED_S[e] / default[e] for e in mine}
    total = sum(scaled.values())
    assert total < LIMIT_S, {e: round(s) for e, s in scaled.items()}
    assert scaled["decode"] > 0.5 * total  # most of its time goes where TurboQuant/UltraQuant are measured


def test_grid_names_no_scheme_twice(grid):
    canonical = [str(parse_scheme(s)) for s in grid.data["schemes"]]
    assert len(canonical) == len(set(canonical)) == 18
