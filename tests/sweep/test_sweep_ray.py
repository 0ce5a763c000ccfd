"""Scale-out on a Ray cluster: one run per GPU, a multi-GPU model's GPUs on one node, bad input refused.

A local Ray cluster declaring 4 fake GPUs runs sweeps whose runs execute on CPU (tiny random llama,
the test-only ``gate`` evaluation below). Every run records in its info the GPU ids Ray gave its
worker and its start and end times; the tests check from those facts that a 1-GPU model runs 4 at a
time and never more, that a 2-GPU model gets 2 distinct GPUs on one node and runs 2 at a time, that
no two overlapping runs share a GPU, and that every result lands in the store exactly once. A model
needing 5 GPUs per run on that cluster, an unreachable address and ``auto`` with no cluster are
refused with one line and exit code 2 before anything is written.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from evalkit.cli import main
from evalkit.errors import EvalkitError
from evalkit.evals.base import Evaluation, MetricRow
from evalkit.sweep.store import ResultStore

from tests.toy_eval import SUBPROCESS_MAIN

pytest.importorskip("ray")
REPO = Path(__file__).resolve().parents[2]
GATE_PATH = "tests.sweep.test_sweep_ray:GateEval"
SCHEMES = [
    "auto",
    "fp8_e4m3/tensor/dynamic",
    "fp8_e4m3/head/dynamic",
    "fp8_e5m2/tensor/unit",
    "int4/group16/dynamic",
    "fp8_e5m2/head/dynamic",
    "fp8_e4m3/tensor/unit",
    "fp8_e5m2/tensor/dynamic",
]
FAKE_GPUS = 4


class GateEval(Evaluation):
    """Test-only: a run marks its start in ``gate_dir`` and waits (at most ``timeout`` s) until
    ``wait_for`` runs have started, then holds ``hold`` s. So N workers that may run at once are
    seen running at once (not only one after another), whatever their start-up times. A run of
    ``crash_scheme`` kills its worker process."""

    name = "gate"

    @classmethod
    def validate(cls, params):
        known = {"gate_dir": None, "wait_for": 1, "hold": 0.3, "timeout": 90.0, "crash_scheme": None}
        for k in params:
            if k not in known:
                raise EvalkitError(f"unknown gate parameter {k!r}: use {', '.join(known)}")
        return {**known, **params}

    def prepare(self, lm, workdir: Path) -> None:
        self.dir = Path(self.params["gate_dir"])

    def evaluate(self, lm, scheme, artifacts=None):
        if str(scheme) == self.params["crash_scheme"]:
            os._exit(1)  # the worker process dies, as on a segfault or the OOM killer
        (self.dir / f"start-{uuid.uuid4().hex}").write_text(str(scheme))
        t0 = time.time()
        deadline = t0 + self.params["timeout"]
        while len(list(self.dir.glob("start-*"))) < self.params["wait_for"] and time.time() < deadline:
            time.sleep(0.05)
        waited = time.time() - t0
        time.sleep(self.params["hold"])
        return [MetricRow("waited", waited)]


@pytest.fixture
def gate_eval(monkeypatch):
    from evalkit.evals import base

    monkeypatch.setitem(base._REGISTRY, "gate", GATE_PATH)
    return GateEval


def write_grid(folder: Path, model: str, schemes: list[str], wait_for: int = 1, extra: str = "") -> Path:
    gate = folder / "gate"
    gate.mkdir(parents=True, exist_ok=True)
    text = (
        f"name: raygrid\nmodels:\n  - {model}\nschemes:\n"
        + "".join(f"  - '{s}'\n" for s in schemes)
        + f"evals:\n  gate: {{gate_dir: '{gate}', wait_for: {wait_for}{extra}}}\n"
    )
    path = folder / "grid.yaml"
    path.write_text(text)
    return path


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the socket is


def test_pool_sizes_capacity_and_addresses():
    """Workers per model, the refusal of a model bigger than any node, and address parsing (no cluster)."""
    from evalkit.sweep.executors import _host_port, check_capacity, pool_size
    from evalkit.sweep.grid import ModelSpec

    one, two, three = (ModelSpec("m", gpus=n) for n in (1, 2, 3))
    assert pool_size(one, 8, [4.0]) == 4 and pool_size(one, 3, [4.0]) == 3 and pool_size(one, 8, [4.0, 2.0]) == 6
    assert pool_size(two, 8, [4.0, 2.0, 1.0]) == 3 and pool_size(three, 8, [4.0, 2.0]) == 1
    assert pool_size(ModelSpec("m"), 8, [8.0]) == 1  # a CPU model: one worker
    check_capacity([one, three], [4.0, 2.0])
    with pytest.raises(EvalkitError, match="'m' needs 3 GPUs per run but the largest node of the Ray cluster has 2"):
        check_capacity([one, three], [2.0, 2.0])
    with pytest.raises(EvalkitError, match="needs 1 GPU per run but the Ray cluster has no GPUs"):
        check_capacity([ModelSpec("m", device="cuda")], [0.0])
    assert _host_port("ray://head") == ("head", 10001) and _host_port("ray://head:1234") == ("head", 1234)
    assert _host_port("10.0.0.1:6379") == ("10.0.0.1", 6379) and _host_port("[::1]:6379") == ("::1", 6379)
    for bad in ("head", "head:port", "http://head:80"):
        with pytest.raises(EvalkitError, match="cannot read the Ray address"):
            _host_port(bad)


@pytest.mark.slow
def test_unreachable_address_fails_fast(tmp_path, tiny_llama_dir):
    """ray://127.0.0.1:1, a closed HOST:PORT (Ray itself waits ~2 min for it) and ``auto`` with no
    cluster: exit 2 within 30 s with one line on stderr, and nothing written."""
    from ray._private.services import find_gcs_addresses

    grid = tmp_path / "g.yaml"
    grid.write_text(f"models: ['{tiny_llama_dir}']\nschemes: [auto]\nevals: {{toy: {{max_tokens: 16}}}}\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    addresses = ["ray://127.0.0.1:1", f"127.0.0.1:{closed_port()}"]
    if not find_gcs_addresses():  # auto would (rightly) connect to a cluster running on this machine
        addresses.append("auto")
    for i, address in enumerate(addresses):  # one after another: each process's own time is measured
        out = tmp_path / f"out{i}"
        argv = ["sweep", str(grid), "--out", str(out), "--executor", "ray", "--ray-address", address, "--no-progress"]
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", SUBPROCESS_MAIN, *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        seconds = time.perf_counter() - t0
        stdout, stderr = proc.stdout, proc.stderr
        print(f"{address}: exit {proc.returncode} after {seconds:.1f} s: {stderr.strip()}")
        assert proc.returncode == 2, stderr[-2000:]
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("evalkit: error: "), stderr[-2000:]
        expected = "no Ray cluster is running" if address == "auto" else "cannot reach the Ray cluster"
        assert expected in lines[0]
        assert not out.exists() and not stdout


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster declaring 4 GPUs (the runs execute on CPU), shut down after the module."""
    ray = pytest.importorskip("ray")
    from evalkit.sweep.executors import _worker_env

    assert not ray.is_initialized()
    ray.init(
        num_cpus=4,
        num_gpus=FAKE_GPUS,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": _worker_env()},
    )
    try:
        yield ray
    finally:
        ray.shutdown()


def sweep(tmp_path: Path, grid: Path, out: Path) -> int:
    return main(
        [
            "sweep",
            str(grid),
            "--out",
            str(out),
            "--executor",
            "ray",
            "--no-progress",
            "--cache-dir",
            str(tmp_path / "cache"),
        ]
    )


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])  # an end sorts before a start
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def check_runs(out: Path, runs: int, gpus_per_run: int) -> tuple[int, list[dict]]:
    """Every run exactly once; each held ``gpus_per_run`` distinct GPUs on one node; overlapping
    runs never shared a GPU. Returns (most runs at once, the runs' ray info)."""
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    completes = [r for r in records if r["type"] == "complete"]
    assert len(completes) == len({r["run_id"] for r in completes}) == runs
    assert not [r for r in records if r["type"] == "failed"]
    assert sum(r["type"] == "metric" for r in records) == runs
    assert len(ResultStore(out).read().complete) == runs
    info = [r["info"]["ray"] for r in completes]
    ids = set()
    for i in info:
        assert len(set(i["gpu_ids"])) == len(i["gpu_ids"]) == gpus_per_run  # distinct ids, as many as asked
        assert i["cuda_visible_devices"] == ",".join(str(g) for g in i["gpu_ids"])
        ids |= {str(g) for g in i["gpu_ids"]}
    assert ids <= {str(g) for g in range(FAKE_GPUS)}
    for a in info:
        for b in info:
            if a is not b and a["started"] < b["ended"] and b["started"] < a["ended"]:
                assert not set(a["gpu_ids"]) & set(b["gpu_ids"]), (a, b)
                assert a["worker"] != b["worker"]  # a worker runs one run at a time
    return max_overlap([(i["started"], i["ended"]) for i in info]), info


@pytest.mark.slow
def test_one_run_per_gpu_and_multi_gpu_models(tmp_path, cluster, tiny_llama_dir, gate_eval, capsys):
    # (a) a 1-GPU model, 8 runs on 4 GPUs: 4 workers, 4 runs at once and never more
    grid = write_grid(
        tmp_path / "one", f"{{name: '{tiny_llama_dir}', gpus: 1, device: cpu}}", SCHEMES, wait_for=FAKE_GPUS
    )
    t0 = time.perf_counter()
    assert sweep(tmp_path, grid, tmp_path / "one" / "out") == 0, capsys.readouterr().err
    most, info = check_runs(tmp_path / "one" / "out", len(SCHEMES), 1)
    workers = {i["worker"] for i in info}
    with capsys.disabled():
        print(
            f"\n1-GPU model: {len(SCHEMES)} runs in {time.perf_counter() - t0:.1f} s, at most {most} at once, "
            f"{len(workers)} workers, GPU ids {sorted({str(g) for i in info for g in i['gpu_ids']})}"
        )
    assert most == FAKE_GPUS and len(workers) == FAKE_GPUS
    assert "8 completed now, 0 failed" in capsys.readouterr().out

    # (b) a 2-GPU model spread with device_map auto: 2 distinct GPUs on one node, 2 runs at once
    grid = write_grid(
        tmp_path / "two", f"{{name: '{tiny_llama_dir}', gpus: 2, device_map: auto}}", SCHEMES[:4], wait_for=2
    )
    t0 = time.perf_counter()
    assert sweep(tmp_path, grid, tmp_path / "two" / "out") == 0, capsys.readouterr().err
    most, info = check_runs(tmp_path / "two" / "out", 4, 2)
    with capsys.disabled():
        print(
            f"2-GPU model: 4 runs in {time.perf_counter() - t0:.1f} s, at most {most} at once, "
            f"GPU ids per run {[i['gpu_ids'] for i in info]}, nodes {len({i['node_id'] for i in info})}"
        )
    assert most == 2 and len({i["worker"] for i in info}) == 2
    assert len({i["node_id"] for i in info}) == 1  # a one-node cluster; a worker's GPUs are always one node's

    assert "4 completed now, 0 failed" in capsys.readouterr().out


@pytest.mark.slow
def test_more_gpus_per_run_than_a_node_has(tmp_path, cluster, tiny_llama_dir, gate_eval, capsys):
    # (c) 5 GPUs per run on a 4-GPU cluster: one line, exit 2, before any run starts and nothing written
    grid = write_grid(tmp_path, f"{{name: '{tiny_llama_dir}', gpus: 5, device: cpu}}", SCHEMES[:2])
    t0 = time.perf_counter()
    assert sweep(tmp_path, grid, tmp_path / "out") == 2
    err = capsys.readouterr().err.strip().splitlines()
    with capsys.disabled():
        print(f"\nrefused after {time.perf_counter() - t0:.1f} s: {err}")
    assert len(err) == 1 and "needs 5 GPUs per run but the largest node of the Ray cluster has 4" in err[0]
    assert not (tmp_path / "out").exists() and not list((tmp_path / "gate").iterdir())
    assert cluster.is_initialized()  # a cluster the sweep did not start is left running


@pytest.mark.slow
def test_dead_worker_fails_its_run_and_is_replaced(tmp_path, cluster, tiny_llama_dir, gate_eval, capsys):
    """A worker process that dies fails the run it held (one failed record, the sweep goes on); its
    model's remaining runs go to a new worker."""
    grid = write_grid(
        tmp_path, f"{{name: '{tiny_llama_dir}', gpus: 4, device: cpu}}", SCHEMES[:3], extra=", crash_scheme: auto"
    )
    assert sweep(tmp_path, grid, tmp_path / "out") == 1
    captured = capsys.readouterr()
    assert "2 completed now, 1 failed" in captured.out and "FAILED" in captured.out
    view = ResultStore(tmp_path / "out").read()
    assert len(view.complete) == 2 and len(view.failed) == 1
    (failed,) = view.failed.values()
    assert failed["scheme"] == "auto" and failed["error"].startswith("Ray worker failed: ")
    assert {r["scheme"] for r in view.complete.values()} == set(SCHEMES[1:3])
    assert len({r["info"]["ray"]["worker"] for r in view.complete.values()}) == 1  # the replacement took both
