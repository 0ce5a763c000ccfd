"""`sweep --grow`: a store follows its grid when the grid only gained runs, keeping every finished run
byte for byte; a grid that drops a run or changes one (a new run id) is refused in one line."""

from __future__ import annotations

import json

from evalkit.cli import main
from evalkit.sweep.grid import parse_grid
from evalkit.sweep.grow import check_growable
from evalkit.sweep.store import ResultStore

from tests.sweep.test_sweep_run import make_grid

FIRST = ["auto", "fp8_e4m3/tensor/dynamic"]
GROWN = [*FIRST, "fp8_e5m2/tensor/unit"]


def _sweep(grid, out, cache, *extra) -> int:
    return main(["sweep", str(grid), "--out", str(out), "--no-progress", "--cache-dir", str(cache), *extra])


def test_grow_keeps_finished_runs_and_records_the_growth(tmp_path, tiny_llama_dir, toy_eval, capsys):
    out, cache = tmp_path / "out", tmp_path / "cache"
    first = make_grid(tmp_path, tiny_llama_dir, schemes=FIRST, name="first.yaml")
    assert _sweep(first, out, cache) == 0
    before_results = (out / "results.jsonl").read_bytes()
    before_spec = json.loads((out / "spec.json").read_text())
    capsys.readouterr()

    grown = make_grid(tmp_path, tiny_llama_dir, schemes=GROWN, name="grown.yaml")
    assert _sweep(grown, out, cache) == 2  # without --grow: refused, and the line names the flag
    err = capsys.readouterr().err
    assert "belongs to a different grid" in err and "add --grow" in err
    assert (out / "results.jsonl").read_bytes() == before_results

    assert _sweep(grown, out, cache, "--grow") == 0
    printed = capsys.readouterr().out
    assert f"grew {out} from 2 to 3 runs" in printed
    assert "3 runs, 2 already done, 1 completed now, 0 failed" in printed
    after = (out / "results.jsonl").read_bytes()
    assert after.startswith(before_results)  # the finished runs' lines, untouched; the new run appended
    spec = json.loads((out / "spec.json").read_text())
    grid = parse_grid(grown)
    assert spec["grid_identity"] == grid.identity != before_spec["grid_identity"]
    assert spec["runs"] == 3 and spec["created"] == before_spec["created"]
    assert [(g["from_identity"], g["from_runs"]) for g in spec["grown"]] == [(before_spec["grid_identity"], 2)]
    assert (out / "grid.yaml").read_text() == grown.read_text()
    view = ResultStore(out).read()
    assert set(view.complete) == {r.run_id for r in grid.runs}

    # the same grid again: nothing to grow, nothing run, the spec unchanged
    assert _sweep(grown, out, cache, "--grow") == 0
    printed = capsys.readouterr().out
    assert "grew" not in printed and "3 already done, 0 completed now" in printed
    assert json.loads((out / "spec.json").read_text()) == spec


def test_grow_refuses_a_grid_that_drops_or_changes_runs(tmp_path, tiny_llama_dir, toy_eval, capsys):
    out, cache = tmp_path / "out", tmp_path / "cache"
    assert _sweep(make_grid(tmp_path, tiny_llama_dir, schemes=FIRST, name="first.yaml"), out, cache) == 0
    spec_before = (out / "spec.json").read_bytes()
    capsys.readouterr()
    dropped = make_grid(tmp_path, tiny_llama_dir, schemes=["auto"], name="dropped.yaml")
    assert _sweep(dropped, out, cache, "--grow") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--grow:" in err[0] and "holds 1 finished run(s) that grid 'tinygrid' lacks" in err[0]
    assert "fp8_e4m3/tensor/dynamic" in err[0]
    # other parameters: every run has a new id, so none of the finished ones may be kept
    changed = make_grid(tmp_path, tiny_llama_dir, extra=", seed: 3", schemes=GROWN, name="changed.yaml")
    assert _sweep(changed, out, cache, "--grow") == 2
    assert "holds 2 finished run(s)" in capsys.readouterr().err
    assert (out / "spec.json").read_bytes() == spec_before  # nothing rewritten by a refused growth


def test_check_growable_keeps_vouched_runs(tmp_path, tiny_llama_dir, toy_eval):
    """Runs outside the grid that the caller vouches for (``--resolve``'s stage runs) do not refuse a growth;
    a new store and the store's own grid need none."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    first = make_grid(tmp_path, tiny_llama_dir, schemes=FIRST, name="first.yaml")
    store = ResultStore(out)
    assert check_growable(store, parse_grid(first)) is False  # no store yet
    assert _sweep(first, out, cache) == 0
    assert check_growable(store, parse_grid(first)) is False  # its own grid
    dropped = parse_grid(make_grid(tmp_path, tiny_llama_dir, schemes=["auto"], name="dropped.yaml"))
    extra = set(store.read().complete) - {r.run_id for r in dropped.runs}
    assert len(extra) == 1
    assert check_growable(store, dropped, vouched=extra) is True
