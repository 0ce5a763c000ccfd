"""Sweep grids: a YAML file expanded into frozen run specs, each with a content-addressed run id.

A grid names models, KV schemes and evaluations; the sweep runs their product::

    name: quick
    out: results/quick                  # optional, relative to the current folder; --out overrides it
    models:
      - embedded                        # or {name: ID_OR_FOLDER, dtype:, device:, device_map:, ...}
    schemes:
      - auto
      - fp8_e4m3/head/dynamic
      - fp8_e5m2/tensor/dynamic,int8/token/dynamic   # a string may list several (as `run --schemes` does)
      - expand:                         # formats x granularities x scale sources (+ options)
          formats: [fp8_e4m3, fp8_e5m2]
          granularities: [tensor, head, block16]
          scales: [dynamic, unit]
    evals:
      perplexity: {window: 128, max_windows: 4}
    seeds: [0, 1]                       # optional: one run per seed (passed as the eval's `seed`)
    engine_profile: vllm-cpu            # optional: every scheme as that engine's KV kernels run it
    engine: vllm                        # optional: the engine computes the numbers (default: emulation);
                                        #   [emulation, vllm]: every run through both, in one store;
                                        #   an eval that measures an engine itself (serving) runs on it only

Every problem is reported as ``FILE:LINE: KEY: what is wrong`` using the YAML node marks, before
anything runs; the parser goes on after a problem, so one :class:`GridError` lists every problem
of the file (``problems``, one line each; its message is the first, with a count of the others). A run's id is the SHA-256 of its canonical spec (model settings, canonical scheme
string, eval name, the eval's number-deciding parameters) together with the versions of the
packages that decide the numbers (torch, transformers, lm-eval, Python's major.minor, and for an
engine run the engine's package and version), the identity of evalkit's own number-deciding code
(:mod:`evalkit.sweep.code_identity`), the content of the local corpus files it reads
(:func:`evalkit.data.corpus_check.input_hashes`) and of the model's weights and the static scale
table its scheme reads (:mod:`evalkit.sweep.run_inputs`), so a
changed setting, a changed library or changed evalkit code yields a new run, never a silently
reused one.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from evalkit.sweep.grid_entries import grid_evals, grid_models, grid_schemes
from evalkit.sweep.grid_lookup import grid_dirs, resolve_grid  # noqa: F401 (re-exported)
from evalkit.sweep.located_yaml import GridError, Located
from evalkit.sweep.run_versions import engine_version, versions  # noqa: F401 (re-exported)
from evalkit.sweep.spec import Grid, ModelSpec, RunSpec, canonical_json  # noqa: F401 (re-exported)

TOP_KEYS = (
    "name",
    "description",
    "out",
    "models",
    "schemes",
    "evals",
    "seeds",
    "executor",
    "engine_profile",
    "engine",
    "engine_options",
)
# who computes a run's numbers: evalkit's emulation or a registered engine (evalkit.engines.registry)


def parse_grid(path: str | Path, text: str | None = None) -> Grid:
    """Read and validate a grid file; every error names FILE:LINE and the key (:func:`grid_from_data`)."""
    path = Path(path)
    if text is None:
        try:
            text = path.read_text()
        except OSError as exc:
            raise GridError(f"cannot read grid {path}: {exc.strerror}") from None
    return grid_from_data(Located(path, text), path.stem)


def grid_from_data(doc: Located, name: str, *, scales: tuple[str, str] | None = None) -> Grid:
    """The grid a description gives (``doc.value``: the keys and values of a grid file), checked entry by
    entry: the one grid path of ``evalkit sweep`` (a YAML file, :func:`parse_grid`) and ``evalkit run`` (its
    flags, :meth:`Located.given`). First what this layer reads, every entry: the top-level keys, the models,
    the schemes (parsed here, once, at their entry; ``scales``, a (model, format) pair, declared on each
    static one: ``--scales-model``/``--scales-format``), the engines, the evaluations and their parameters;
    then the layers below, once each: the engines' plans (:func:`evalkit.engines.grid_plan.plan_engines`:
    the engine profile applied, the options typed, each engine's plan) and the corpus files
    (:func:`evalkit.data.corpus_check.corpus_problems`). Every problem is raised together
    (:class:`GridError`); then the runs and the engines' noise floor runs. ``name``: the grid's name when the
    description has none."""
    data = doc.value
    if not isinstance(data, dict):
        doc.problems.append(str(doc.error((), "a grid is a mapping with models, schemes and evals")))
        doc.raise_problems()
    for k in data:
        if k not in TOP_KEYS:
            doc.problems.append(str(doc.error((k,), f"unknown key: use {', '.join(TOP_KEYS)}")))
    for k in ("models", "schemes", "evals"):
        if k not in data:
            doc.problems.append(str(doc.error((), f"missing {k!r}")))
    seeds = data.get("seeds")
    if seeds is not None and (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
    ):
        doc.problems.append(str(doc.error(("seeds",), "seeds are a non-empty list of integers")))
        seeds = None
    for k in ("name", "out", "executor", "description", "engine_profile"):
        if k in data and not isinstance(data[k], str):
            doc.problems.append(str(doc.error((k,), "must be a string")))
    if isinstance(data.get("executor"), str) and data["executor"] not in ("local", "ray"):
        doc.problems.append(str(doc.error(("executor",), "executor is local or ray")))
    models: list[ModelSpec] = []
    schemes: list = []  # Scheme values
    entries: dict[str, tuple] = {}  # canonical scheme -> the key path of its entry
    evals: list[tuple[str, str, str]] = []
    if "models" in data:
        with doc.collecting():
            models = grid_models(doc, data["models"])
    if "schemes" in data:
        with doc.collecting():
            schemes, entries = grid_schemes(doc, data["schemes"], scales)
    engines = _engines(doc, data.get("engine", "emulation"))
    given = _engine_options(doc, data.get("engine_options"), engines)
    if "evals" in data:
        with doc.collecting():
            evals = grid_evals(doc, data["evals"], seeds)
    on = _eval_engines(doc, [e for e, _, _ in evals], engines)
    # the layers below, once each and in their order: the engines' plans, then the corpus files
    from evalkit.data.corpus_check import corpus_problems
    from evalkit.engines.grid_plan import plan_engines

    profile = data.get("engine_profile") if isinstance(data.get("engine_profile"), str) else None
    plans = plan_engines(engines, given, profile, schemes, models, entries)
    corpora = corpus_problems(data.get("evals"), located=doc.file is not None)
    for key, message in plans.problems + corpora:
        doc.problems.append(str(doc.error(key, message)))
    by_engine, options = plans.schemes, plans.options
    doc.raise_problems()
    runs = tuple(
        RunSpec.of(m, s, e, p, rp, engine=engine, engine_options_json=canonical_json(options.get(engine, {})))
        for engine, schemes in by_engine.items()
        for m in models
        for (e, p, rp) in evals
        if engine in on[e]
        for s in schemes
    )
    runs += noise_floor_runs(runs, options)
    return Grid(
        name=data.get("name", name),
        path=str(doc.file),
        runs=runs,
        out=data.get("out"),
        executor=data.get("executor"),
        data=data,
    )


def noise_floor_runs(runs: tuple, options: dict) -> tuple:
    """One noise floor run per (model, evaluation) of every engine that declares a ``noise_floor`` option
    (vLLM: :mod:`evalkit.engines.vllm.options`): ``auto`` against a second realisation of ``auto``, beside
    the grid's schemes, so that each scheme's effect can be told from the engine's own run-to-run spread.
    Not for an evaluation that measures the engine itself (its class names ``engines``: serving)."""
    from evalkit.engines.registry import get_engine
    from evalkit.evals.base import get_eval

    out: dict = {}
    for r in runs:
        if r.engine == "emulation" or getattr(get_eval(r.eval), "engines", None):
            continue
        if "noise_floor" not in {o.name for o in get_engine(r.engine).options}:
            continue
        floor = {**options.get(r.engine, {}), "noise_floor": True}
        spec = RunSpec(r.model, "auto", r.eval, r.params_json, r.run_params_json, r.engine, canonical_json(floor))
        out.setdefault(spec, None)
    return tuple(out)


def _engines(doc: Located, value) -> list[str]:
    """``engine:`` as a list of engine names, each once (a name or a list of names; each is found, or refused,
    with the engines' plans: :func:`evalkit.engines.grid_plan.plan_engines`)."""
    from evalkit.engines.registry import choices

    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        doc.problems.append(str(doc.error(("engine",), f"engine is one of {', '.join(choices())} or a list of them")))
        return ["emulation"]
    return list(dict.fromkeys(names))


def _engine_options(doc: Located, value, engines: list[str]) -> dict[str, dict]:
    """``engine_options:`` (engine name -> its scale-out options, as written) for engines the grid's ``engine:``
    names; each engine types and checks its own (:func:`evalkit.engines.grid_plan.plan_engines`)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        doc.problems.append(
            str(
                doc.error(
                    ("engine_options",),
                    "engine_options maps an engine to its options, e.g. vllm: {tensor_parallel_size: 2}",
                )
            )
        )
        return {}
    out = {}
    for name, given in value.items():
        if name not in engines or name == "emulation":
            doc.problems.append(
                str(
                    doc.error(
                        ("engine_options", name), f"engine_options for {name!r}, which the grid's engine: does not name"
                    )
                )
            )
            continue
        out[name] = given
    return out


def _eval_engines(doc: Located, names: list[str], engines: list[str]) -> dict[str, list[str]]:
    """eval name -> the grid's engines it runs on: all of them, or for an evaluation that measures an
    engine itself (its class's ``engines``, e.g. serving: vllm) those it names; none is a problem."""
    from evalkit.evals.base import get_eval

    out = {}
    for name in dict.fromkeys(names):
        only = getattr(get_eval(name), "engines", None)
        out[name] = [e for e in engines if only is None or e in only]
        if not out[name]:
            fix = f"add engine: {only[0]} (or a list holding it)" if doc.file else f"add --engine {only[0]}"
            doc.problems.append(
                str(doc.error(("evals", name), f"eval {name} runs on engine {' or '.join(only)} only: {fix}"))
            )
    return out


def with_engine_profile(grid: Grid, name: str) -> Grid:
    """The grid with every scheme as engine ``name`` runs it (``evalkit sweep GRID --engine-profile
    NAME``; the same as an ``engine_profile:`` key in the grid). Raises EvalkitError for a scheme
    the engine cannot run."""
    from dataclasses import replace

    from evalkit.engines.registry import get_profile

    profile = get_profile(name)
    runs = tuple(dict.fromkeys(replace(r, scheme=str(profile.apply(r.scheme_value))) for r in grid.runs))
    data = {**grid.data, "engine_profile": name}
    return Grid(name=grid.name, path=grid.path, runs=runs, out=grid.out, executor=grid.executor, data=data)


def with_model(grid: Grid, name: str) -> Grid:
    """The grid with every model's name replaced by ``name`` (its dtype, device and other settings
    kept; models that become equal are merged): ``evalkit sweep GRID --model ID_OR_FOLDER``."""
    from dataclasses import replace

    runs = tuple(dict.fromkeys(replace(r, model=replace(r.model, name=name)) for r in grid.runs))
    models = list(dict.fromkeys(r.model for r in runs))
    data = {**grid.data, "models": [asdict(m) for m in models]}
    return Grid(name=grid.name, path=grid.path, runs=runs, out=grid.out, executor=grid.executor, data=data)


def with_scales_declared(grid: Grid, model: str, fmt: str) -> Grid:
    """The grid with every static scheme declaring its table's model and format
    (``+scales_model=MODEL+scales_format=FORMAT``): ``evalkit sweep GRID --scales-model MODEL
    --scales-format FORMAT``, for tables without their JSON sidecar (:mod:`evalkit.kv.scale_table`).
    EvalkitError when no scheme of the grid reads a table, or one declares something else."""
    from dataclasses import replace

    from evalkit.kv.scheme import declare_scales

    schemes = list(dict.fromkeys(r.scheme_value for r in grid.runs))
    mapped = {str(s): str(d) for s, d in zip(schemes, declare_scales(schemes, model, fmt))}
    runs = tuple(dict.fromkeys(replace(r, scheme=mapped[r.scheme]) for r in grid.runs))
    return Grid(name=grid.name, path=grid.path, runs=runs, out=grid.out, executor=grid.executor, data=grid.data)
