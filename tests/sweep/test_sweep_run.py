"""Running sweeps end to end on a tiny model with the test-only toy eval: numbers equal a direct
computation, a model is loaded once and its eval prepared once, resume / --rerun, failures
recorded while the sweep goes on, shards merged equal the unsharded sweep, a SIGKILLed sweep
resumes to every run exactly once, and the Ray executor equals the local one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from evalkit.cli import main
from evalkit.sweep.store import ResultStore

from tests.toy_eval import SUBPROCESS_MAIN, token_ids, toy_metrics

REPO = Path(__file__).resolve().parents[2]
SCHEMES = ["auto", "fp8_e4m3/tensor/dynamic", "fp8_e4m3/head/dynamic", "fp8_e5m2/tensor/unit", "int4/group16/dynamic"]


def make_grid(tmp_path: Path, model_dir, extra: str = "", schemes=SCHEMES, name="g.yaml") -> Path:
    text = (
        f"name: tinygrid\nmodels:\n  - {{name: '{model_dir}'}}\nschemes:\n"
        + "".join(f"  - '{s}'\n" for s in schemes)
        + f"evals:\n  toy: {{max_tokens: 16{extra}}}\n"
    )
    path = tmp_path / name
    path.write_text(text)
    return path


def values(folder: Path) -> dict:
    """{(run_id, metric, labels): (value, ci_low, ci_high)} of the counted rows."""
    view = ResultStore(folder).read()
    return {
        (r["run_id"], r["metric"], json.dumps(r["labels"], sort_keys=True)): (r["value"], r["ci_low"], r["ci_high"])
        for r in view.rows
    }


def test_local_sweep_numbers_loads_once_resume_rerun(tmp_path, tiny_llama_dir, toy_eval, monkeypatch, capsys):
    import evalkit.models.loading as models
    from evalkit.integration.install import quantized_kv

    loads = []
    real = models.load_model
    monkeypatch.setattr(models, "load_model", lambda *a, **k: loads.append(a) or real(*a, **k))
    grid = make_grid(tmp_path, tiny_llama_dir)
    out = tmp_path / "out"
    argv = ["sweep", str(grid), "--out", str(out), "--no-progress", "--cache-dir", str(tmp_path / "cache")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert f"results: {out / 'results.jsonl'}" in printed and "5 completed now, 0 failed" in printed
    assert len(loads) == 1 and toy_eval.prepare_calls == [str(tiny_llama_dir)]
    view = ResultStore(out).read()
    assert len(view.complete) == 5 and len(view.rows) == 5 * 4 and not view.failed
    # every number equals a direct computation with the hook
    lm = real(str(tiny_llama_dir))
    ids = token_ids(lm.tokenizer, toy_eval.validate({})["text"], 16)
    with torch.no_grad():
        base = lm.model(ids).logits
    for rec in view.complete.values():
        with torch.no_grad(), quantized_kv(lm.model, rec["scheme"]):
            m = toy_metrics(base, lm.model(ids).logits, ids)
        rows = {(r["metric"], r["labels"].get("half")): r for r in view.rows if r["run_id"] == rec["run_id"]}
        assert rows[("nll", None)]["value"] == pytest.approx(float(m["nll"].mean()), rel=1e-6)
        assert rows[("kl", None)]["value"] == pytest.approx(float(m["kl"].mean()), rel=1e-4, abs=1e-9)
        assert rows[("nll", "first")]["scheme"] == rec["scheme"] and rows[("nll", "first")]["model"] == str(
            tiny_llama_dir
        )
        assert (
            rec["info"]["cpu_seconds"] >= 0
            and rec["info"]["config_hash"]
            and rec["info"]["versions"]["torch"] == torch.__version__
        )
        assert rec["spec"]["scheme"] == rec["scheme"] and rec["rows"] == 4
        art = json.loads((out / "runs" / rec["run_id"][:16] / "toy.json").read_text())
        assert art == {"scheme": rec["scheme"], "nll": rows[("nll", None)]["value"]}
        if rec["scheme"] == "auto":
            assert rows[("kl", None)]["value"] == 0.0
        else:
            assert rows[("kl", None)]["value"] > 0
    # the same command again skips every finished run; --rerun runs them again, same numbers
    first = values(out)
    assert main(argv) == 0
    assert "5 already done, 0 completed now" in capsys.readouterr().out
    assert main(argv + ["--rerun"]) == 0
    assert "0 already done, 5 completed now" in capsys.readouterr().out
    assert values(out) == first
    assert ResultStore(out).read().uncounted_rows == 20  # the first attempts' rows, superseded


def test_failures_recorded_sweep_continues(tmp_path, tiny_llama_dir, toy_eval, capsys):
    grid = make_grid(tmp_path, tiny_llama_dir, extra=", fail_schemes: ['fp8_e4m3/head/dynamic']")
    out = tmp_path / "out"
    argv = ["sweep", str(grid), "--out", str(out), "--no-progress"]
    assert main(argv) == 1
    printed = capsys.readouterr().out
    assert "4 completed now, 1 failed" in printed
    assert (
        "FAILED" in printed
        and "fp8_e4m3/head/dynamic toy: RuntimeError: toy failure for fp8_e4m3/head/dynamic" in printed
    )
    view = ResultStore(out).read()
    assert len(view.complete) == 4 and len(view.failed) == 1
    failed = next(iter(view.failed.values()))
    assert failed["scheme"] == "fp8_e4m3/head/dynamic" and "Traceback" in failed["traceback"]
    # a rerun retries only the failed run (still failing here)
    assert main(argv) == 1
    assert "4 already done, 0 completed now, 1 failed" in capsys.readouterr().out


def test_model_load_failure_fails_its_runs_only(tmp_path, tiny_llama_dir, toy_eval, capsys):
    # a folder that exists (the grid's validation checks that) but holds no model: it fails at load
    broken = tmp_path / "not-a-model"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    text = (
        f"models:\n  - '{broken}'\n  - '{tiny_llama_dir}'\nschemes: [auto, fp8_e4m3/tensor/dynamic]\n"
        "evals: {toy: {max_tokens: 8}}\n"
    )
    (tmp_path / "g.yaml").write_text(text)
    assert main(["sweep", str(tmp_path / "g.yaml"), "--out", str(tmp_path / "o"), "--no-progress"]) == 1
    printed = capsys.readouterr().out
    assert "2 completed now, 2 failed" in printed and "not-a-model" in printed


def test_shards_merged_equal_unsharded(tmp_path, tiny_llama_dir, toy_eval, capsys):
    grid = make_grid(tmp_path, tiny_llama_dir)
    common = ["--no-progress", "--cache-dir", str(tmp_path / "cache")]
    assert main(["sweep", str(grid), "--out", str(tmp_path / "full")] + common) == 0
    assert main(["sweep", str(grid), "--shard", "0/2", "--out", str(tmp_path / "s0")] + common) == 0
    assert main(["sweep", str(grid), "--shard", "1/2", "--out", str(tmp_path / "s1")] + common) == 0
    n0, n1 = (len(ResultStore(tmp_path / s).read().complete) for s in ("s0", "s1"))
    assert n0 + n1 == 5 and min(n0, n1) >= 2
    assert main(["merge", str(tmp_path / "merged"), str(tmp_path / "s0"), str(tmp_path / "s1")]) == 0
    assert "5 runs complete" in capsys.readouterr().out
    full, merged = values(tmp_path / "full"), values(tmp_path / "merged")
    assert full == merged and len(full) == 20
    assert set(ResultStore(tmp_path / "full").read().complete) == set(ResultStore(tmp_path / "merged").read().complete)
    assert (tmp_path / "merged" / "spec.json").read_text() == (tmp_path / "s0" / "spec.json").read_text()
    assert len(list((tmp_path / "merged" / "runs").iterdir())) == 5  # artifacts came along
    # merging again adds nothing; the merged folder also refuses another grid's sweep
    assert main(["merge", str(tmp_path / "merged"), str(tmp_path / "s0"), str(tmp_path / "s1")]) == 0
    assert "0 runs added, 5 already present" in capsys.readouterr().out
    other = make_grid(tmp_path, tiny_llama_dir, schemes=["auto"], name="other.yaml")
    before = (tmp_path / "merged" / "results.jsonl").read_bytes()
    assert main(["sweep", str(other), "--out", str(tmp_path / "merged"), "--no-progress"]) == 2
    assert "belongs to a different grid" in capsys.readouterr().err
    assert (tmp_path / "merged" / "results.jsonl").read_bytes() == before


@pytest.mark.slow
def test_sigkill_mid_run_then_resume(tmp_path, tiny_llama_dir):
    """A real sweep process is SIGKILLed while its third run is executing; rerun; every run
    ends up in the store exactly once and no partial rows count."""
    markers = tmp_path / "markers"
    grid = make_grid(tmp_path, tiny_llama_dir, extra=f", sleep: 1.0, marker_dir: '{markers}'")
    out = tmp_path / "out"
    cmd = [sys.executable, "-c", SUBPROCESS_MAIN, "sweep", str(grid), "--out", str(out), "--no-progress"]
    env = {**os.environ, "EVALKIT_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while len(list(markers.glob("start-*"))) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert len(list(markers.glob("start-*"))) == 3, proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    view = ResultStore(out).read()
    assert len(view.complete) == 2 and view.torn_lines == 0  # two finished; the third never counted
    rerun = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "2 already done, 3 completed now, 0 failed" in rerun.stdout
    lines = (out / "results.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]  # no partial line anywhere
    completes = [r["run_id"] for r in records if r["type"] == "complete"]
    assert len(completes) == len(set(completes)) == 5  # every run exactly once
    assert sum(r["type"] == "metric" for r in records) == 5 * 4
    view = ResultStore(out).read()
    assert len(view.rows) == 20 and view.uncounted_rows == 0 and view.torn_lines == 0
    assert {r["scheme"] for r in view.complete.values()} == set(SCHEMES)


@pytest.mark.slow
def test_ray_executor_equals_local(tmp_path, tiny_llama_dir, toy_eval):
    pytest.importorskip("ray")
    from evalkit.sweep.executors import LocalExecutor, RayExecutor
    from evalkit.sweep.grid import parse_grid
    from evalkit.sweep.runner import run_sweep

    # two model groups (the same folder, dtype given or not) on a 1-CPU cluster: the second actor
    # can only start once the first is released
    text = (
        f"models:\n  - '{tiny_llama_dir}'\n  - {{name: '{tiny_llama_dir}', dtype: float32}}\n"
        "schemes: [auto, fp8_e4m3/head/dynamic]\nevals: {toy: {max_tokens: 16}}\n"
    )
    (tmp_path / "g.yaml").write_text(text)
    grid = parse_grid(tmp_path / "g.yaml")
    local = run_sweep(grid, ResultStore(tmp_path / "local"), LocalExecutor(), progress=False, workdir=tmp_path / "c1")
    remote = run_sweep(
        grid, ResultStore(tmp_path / "ray"), RayExecutor(num_cpus=1), progress=False, workdir=tmp_path / "c2"
    )
    assert local.completed == remote.completed == 4 and not remote.failures
    # The numbers, run by run (keyed by what was run: a run id also hashes the code identity, which each Ray
    # worker computes from the files when it starts; in a working tree edited meanwhile its runs get new ids)
    assert by_spec(tmp_path / "local") == by_spec(tmp_path / "ray")
    assert len(by_spec(tmp_path / "ray")) == 16
    ids = {folder: run_ids(tmp_path / folder) for folder in ("local", "ray")}
    for spec, (run_id, code) in ids["ray"].items():  # the same id exactly where the same code computed it
        assert (run_id == ids["local"][spec][0]) == (code == ids["local"][spec][1]), spec
    for run_id in ResultStore(tmp_path / "ray").read().complete:  # artifacts came back from the worker
        assert (tmp_path / "ray" / "runs" / run_id[:16] / "toy.json").is_file()


def _spec_key(rec: dict) -> str:
    spec = rec["spec"]
    return json.dumps({k: spec[k] for k in ("model", "scheme", "eval", "params")}, sort_keys=True)


def by_spec(folder: Path) -> dict:
    """{(run spec, metric, labels): (value, ci_low, ci_high)} of the counted rows."""
    view = ResultStore(folder).read()
    spec = {run_id: _spec_key(rec) for run_id, rec in view.complete.items()}
    return {
        (spec[r["run_id"]], r["metric"], json.dumps(r["labels"], sort_keys=True)): (
            r["value"],
            r["ci_low"],
            r["ci_high"],
        )
        for r in view.rows
    }


def run_ids(folder: Path) -> dict:
    """{run spec: (run id, the evalkit code identity its info records)} of the completed runs."""
    view = ResultStore(folder).read()
    return {_spec_key(rec): (run_id, rec["info"]["versions"]["evalkit_code"]) for run_id, rec in view.complete.items()}


def test_resume_recomputes_runs_of_other_code(tmp_path, tiny_llama_dir, toy_eval, monkeypatch, capsys):
    """Runs a store holds from other code (another code identity in their run ids) are reported when
    the sweep starts and recomputed; the report then counts only the new ones. The run info records
    the code identity, the git provenance and the model's dtype; the last lines say how to see the table."""
    from evalkit.report import load_store
    from evalkit.sweep import code_identity

    grid = make_grid(tmp_path, tiny_llama_dir, schemes=SCHEMES[:3])
    out = tmp_path / "out"
    argv = ["sweep", str(grid), "--out", str(out), "--no-progress", "--cache-dir", str(tmp_path / "cache")]
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert printed.out.splitlines()[-2:] == [
        f"results: {out / 'results.jsonl'}",
        f"see the table: python -m evalkit report {out} --format md",
    ]
    assert "other code" not in printed.err
    old = code_identity.code_identity()
    for rec in ResultStore(out).read().complete.values():
        assert rec["info"]["versions"]["evalkit_code"] == rec["info"]["code"]["identity"] == old
        assert rec["info"]["dtype"] == "float32"
    new = "sha256:" + "e" * 64
    monkeypatch.setattr(code_identity, "code_identity", lambda parts=None: new)
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert (
        f"store {out}: 3 runs from other code will be recomputed (evalkit code {old[:15]} -> sha256:eeeeeeee); "
        "the report shows the new rows"
    ) in printed.err
    assert "3 runs, 0 already done, 3 completed now (3 replacing runs of other code), 0 failed" in printed.out
    view = ResultStore(out).read()
    assert len(view.complete) == 6  # the old records stay in the append-only file
    results = load_store(out)
    assert len(results.complete) == 3 and len(results.superseded) == 3
    assert {rec["info"]["versions"]["evalkit_code"] for rec in results.complete.values()} == {new}
    assert main(argv) == 0  # nothing left from other code
    printed = capsys.readouterr()
    assert "3 already done, 0 completed now, 0 failed" in printed.out and "other code" not in printed.err


def test_lmeval_warnings_and_bars_go_to_the_runs_log(tmp_path, tiny_llama_dir, capfd):
    """A tiny lm-eval sweep leaves the terminal clean: lm-eval's task-config warnings and its progress
    bars land in runs/<id16>/lmeval.log; the summary points at the logs; logging is restored after."""
    import logging

    handlers = {n: list(logging.getLogger(n).handlers) for n in ("lm_eval", "lm-eval")}
    text = (
        f"models: ['{tiny_llama_dir}']\nschemes: [auto, fp8_e4m3/tensor/dynamic]\n"
        "evals: {lmeval: {tasks: [evalkit_topics_ppl], limit: 2, bootstrap_iters: 0}}\n"
    )
    (tmp_path / "g.yaml").write_text(text)
    out = tmp_path / "out"
    assert main(["sweep", str(tmp_path / "g.yaml"), "--out", str(out), "--cache-dir", str(tmp_path / "cache")]) == 0
    captured = capfd.readouterr()
    assert "WARNING" not in captured.err and "is defined, but aggregation is not" not in captured.err
    assert "requests" not in captured.err  # lm-eval's per-request bars
    logs = sorted(out.glob("runs/*/lmeval.log"))
    assert len(logs) == 2
    first = "\n".join(p.read_text() for p in logs)
    assert "WARNING [lm_eval" in first and "word_perplexity is defined, but aggregation is not" in first
    assert "100%" in first and "\r" not in first  # each bar's finished line, not its redraws
    assert f"lm-eval warnings and progress: {out / 'runs' / '<run>' / 'lmeval.log'} (2 runs)" in captured.out
    assert {n: list(logging.getLogger(n).handlers) for n in handlers} == handlers
