"""Executors: where a sweep's runs execute. Both yield ``(run, outcome)`` as runs finish; the
driver alone writes the store, so results do not depend on the executor.

* ``local``: this process, one model at a time (:class:`~evalkit.sweep.runner.ModelSession`).
* ``ray``: one Ray actor per model group holding the resources a run of that model needs
  (``num_gpus`` = the model's GPU count on a GPU cluster, else one CPU); each run is a task on
  that actor, so the model is loaded and each evaluation prepared once per actor, exactly as
  locally. An actor is released as soon as its last run returns, so groups waiting for
  resources start then. Connects to an existing cluster with ``address`` (``ray://...`` or ``auto``) or starts
  a local one. Artifacts come back to the driver as bytes, so workers need no shared disk; the
  evaluation cache folder (``workdir``) is per node. Evaluations registered at run time in the
  driver are passed to the workers by import path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

from evalkit.errors import EvalkitError
from evalkit.sweep.grid import RunSpec
from evalkit.sweep.runner import ModelSession
from evalkit.sweep.store import ResultStore, RunOutcome

EXECUTORS = ("local", "ray")


class LocalExecutor:
    name = "local"

    def execute(self, groups: list[list[RunSpec]], store: ResultStore, workdir, registry,
                on_start: Callable[[RunSpec], None]) -> Iterator[tuple[RunSpec, RunOutcome]]:
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
        from evalkit.sweep.grid import ModelSpec

        self.session = ModelSession(ModelSpec(**model), workdir, registry)

    def run(self, run: dict) -> RunOutcome:
        return self.session.run_collecting(RunSpec.from_dict(run))


def _worker_env() -> dict[str, str]:
    """Environment for workers of a local cluster: import this evalkit, keep offline settings."""
    src = str(Path(__file__).resolve().parents[2])
    paths = [src, os.getcwd()] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
    for k, v in os.environ.items():
        if k.startswith(("HF_", "EVALKIT_", "TOKENIZERS_", "TRANSFORMERS_")):
            env[k] = v
    return env


class RayExecutor:
    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None):
        self.address = address
        self.num_cpus = num_cpus

    def _init(self):
        try:
            import ray
        except ImportError:
            raise EvalkitError("--executor ray needs Ray: pip install 'evalkit[ray]' (or pip install ray)") from None
        started = False
        if not ray.is_initialized():
            kwargs = dict(include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": _worker_env()})
            if self.address:
                kwargs["address"] = self.address
            elif self.num_cpus:
                kwargs["num_cpus"] = self.num_cpus
            try:
                ray.init(**kwargs)
            except ConnectionError as exc:
                raise EvalkitError(f"cannot reach the Ray cluster at {self.address!r}: {exc} (check --ray-address)") from None
            started = True
        return ray, started

    def execute(self, groups, store, workdir, registry, on_start):
        if not groups:
            return
        ray, started = self._init()
        Actor = ray.remote(_SessionActor)
        actors, pending, left = [], {}, {}
        try:
            for group in groups:
                model = group[0].model
                options = {"num_gpus": model.num_gpus} if model.num_gpus else {"num_cpus": 1}
                actor = Actor.options(**options).remote(group[0].to_dict()["model"], str(workdir), registry)
                actors.append(actor)
                left[len(actors) - 1] = len(group)
                for run in group:
                    pending[actor.run.remote(run.to_dict())] = (run, len(actors) - 1)
            refs = list(pending)
            while refs:
                done, refs = ray.wait(refs, num_returns=1)
                run, idx = pending.pop(done[0])
                on_start(run)
                outcome = ray.get(done[0])
                left[idx] -= 1
                if not left[idx]:  # free its resources so actors waiting for them can start
                    ray.kill(actors[idx])
                yield run, outcome
        finally:
            for idx, actor in enumerate(actors):
                if left.get(idx):
                    ray.kill(actor)
            if started:
                ray.shutdown()


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
