"""Running a sweep: plan the pending runs, execute them model by model, record every outcome.

Plan: the grid's runs (this shard's share), minus those whose completion record is already in
the store (unless ``rerun``), grouped by model, then by evaluation (same eval, same parameters),
baseline scheme first (:func:`evalkit.sweep.run_order.plan`). Execution (:mod:`evalkit.sweep.executors`) goes through a
:class:`ModelSession`: it loads a model once, prepares each evaluation once on it (data, baseline
pass), then evaluates every scheme. A run that raises is returned as a failed outcome with its
error and the sweep goes on; the driver (:func:`run_sweep`) writes each outcome to the store as soon as
it arrives, shows a progress bar (current run, done/total, ETA) and prints a summary of failures at the end.

``evalkit run`` is the same driver with its own executor
(:class:`evalkit.sweep.one_model.OneModelExecutor`): one model, checked and prepared when the executor
starts (before the store is written), and the first error propagates instead of becoming a failed outcome.
"""

from __future__ import annotations

import gc
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.evals.base import get_eval
from evalkit.sweep import code_identity
from evalkit.sweep.grid import Grid, ModelSpec, RunSpec, canonical_json, versions
from evalkit.sweep.run_order import plan
from evalkit.sweep.shard import select
from evalkit.sweep.store import ResultStore, RunOutcome


def _cuda_devices(lm) -> list[int]:
    """The CUDA devices the weights evalkit loaded are on (none for a weightless engine run)."""
    if lm.model is None:
        return []
    import torch

    if not torch.cuda.is_available():
        return []
    return sorted({p.device.index or 0 for p in lm.model.parameters() if p.device.type == "cuda"})


def run_info(lm, engine: str = "emulation", run: RunSpec | None = None) -> dict:
    """What a completion record says about the model a run used (loaded, or the weightless handle of an
    engine run): its path, config hash, device, dtype, library versions, evalkit's code identity, the
    platform, and the KV layout (so the report sizes bytes per token without the model's files). ``run``:
    the run it records, whose codec family's and evaluation's bumped numerics versions enter its code
    identity."""
    parts = run.components if run is not None else None
    from dataclasses import asdict

    from evalkit.runtime.numerics import platform_record

    return dict(
        model_path=lm.path,
        config_hash=lm.config_hash,
        device=str(lm.device),
        dtype=str(lm.dtype).removeprefix("torch."),
        versions=versions(engine, parts),
        code=code_identity.code_record(parts),
        platform=platform_record(),
        kv_layout=asdict(lm.layout),
        decode_path=getattr(lm, "decode_path", "eager"),
    )


def _use_engine(ev, engine: str, lm, options: dict | None = None) -> None:
    """Have ``ev`` ask ``engine``'s backend (``engine: vllm`` in a grid; found in the engine registry,
    given the run's engine options), refusing what it cannot honour."""
    from evalkit.engines.registry import get_engine
    from evalkit.evals.backend import use_backend

    backend = get_engine(engine).hook("backend")(options or {})
    use_backend(ev, backend)
    backend.check_model(lm)


class ModelSession:
    """One model, its prepared evaluations, and the runs evaluated on it.

    An emulation run loads the model's weights (:func:`evalkit.models.loading.load_model_with`); a run
    through a real engine opens only its weightless handle (:func:`evalkit.models.handle.open_model_with`:
    config, tokenizer, KV layout), and the engine loads the weights itself. Each is made once, when a run
    first needs it."""

    def __init__(self, model: ModelSpec, workdir: str | Path, registry: dict[str, str] | None = None):
        self.spec = model
        self.workdir = Path(workdir)
        self.registry = registry
        self._models: dict[bool, object] = {}  # weightless? -> the model (or the exception making it raised)
        self._evals: dict[str, object] = {}  # eval_key -> prepared Evaluation or the exception preparing raised

    def model(self, run: RunSpec):
        """The model ``run`` evaluates: the loaded weights for the emulation, the weightless handle for an
        engine. Made once; a failure is raised again for every run that needs it."""
        weightless = run.engine != "emulation"
        if weightless not in self._models:
            try:
                if weightless:
                    from evalkit.models.handle import open_model_with

                    self._models[weightless] = open_model_with(self.spec.name, self.spec)
                else:
                    from evalkit.models.loading import load_model_with

                    self._models[weightless] = load_model_with(self.spec.name, self.spec)
            except Exception as exc:  # recorded for every run of this model
                self._models[weightless] = exc
        found = self._models[weightless]
        if isinstance(found, BaseException):
            raise found
        return found

    def prepared(self, run: RunSpec, lm):
        """``run``'s evaluation prepared on ``lm`` (once per evaluation key); a failure is raised again."""
        key = run.eval_key
        if key not in self._evals:
            try:
                ev = get_eval(run.eval, self.registry)(run.params)
                if run.engine != "emulation":  # the engine computes this eval's numbers (one backend per prepared eval)
                    _use_engine(ev, run.engine, lm, run.engine_options)
                ev.prepare(lm, self.workdir)
                self._evals[key] = ev
            except Exception as exc:
                self._evals[key] = exc
        ev = self._evals[key]
        if isinstance(ev, BaseException):
            raise ev
        return ev

    def rows(self, run: RunSpec, artifacts: Path | None, info: dict, logs: Path | None = None) -> tuple[list, float]:
        """Evaluate one run: (its rows as dicts, seconds); an exception propagates (``info`` keeps what was
        learnt before it). Libraries' chatter during the run (lm-eval's warnings and progress bars) goes
        to a log in ``logs``, by default ``artifacts`` (:mod:`evalkit.runtime.runlog`)."""
        from evalkit.runtime.runlog import run_folder

        start, cpu = time.perf_counter(), time.process_time()
        with run_folder(artifacts if logs is None else logs):
            rows = self._evaluate(run, artifacts, info)
        info["cpu_seconds"] = round(time.process_time() - cpu, 3)  # this process, all threads
        return [r.to_dict() for r in rows], time.perf_counter() - start

    def outcome(self, run: RunSpec, artifacts: Path | None, info: dict, logs: Path | None = None) -> RunOutcome:
        """:meth:`rows` as the store records them; an exception propagates."""
        rows, seconds = self.rows(run, artifacts, info, logs)
        return RunOutcome(run.run_id, run.to_dict(), True, rows, seconds=seconds, info=info)

    def run(self, run: RunSpec, artifacts: Path | None) -> RunOutcome:
        """Evaluate one run as a sweep does: an exception becomes a failed outcome."""
        start = time.perf_counter()
        info: dict = {}
        try:
            return self.outcome(run, artifacts, info)
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
            return RunOutcome(
                run.run_id,
                run.to_dict(),
                False,
                error=message,
                traceback=traceback.format_exc(),
                seconds=time.perf_counter() - start,
                info=info,
            )

    def _evaluate(self, run: RunSpec, artifacts: Path | None, info: dict) -> list:
        from evalkit.integration.compile_cache import COMPILES

        lm = self.model(run)
        info.update(run_info(lm, run.engine, run))
        compiles = COMPILES.snapshot()  # a compiled decode path's graphs, its preparation's included
        ev = self.prepared(run, lm)
        devices = _cuda_devices(lm)
        if devices:
            import torch

            for d in devices:
                torch.cuda.reset_peak_memory_stats(d)
        rows = ev.evaluate(lm, run.scheme_value, artifacts)
        if info.get("decode_path") != "eager":
            info["decode_compiles"] = COMPILES.since(compiles)  # graphs compiled, their seconds, by shape
        if devices:
            info["max_memory_allocated"] = {f"cuda:{d}": int(torch.cuda.max_memory_allocated(d)) for d in devices}
        return rows

    def run_collecting(self, run: RunSpec) -> RunOutcome:
        """Run with artifacts in a temporary folder and return them as bytes (for remote workers)."""
        tmp = Path(tempfile.mkdtemp(prefix="evalkit-run-"))
        try:
            outcome = self.run(run, tmp)
            outcome.artifacts = {str(p.relative_to(tmp)): p.read_bytes() for p in sorted(tmp.rglob("*")) if p.is_file()}
            return outcome
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def close(self) -> None:
        self._models.clear()
        self._evals.clear()
        gc.collect()


def _short(value) -> str:
    text = str(value)
    return text[:15] if text.startswith("sha256:") else text


def from_other_code(pending: list[RunSpec], complete: dict[str, dict]) -> tuple[int, str]:
    """(how many pending runs have a completed run of the same spec under another run id, what differs).

    A run id covers the spec, the library versions and evalkit's code identity, so such a run was
    computed by other code (or other libraries): it is recomputed, and the report shows the new rows."""
    by_spec: dict[str, dict] = {}
    for rec in complete.values():
        try:
            by_spec[canonical_json(RunSpec.from_dict(rec["spec"]).canonical())] = rec
        except (KeyError, TypeError, ValueError):
            continue
    stale, changes = 0, {}
    for run in pending:
        rec = by_spec.get(canonical_json(run.canonical()))
        if rec is None:
            continue
        stale += 1
        now = versions(run.engine)
        then = (rec.get("info") or {}).get("versions") or {}
        for key in now:
            if then.get(key) != now[key]:
                name = "evalkit code" if key == "evalkit_code" else key
                changes.setdefault(name, (then.get(key, "unrecorded"), now[key]))
    what = ", ".join(f"{name} {_short(a)} -> {_short(b)}" for name, (a, b) in changes.items())
    return stale, what


@dataclass
class SweepSummary:
    total: int  # runs of this grid (and shard)
    skipped: int  # already complete in the store
    completed: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)  # (run label, error)
    seconds: float = 0.0
    recomputed: int = 0  # pending runs whose spec was complete in the store under other code

    def text(self, store: ResultStore) -> str:
        """The closing lines: counts, failures, where the results are and the command that shows them."""
        import shlex

        other = f" ({self.recomputed} replacing runs of other code)" if self.recomputed else ""
        lines = [
            f"sweep: {self.total} runs, {self.skipped} already done, {self.completed} completed now{other}, "
            f"{len(self.failures)} failed, {self.seconds:.1f} s"
        ]
        for label, error in self.failures:
            lines.append(f"  FAILED {label}: {error}")
        lines.append(f"results: {store.results}")
        logs = sorted(store.folder.glob("runs/*/lmeval.log"))
        if logs:
            lines.append(
                f"lm-eval warnings and progress: {store.folder / 'runs' / '<run>' / 'lmeval.log'} ({len(logs)} runs)"
            )
        if self.skipped or self.completed:
            lines.append(f"see the table: python -m evalkit report {shlex.quote(str(store.folder))} --format md")
        return "\n".join(lines)


def run_sweep(
    grid: Grid,
    store: ResultStore,
    executor,
    *,
    rerun: bool = False,
    shard: tuple[int, int] | None = None,
    workdir: str | Path | None = None,
    registry: dict[str, str] | None = None,
    progress: bool = True,
    grid_text: str | None = None,
) -> SweepSummary:
    from tqdm import tqdm

    if workdir is None:
        from evalkit.models.loading import cache_root

        workdir = cache_root() / "work"
    if registry is None:
        from evalkit.evals import base

        registry = base.registry()  # evals registered at run time or by plugins resolve the same way in workers
    runs = select(grid.runs, shard)
    store.check(grid)
    executor.start(runs)  # Ray: connect and check the cluster's GPUs; a refusal leaves nothing written
    try:
        store.claim(grid, grid_text)
        view = store.read()
        if rerun:  # no run id asked: one hashes the weight files, and a store that keeps nothing needs none
            pending = list(runs)
        else:
            done = set(view.complete)
            pending = [r for r in runs if r.run_id not in done]
        summary = SweepSummary(total=len(runs), skipped=len(runs) - len(pending))
        if not rerun:
            summary.recomputed, what = from_other_code(pending, view.complete)
            if summary.recomputed:
                print(
                    f"store {store.folder}: {summary.recomputed} runs from other code will be recomputed ({what}); "
                    "the report shows the new rows",
                    file=sys.stderr,
                )
        start = time.perf_counter()
        bar = tqdm(
            total=len(pending),
            desc=f"sweep {grid.name}",
            unit="run",
            file=sys.stderr,
            disable=not progress,
            dynamic_ncols=True,
        )

        def on_start(run: RunSpec) -> None:
            bar.set_postfix_str(run.label(), refresh=True)

        try:
            for run, outcome in executor.execute(plan(pending), store, workdir, registry, on_start):
                store.append(outcome)
                if outcome.ok:
                    summary.completed += 1
                else:
                    summary.failures.append((run.label(), outcome.error or "unknown error"))
                    bar.write(f"FAILED {run.label()}: {outcome.error}", file=sys.stderr)
                bar.update(1)
        finally:
            bar.close()
        summary.seconds = time.perf_counter() - start
        return summary
    finally:
        executor.close()
