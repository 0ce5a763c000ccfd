"""Nothing lost silently: a run a crash cut off (a torn last line of results.jsonl) is named by the
store's reader from whatever of it can be read, every line leads with the keys that name its run,
and the run stays out of the done set, so the next sweep re-runs it."""

from __future__ import annotations

import json

import pytest

from evalkit.sweep.store import ResultStore, RunOutcome
from evalkit.sweep.store_records import IDENTITY_KEYS, read_records

RUN_A, RUN_B = "a" * 64, "b" * 64


def outcome(run_id: str, n: int, scheme: str = "fp8_e4m3/tensor/unit", payload: int = 2000) -> RunOutcome:
    spec = {"model": {"name": "tiny"}, "scheme": scheme, "eval": "perplexity", "params": {}}
    rows = [
        {"metric": f"m{i}", "value": float(i), "labels": {}, "info": {"pad": "x" * payload, "z": 1, "a": 2}}
        for i in range(n)
    ]
    return RunOutcome(run_id, spec, True, rows, info={"pad": "y" * payload})


def torn_store(tmp_path, keep) -> ResultStore:
    """Run A whole, then run B's single write cut after ``keep(bytes of B)`` bytes (SIGKILL mid-write)."""
    st = ResultStore(tmp_path / "store")
    st.append(outcome(RUN_A, 2, scheme="auto"))
    scratch = ResultStore(tmp_path / "scratch")
    scratch.append(outcome(RUN_B, 3))
    piece = scratch.results.read_bytes()
    with open(st.results, "ab") as fh:
        fh.write(piece[: keep(piece)])
    return st


def test_every_line_leads_with_the_keys_that_name_its_run(tmp_path):
    st = ResultStore(tmp_path)
    st.append(outcome(RUN_A, 1))
    for line in st.results.read_text().splitlines():
        rec = json.loads(line)
        assert list(rec)[: len([k for k in IDENTITY_KEYS if k in rec])] == [k for k in IDENTITY_KEYS if k in rec]
        assert list(rec["info"]) == sorted(rec["info"])  # nested objects stay sorted
        assert line.startswith('{"type": ')


@pytest.mark.parametrize(
    "keep",
    [
        lambda piece: 220,  # the first line torn after 220 bytes: only the fragment names the run
        lambda piece: piece.index(b"\n") + 300,  # the second metric row torn: the first names it too
        lambda piece: len(piece) - 60,  # the completion record torn: every metric row written
    ],
    ids=["first-line", "metric-row", "completion-record"],
)
def test_a_torn_last_line_names_the_run_it_cut_off(tmp_path, keep):
    st = torn_store(tmp_path, keep)
    rows = st.results.read_bytes().split(b"\n", 3)[-1].count(b"\n")  # B's lines written whole (after A's 3)
    view = read_records(st.results)
    assert set(view.complete) == {RUN_A} and view.torn_lines == 1
    assert view.torn[0].last and view.torn[0].line == len(st.results.read_bytes().split(b"\n"))
    (cut,) = view.cut_off
    assert (cut.run_id, cut.model, cut.scheme, cut.eval) == (RUN_B, "tiny", "fp8_e4m3/tensor/unit", "perplexity")
    assert cut.rows == rows and cut.last and cut.torn_line == view.torn[0].line
    assert cut.describe() == f"run {RUN_B[:16]} (tiny fp8_e4m3/tensor/unit perplexity)"
    # the re-run appends after a fresh newline and finishes the run: nothing is cut off any more
    st.append(outcome(RUN_B, 3))
    view = read_records(st.results)
    assert set(view.complete) == {RUN_A, RUN_B} and view.cut_off == [] and view.torn_lines == 1


def test_a_fragment_of_the_older_sorted_line_format_is_matched_by_its_attempt(tmp_path):
    """Stores written before the identity keys led (json sort_keys): a fragment holding only the attempt
    id and the eval still joins the rows of its attempt."""
    st = ResultStore(tmp_path)
    row = {"type": "metric", "run_id": RUN_B, "attempt": "f00d", "model": "tiny", "scheme": "auto", "eval": "decode"}
    whole = json.dumps({**row, "metric": "m", "value": 1.0, "labels": {}, "info": {}}, sort_keys=True)
    torn = json.dumps({**row, "metric": "n", "value": 2.0, "labels": {}, "info": {}}, sort_keys=True)[:40]
    assert '"attempt": "f00d"' in torn and RUN_B not in torn
    st.results.write_text(whole + "\n" + torn)
    (cut,) = read_records(st.results).cut_off
    assert (cut.run_id, cut.attempt, cut.rows, cut.torn_line, cut.last) == (RUN_B, "f00d", 1, 2, True)


def test_a_fragment_naming_nothing_is_still_reported(tmp_path):
    st = ResultStore(tmp_path)
    st.append(outcome(RUN_A, 1))
    with open(st.results, "ab") as fh:
        fh.write(b'{"typ')
    view = read_records(st.results)
    (cut,) = view.cut_off
    assert cut.run_id == "" and cut.last and "a run (attempt unreadable)" in cut.describe()


def test_a_failed_or_rerun_run_is_not_reported_as_cut_off(tmp_path):
    st = torn_store(tmp_path, lambda piece: len(piece) // 2)
    st.append(RunOutcome(RUN_B, outcome(RUN_B, 0).spec, False, error="boom"))
    view = read_records(st.results)
    assert set(view.failed) == {RUN_B} and view.cut_off == []


def test_the_sweep_reruns_the_run_a_torn_line_cut_off(tmp_path, tiny_llama_dir, toy_eval):
    """A real sweep, its last run's write then cut mid-line (as SIGKILL would): the next sweep says
    nothing is done twice and re-runs exactly that run."""
    from evalkit.sweep.executors import LocalExecutor
    from evalkit.sweep.grid import parse_grid
    from evalkit.sweep.runner import run_sweep

    grid_file = tmp_path / "g.yaml"
    grid_file.write_text(
        f"models: [{{name: '{tiny_llama_dir}'}}]\nschemes: [auto, fp8_e4m3/tensor/dynamic]\nevals: {{toy: {{}}}}\n"
    )
    grid = parse_grid(grid_file)
    store = ResultStore(tmp_path / "out")
    work = tmp_path / "work"
    first = run_sweep(grid, store, LocalExecutor(), workdir=work, progress=False)
    assert first.completed == 2 and not first.failures
    lines = store.results.read_bytes().split(b"\n")[:-1]
    last = json.loads(lines[-1])
    assert last["type"] == "complete"
    start = next(i for i, line in enumerate(lines) if json.loads(line)["run_id"] == last["run_id"])
    torn = b"\n".join(lines[:start]) + b"\n" + lines[start][:-8]  # its first metric row torn near its end
    store.results.write_bytes(torn)
    view = store.read()
    (cut,) = view.cut_off
    assert cut.run_id == last["run_id"] and cut.last and cut.scheme == last["scheme"] and cut.eval == "toy"
    second = run_sweep(grid, store, LocalExecutor(), workdir=work, progress=False)
    assert (second.skipped, second.completed, len(second.failures)) == (1, 1, 0)
    view = store.read()
    assert len(view.complete) == 2 and view.cut_off == [] and view.torn_lines == 1
