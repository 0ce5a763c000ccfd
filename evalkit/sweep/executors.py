"""Executors: where a sweep's runs execute. Both yield ``(run, outcome)`` as runs finish; the
driver alone writes the store, so results do not depend on the executor. A sweep calls
``start(runs)`` before it writes anything, then ``execute(...)``, then ``close()``.

* ``local``: this process, one model at a time (:class:`~evalkit.sweep.runner.ModelSession`).
* ``ray``: a pool of Ray actors (workers) per model. A worker holds the resources one run of its
  model needs (``num_gpus`` = the model's GPU count, else one CPU) and its own loaded copy of the
  model, which it keeps across the runs it takes (each evaluation is prepared once per worker).
  A GPU model's pool has one worker per slot the cluster has for it (the sum over nodes of
  node GPUs // GPUs per run, at most one per run), so on G GPUs up to G one-GPU runs execute at
  once; a CPU model has one worker. Ray places a worker on ONE node with all its GPUs and sets
  ``CUDA_VISIBLE_DEVICES`` to them, so a run never starts without the GPUs it asked for and a
  multi-GPU model (``device_map: auto``) spreads over exactly those. A worker takes its model's
  next run when it returns one and is released as soon as none is left, so pools of other
  models waiting for GPUs start then. Each run's info records where it ran (``info["ray"]``:
  GPU ids, node, worker, start and end times).

  ``start`` refuses, with one line and before anything is written: an address that does not
  accept a TCP connection within :data:`CONNECT_TIMEOUT` (``ray.init`` to a dead ``HOST:PORT``
  blocks for minutes), ``auto`` with no cluster running, and a model that needs more GPUs per
  run than the cluster's largest node has (it would wait forever). Without an address (and no
  ``RAY_ADDRESS``) it starts a local cluster. Artifacts come back to the driver as bytes, so
  workers need no shared disk; the evaluation cache folder (``workdir``) is per node.
  Evaluations registered at run time in the driver are passed to the workers by import path.
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from evalkit.errors import EvalkitError
from evalkit.sweep.grid import ModelSpec, RunSpec
from evalkit.sweep.runner import ModelSession
from evalkit.sweep.store import ResultStore, RunOutcome

EXECUTORS = ("local", "ray")
CONNECT_TIMEOUT = 5.0  # seconds for the TCP check of a cluster address
CLIENT_PORT = 10001  # Ray Client's default port (ray://HOST)
ADDRESS_HELP = "HEAD:6379 on a node of the cluster, ray://HEAD:10001 from outside it, or auto on the head node"


class LocalExecutor:
    name = "local"

    def start(self, runs: list[RunSpec]) -> None:
        """Nothing to connect to."""

    def close(self) -> None:
        """Nothing to release."""

    def execute(
        self, groups: list[list[RunSpec]], store: ResultStore, workdir, registry, on_start: Callable[[RunSpec], None]
    ) -> Iterator[tuple[RunSpec, RunOutcome]]:
        for group in groups:
            session = ModelSession(group[0].model, workdir, registry)
            try:
                for run in group:
                    on_start(run)
                    yield run, session.run(run, store.artifact_dir(run.run_id))
            finally:
                session.close()


class _SessionActor:
    """The Ray actor: a ModelSession living in a worker process."""

    def __init__(self, model: dict, workdir: str, registry: dict | None):
        from evalkit.runtime import numerics

        numerics.configure()  # a worker of an existing cluster gets no environment from the driver
        self.session = ModelSession(ModelSpec(**model), workdir, registry)

    def run(self, run: dict) -> RunOutcome:
        import ray

        started = time.time()
        outcome = self.session.run_collecting(RunSpec.from_dict(run))
        ctx = ray.get_runtime_context()
        outcome.info["ray"] = {
            "gpu_ids": list(ray.get_gpu_ids()),
            "node_id": ctx.get_node_id(),
            "host": socket.gethostname(),
            "worker": ctx.get_actor_id(),
            "pid": os.getpid(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "started": round(started, 3),
            "ended": round(time.time(), 3),
        }
        return outcome


def _worker_env() -> dict[str, str]:
    """Environment for workers of a local cluster: import this evalkit, keep offline settings."""
    src = str(Path(__file__).resolve().parents[2])
    paths = [src, os.getcwd()] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
    for k, v in os.environ.items():
        if k.startswith(("HF_", "EVALKIT_", "TOKENIZERS_", "TRANSFORMERS_", "MKL_CBWR")):
            env[k] = v
    return env


def _resolve_auto(address: str) -> str:
    """The HOST:PORT ``auto`` means: ``RAY_ADDRESS``, else the cluster ``ray start`` started on this machine."""
    from ray._private.services import get_ray_address_from_environment

    try:
        return get_ray_address_from_environment("auto", None)
    except ConnectionError:
        raise EvalkitError(
            f"no Ray cluster is running on this machine (--ray-address {address}): start one with "
            "`ray start --head`, give its address, or leave out --ray-address to start a local one"
        ) from None


def _host_port(address: str) -> tuple[str, int]:
    """HOST and PORT of ``HOST:PORT`` or ``ray://HOST[:PORT]``; EvalkitError for anything else."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep and address.startswith("ray://"):
        host, port = rest, str(CLIENT_PORT)
    host = host.strip("[]")  # [IPv6]:PORT
    if not host or not port.isdigit() or "/" in rest:
        raise EvalkitError(f"cannot read the Ray address {address!r}: give {ADDRESS_HELP}")
    return host, int(port)


def check_reachable(address: str) -> str:
    """The address to give ``ray.init`` after checking that it accepts a TCP connection within
    :data:`CONNECT_TIMEOUT` seconds (``ray.init`` itself waits minutes for a dead one)."""
    target = _resolve_auto(address) if address == "auto" else address
    host, port = _host_port(target)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        why = f"no answer within {CONNECT_TIMEOUT:g} s" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        shown = address if target == address else f"{address} = {target}"
        raise EvalkitError(
            f"cannot reach the Ray cluster at {shown} ({why}): check that it is running and give {ADDRESS_HELP}"
        ) from None
    return target


def node_gpus(ray) -> list[float]:
    """The GPU count of every live node of the cluster."""
    return [float(n.get("Resources", {}).get("GPU", 0)) for n in ray.nodes() if n.get("Alive")]


def check_capacity(models: list[ModelSpec], gpus: list[float]) -> None:
    """EvalkitError for the first model that needs more GPUs per run than the largest node has."""
    largest = max(gpus, default=0.0)
    for m in models:
        if m.num_gpus > largest:
            where = f"the largest node of the Ray cluster has {largest:g}" if largest else "the Ray cluster has no GPUs"
            raise EvalkitError(
                f"model {m.name!r} needs {m.num_gpus} GPU{'s' if m.num_gpus > 1 else ''} per run but "
                f"{where}: lower its 'gpus' in the grid (or use device: cpu), or add a node with "
                f"{m.num_gpus} GPUs"
            )


def pool_size(model: ModelSpec, runs: int, gpus: list[float]) -> int:
    """Workers for a model: one per slot of ``model.num_gpus`` GPUs on the cluster's nodes (at most
    one per run); one for a CPU model."""
    if not model.num_gpus:
        return 1
    slots = sum(int(n // model.num_gpus) for n in gpus)
    return max(1, min(runs, slots))


class RayExecutor:
    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None):
        self.address = address
        self.num_cpus = num_cpus  # for a local cluster this executor starts
        self.num_gpus = num_gpus  # for a local cluster: GPUs to declare (default: Ray detects them)
        self._ray = None
        self._started = False  # this executor called ray.init (and so calls ray.shutdown: a cluster it
        # connected to keeps running)
        self._gpus: list[float] = []

    def start(self, runs: list[RunSpec]) -> None:
        """Connect (or start a local cluster) and check that every model's GPUs fit on one node."""
        if self._ray is not None:
            return
        try:
            import ray
        except ImportError:
            raise EvalkitError("--executor ray needs Ray: pip install 'evalkit[ray]' (or pip install ray)") from None
        if not ray.is_initialized():
            address = self.address or os.environ.get("RAY_ADDRESS") or None
            kwargs = dict(include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": _worker_env()})
            if address and address != "local":
                kwargs["address"] = check_reachable(address)
            else:
                kwargs["address"] = "local"  # as documented: never an old `ray start` cluster found on disk
                sizes = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
                kwargs.update({k: v for k, v in sizes.items() if v is not None})
            try:
                ray.init(**kwargs)
            except ConnectionError as exc:
                raise EvalkitError(
                    f"cannot connect to the Ray cluster at {address!r}: {str(exc).splitlines()[0]} "
                    f"(give {ADDRESS_HELP})"
                ) from None
            except ValueError as exc:
                if "ray[client]" not in str(exc):
                    raise
                raise EvalkitError(
                    "a ray:// address needs Ray Client: pip install 'ray[client]', or run on a node of "
                    "the cluster with --ray-address HEAD:6379 (or auto on the head)"
                ) from None
            except RuntimeError as exc:  # e.g. a cluster of another Ray or Python version
                raise EvalkitError(f"cannot use the Ray cluster at {address!r}: {str(exc).splitlines()[0]}") from None
            self._started = True
        self._ray = ray
        try:
            self._gpus = node_gpus(ray)
            check_capacity(list(dict.fromkeys(r.model for r in runs)), self._gpus)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
        self._ray, self._started = None, False

    def execute(self, groups, store, workdir, registry, on_start):
        if not groups:
            return
        own = self._ray is None  # called without start(): connect here, release at the end
        if own:
            self.start([r for g in groups for r in g])
        ray = self._ray
        Actor = ray.remote(_SessionActor)
        queues = [deque(g) for g in groups]
        pools: list[set] = [set() for _ in groups]
        inflight: dict = {}  # object ref -> (run, group index, actor)

        def submit(actor, gi: int) -> None:
            run = queues[gi].popleft()
            inflight[actor.run.remote(run.to_dict())] = (run, gi, actor)

        def new_worker(gi: int):
            model = groups[gi][0].model
            options = {"num_gpus": model.num_gpus} if model.num_gpus else {"num_cpus": 1}
            actor = Actor.options(**options).remote(groups[gi][0].to_dict()["model"], str(workdir), registry)
            pools[gi].add(actor)
            submit(actor, gi)

        try:
            for gi, group in enumerate(groups):
                for _ in range(pool_size(group[0].model, len(group), self._gpus)):
                    new_worker(gi)
            while inflight:
                done, _ = ray.wait(list(inflight), num_returns=1)
                run, gi, actor = inflight.pop(done[0])
                on_start(run)
                try:
                    outcome = ray.get(done[0])
                except ray.exceptions.RayError as exc:  # the worker died (crash, out of memory, killed node)
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                    outcome = RunOutcome(
                        run.run_id, run.to_dict(), False, error=f"Ray worker failed: {first}", traceback=str(exc)
                    )
                    pools[gi].discard(actor)
                    ray.kill(actor)
                    if queues[gi] and not pools[gi]:
                        new_worker(gi)
                else:
                    if queues[gi]:
                        submit(actor, gi)
                    else:  # nothing left for it: free its GPUs so waiting workers can start
                        pools[gi].discard(actor)
                        ray.kill(actor)
                yield run, outcome
        finally:
            if ray.is_initialized():
                for pool in pools:
                    for actor in pool:
                        ray.kill(actor)
            if own:
                self.close()


def make_executor(name: str, address: str | None = None) -> LocalExecutor | RayExecutor:
    if name == "local":
        if address:
            raise EvalkitError("--ray-address goes with --executor ray")
        return LocalExecutor()
    if name == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise EvalkitError("--executor ray needs Ray: pip install 'evalkit[ray]' (or pip install ray)")
        return RayExecutor(address)
    raise EvalkitError(f"unknown executor {name!r}: use one of {', '.join(EXECUTORS)}")
