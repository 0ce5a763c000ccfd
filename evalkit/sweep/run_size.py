"""Is this ``evalkit run`` a long one on this machine? Its estimate, and a one-line hint, before it starts.

The evaluations' defaults are GPU sizes (retrieval's 1,400 prompts per scheme, all 896 items of
``evalkit_mmlu4``, decode's 4 x (512 + 1,536) tokens): on a 2-core CPU one scheme at those sizes
takes hours, and a user who copied a command learns it from a progress bar, if at all. So ``run``
prices itself before its first evaluation (a step of its executor's start,
:class:`evalkit.sweep.one_model.OneModelExecutor`, once the model is loaded), as ``sweep --dry-run`` prices a grid (the same
:func:`evalkit.sweep.estimate.estimate_sweep`, on the run's own specs: baselines, engine starts and
imports included), and when the run would take longer than :data:`LONG_S` it prints one line on
stderr: the estimate, the flags that give the CPU sizes the documentation uses (:data:`CPU_SIZES`,
only those that shrink this run), and what the run would cost with them. It prints and goes on:
the user may well mean it.

The speed is found in two steps, so a small run pays almost nothing:

1. an analytic price from a timed matrix product and copy on this machine
   (:func:`evalkit.sweep.speed_probe.measured_device`, a fraction of a second): a run it prices
   under :data:`PROBE_ABOVE_S` is left alone (the analytic price is optimistic, by up to about 5x
   for transformers' eager decode on a CPU, never by 10x on the models measured);
2. otherwise the dry run's probe on the model ``run`` has already loaded
   (:func:`evalkit.sweep.speed_probe.probe_model`: a forward of 128 tokens and 5 decode steps, about
   2 s for the embedded model on 2 cores), whose price decides.

A run through vLLM is priced at the emulation's speed plus the engine's starts and import
(:data:`evalkit.sweep.estimate.ENGINE_COSTS`). Nothing here changes what a run computes; a run
that cannot be sized is not held up (no line).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from evalkit.units import format_seconds

LONG_S = 600.0  # a run over 10 minutes on this machine gets the line
PROBE_ABOVE_S = 60.0  # the analytic price above which the model is probed

# The sizes the documentation's CPU examples use (sweeps/engine.yaml, docs/engines.md), per eval and grid key.
CPU_SIZES: dict[str, dict[str, object]] = {
    "perplexity": {"window": 512, "stride": 512, "max_windows": 4},
    "decode": {"prefill": 128, "decode": 64, "sequences": 2},
    "retrieval": {"tasks": ["passkey"], "lengths": [512], "depths": [0, 100], "samples": 1},
    "lmeval": {"limit": 8},
}
DOCS = "docs/sizing.md#what-fits-a-cpu"


@dataclass(frozen=True)
class RunSize:
    """A run's estimated seconds (None: not sized), the speed line, and the suggestion."""

    seconds: float | None
    speed: str = ""
    flags: tuple[str, ...] = ()  # the CPU sizes that shrink this run, as flags
    smaller_seconds: float | None = None  # the run's estimate with them
    load: float | None = None  # the machine's load average when it was timed

    @property
    def long(self) -> bool:
        return self.seconds is not None and self.seconds > LONG_S


def _specs(model, eval_name: str, params: dict, schemes, engine: str):
    from evalkit.sweep.spec import RunSpec, canonical_json

    text = canonical_json(params)
    return [RunSpec(model, str(s), eval_name, text, text, engine) for s in schemes]


def _seconds(model, eval_name: str, params: dict, schemes, engine: str, speed_for, workdir) -> float | None:
    from pathlib import Path

    from evalkit.sweep.estimate import estimate_sweep

    runs = _specs(model, eval_name, params, schemes, engine)
    grid = SimpleNamespace(name=f"run-{eval_name}")
    est = estimate_sweep(grid, runs, Path(workdir), Path(workdir), speed_for=speed_for)
    if any(r.seconds is None for r in est.runs):
        return None
    return est.seconds


def smaller_params(cls, params: dict) -> tuple[dict, tuple[str, ...]]:
    """(the parameters with the CPU sizes of :data:`CPU_SIZES` that are smaller than this run's, their flags)."""
    sizes = CPU_SIZES.get(cls.name, {})
    out, flags = dict(params), []
    for key, small in sizes.items():
        if key not in params or not _larger(params[key], small):
            continue
        out[key] = small
        value = ",".join(map(str, small)) if isinstance(small, list) else str(small)
        flags.append(f"{cls.Params.flag(key)} {value}")
    return cls.validate(out), tuple(flags)


def _larger(value, small) -> bool:
    """Whether a parameter's ``value`` asks for more work than the CPU size ``small``: None is the
    eval's all (every item, every length); a list is larger when longer or, for numbers, reaching further."""
    if value is None:
        return True
    if isinstance(small, list):
        items = value if isinstance(value, list) else [value]
        if len(items) > len(small):
            return True
        numbers = all(isinstance(v, (int, float)) for v in [*items, *small])
        return numbers and max(items) > max(small)
    try:
        return value > small
    except TypeError:
        return False


def estimate_run(model, cls, params: dict, schemes, engine: str, lm, workdir) -> RunSize:
    """The run's :class:`RunSize` on this machine (``model``: its :class:`~evalkit.sweep.spec.ModelSpec`):
    analytic first, the loaded model's probe when that is not small."""
    from evalkit.sweep import speed_probe as P

    cache: dict[str, object] = {}
    path = model.decode_path or "auto"
    compiled = None if path == "auto" else path == "compiled"  # None: the device's default path

    def analytic(spec, facts, speeds):
        if "analytic" not in cache:
            cache["analytic"] = P.measured_device(facts, spec.device, facts.dtype_bytes, compiled)
        return cache["analytic"]

    def probed(spec, facts, speeds):
        if "probe" not in cache:
            probe = P.probe_model(lm, facts, compiled=compiled) if lm is not None else analytic(spec, facts, speeds)
            cache["probe"] = probe
        return cache["probe"]

    seconds = _seconds(model, cls.name, params, schemes, engine, analytic, workdir)
    speed = analytic
    if seconds is not None and seconds >= PROBE_ABOVE_S:
        speed = probed
        seconds = _seconds(model, cls.name, params, schemes, engine, probed, workdir)
    if seconds is None or seconds <= LONG_S:
        return RunSize(seconds)
    small, flags = smaller_params(cls, params)
    smaller = _seconds(model, cls.name, small, schemes, engine, speed, workdir) if flags else None
    used = cache.get("probe") or cache.get("analytic")
    return RunSize(seconds, getattr(used, "description", ""), flags, smaller, _load())


def _load() -> float | None:
    """This machine's 1-minute load average (None where the OS has none): the estimate times the machine as it is."""
    import os

    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def note(size: RunSize, device: str, cls, schemes, engine: str) -> str | None:
    """The one line for a long run on ``device`` (None for any other): its estimate and the CPU sizes to try."""
    if not size.long:
        return None
    device = str(device)
    where = "this CPU" if device.startswith("cpu") else f"this machine's {device}"
    through = " through vLLM" if engine != "emulation" else ""
    line = (
        f"this run ({cls.name}{through}, {len(schemes)} scheme{'s' if len(schemes) != 1 else ''} with the baseline) "
        f"is estimated at about {format_seconds(size.seconds)} on {where}"
        + (f" (timed at load {size.load:.1f})" if size.load is not None else "")
    )
    if size.flags:
        with_them = f", about {format_seconds(size.smaller_seconds)}" if size.smaller_seconds is not None else ""
        lead = (
            "the evaluation's defaults are GPU sizes; for a CPU try"
            if device.startswith("cpu")
            else "to shorten it try"
        )
        line += f": {lead} {' '.join(size.flags)} ({DOCS}{with_them})"
    else:
        line += f": lower --schemes or the --{cls.name}-* sizes ({DOCS})"
    return line
