"""The results store: one write per run with the completion record last, torn tails ignored and
isolated, latest attempt wins, two concurrent writer processes never tear or interleave lines,
and a folder of another grid is refused without being touched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalkit.sweep.grid import GridError, parse_grid
from evalkit.sweep.store import ResultStore, RunOutcome, merge_stores
from evalkit.sweep.store_records import read_records


def outcome(run_id: str, n: int, value: float = 1.0, ok: bool = True, payload: int = 0) -> RunOutcome:
    spec = {"model": {"name": "m"}, "scheme": "auto", "eval": "toy", "params": {}}
    rows = [
        {
            "metric": f"m{i}",
            "value": value + i,
            "ci_low": None,
            "ci_high": None,
            "labels": {"i": i},
            "info": {"pad": "x" * payload},
        }
        for i in range(n)
    ]
    return RunOutcome(run_id, spec, ok, rows if ok else [], error=None if ok else "RuntimeError: boom")


def test_roundtrip_and_counting_rules(tmp_path):
    st = ResultStore(tmp_path)
    st.append(outcome("a", 3, 1.0))
    st.append(outcome("b", 2, 5.0, ok=False))
    view = st.read()
    assert set(view.complete) == {"a"} and set(view.failed) == {"b"}
    assert [r["value"] for r in view.rows] == [1.0, 2.0, 3.0]
    lines = st.results.read_text().splitlines()
    kinds = [json.loads(line)["type"] for line in lines]
    assert kinds == ["metric", "metric", "metric", "complete", "failed"]  # completion record last
    # rows of an attempt without a completion record (a crash) do not count
    with open(st.results, "a") as fh:
        fh.write(json.dumps({"type": "metric", "run_id": "c", "attempt": "x", "metric": "m", "value": 9}) + "\n")
    view = st.read()
    assert "c" not in view.complete and view.uncounted_rows == 1 and len(view.rows) == 3
    # a rerun: the latest attempt's rows are the ones that count
    st.append(outcome("a", 3, 10.0))
    view = st.read()
    assert sorted(r["value"] for r in view.rows) == [10.0, 11.0, 12.0] and view.uncounted_rows == 4
    # a failed run that later succeeds counts
    st.append(outcome("b", 1, 7.0))
    assert set(st.read().complete) == {"a", "b"} and not st.read().failed


def test_torn_tail_is_ignored_and_isolated(tmp_path):
    st = ResultStore(tmp_path)
    st.append(outcome("a", 2))
    full = st.results.read_bytes()
    # simulate SIGKILL in the middle of the next run's single write: half of its bytes reached the file
    other = ResultStore(tmp_path / "scratch")
    other.append(outcome("b", 2, 3.0))
    piece = other.results.read_bytes()
    st.results.write_bytes(full + piece[: len(piece) // 2])
    view = st.read()
    assert set(view.complete) == {"a"} and view.torn_lines == 1 and len(view.rows) == 2
    st.append(outcome("b", 2, 3.0))  # the rerun appends after a fresh newline
    view = st.read()
    assert set(view.complete) == {"a", "b"} and view.torn_lines == 1
    assert st.results.read_bytes().startswith(full + piece[: len(piece) // 2] + b"\n")
    assert sorted(r["value"] for r in view.rows if r["run_id"] == "b") == [3.0, 4.0]


WRITER = """
import os, sys, time
from evalkit.sweep.store import ResultStore, RunOutcome
folder, tag, go = sys.argv[1], sys.argv[2], sys.argv[3]
st = ResultStore(folder)
open(go + "." + tag, "w").close()  # ready: imports done
spec = {"model": {"name": "m"}, "scheme": "auto", "eval": "toy", "params": {}}
while not os.path.exists(go):
    time.sleep(0.01)
for i in range(40):
    rows = [{"metric": f"m{j}", "value": float(i), "labels": {}, "info": {"pad": tag * 8000}} for j in range(12)]
    st.append(RunOutcome(f"{tag}-{i}", spec, True, rows))
"""


def test_two_writer_processes_no_torn_lines(tmp_path):
    """Two processes append at the same time (rows of ~8 KB: one run is several pipe buffers)."""
    import subprocess
    import sys
    import time

    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), tag, str(go)]) for tag in ("p", "q")]
    deadline = time.time() + 180
    while not all((tmp_path / f"go.{t}").exists() for t in "pq") and time.time() < deadline:
        time.sleep(0.05)
    go.write_text("")
    for p in procs:
        assert p.wait(180) == 0
    raw = (tmp_path / "results.jsonl").read_bytes()
    assert raw.endswith(b"\n")
    records = [json.loads(line) for line in raw.split(b"\n")[:-1]]  # every line is whole JSON
    assert len(records) == 2 * 40 * 13
    # each run's 12 rows and its completion record are contiguous: never interleaved
    for start in range(0, len(records), 13):
        block = records[start : start + 13]
        assert len({r["run_id"] for r in block}) == 1 and block[-1]["type"] == "complete"
        assert all(r["info"]["pad"] == block[0]["run_id"][0] * 8000 for r in block[:-1])
    view = read_records(tmp_path / "results.jsonl")
    assert len(view.complete) == 80 and view.torn_lines == 0 and view.uncounted_rows == 0
    # both writers contributed all their runs (the start barrier makes them overlap when the OS
    # schedules both; whether their runs alternate in the file depends on the scheduler, not the store)
    tags = [r["run_id"][0] for r in records if r["type"] == "complete"]
    assert tags.count("p") == 40 and tags.count("q") == 40


GRID = "models: [m]\nschemes: [auto]\nevals: {toy: {max_tokens: %d}}\n"


def test_foreign_folder_refused_untouched(tmp_path, toy_eval):
    (tmp_path / "a.yaml").write_text(GRID % 8)
    (tmp_path / "b.yaml").write_text(GRID % 9)
    a, b = parse_grid(tmp_path / "a.yaml"), parse_grid(tmp_path / "b.yaml")
    st = ResultStore(tmp_path / "out")
    st.claim(a, (tmp_path / "a.yaml").read_text())
    st.append(outcome("a", 2))
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir() if p.is_file()}
    with pytest.raises(GridError, match="belongs to a different grid"):
        ResultStore(tmp_path / "out").claim(b)
    after = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir() if p.is_file()}
    assert after == before
    st.claim(a)  # the same grid is welcome
    assert json.loads((tmp_path / "out" / "spec.json").read_text())["grid_identity"] == a.identity
    assert (tmp_path / "out" / "grid.yaml").read_text() == GRID % 8
    # a results file without spec: not ours
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "results.jsonl").write_text("{}\n")
    with pytest.raises(GridError, match="no spec.json"):
        ResultStore(tmp_path / "x").claim(a)


def test_merge_refuses_mixed_grids(tmp_path, toy_eval):
    (tmp_path / "a.yaml").write_text(GRID % 8)
    (tmp_path / "b.yaml").write_text(GRID % 9)
    ResultStore(tmp_path / "s0").claim(parse_grid(tmp_path / "a.yaml"))
    ResultStore(tmp_path / "s1").claim(parse_grid(tmp_path / "b.yaml"))
    with pytest.raises(GridError, match="different grids"):
        merge_stores(tmp_path / "m", [tmp_path / "s0", tmp_path / "s1"])
    assert not (tmp_path / "m").exists()
    with pytest.raises(GridError, match="not a sweep folder"):
        merge_stores(tmp_path / "m", [tmp_path / "s0", Path(tmp_path / "nothing")])
