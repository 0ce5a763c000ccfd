"""The engine registry: which real engines evalkit can run through, each declared in its own folder.

An engine (vLLM, llama.cpp) is a real inference engine that computes an evaluation's numbers with its
own KV cache, beside evalkit's emulation. Each built-in engine lives in one folder,
``evalkit/engines/<name>/``, whose ``engine.py`` declares one :class:`Engine`: how to tell it is
installed (its Python package), how to install it, the devices it runs on, the ``kv_cache_dtype``
values each released version accepts with the evalkit scheme each maps to, its engine profiles
(:mod:`evalkit.engines.profiles`), its codec family's prefix (:mod:`evalkit.kv.codec`), its backend
(the requests it answers: :mod:`evalkit.evals.backend`), the check a grid or ``run --engine`` applies
to the schemes, models and engine options it is given (:class:`Plan`), its kernel-conformance and
capacity commands and its scale-out options (:mod:`evalkit.engines.declaration` says what is declared
and holds the one validator that reads it). Everything that names an engine finds it here: grids
(``engine:``), ``run --engine``, ``conformance --engine``, ``capacity --engine``, ``schemes --engine``,
the report's "runs on" column and pre-flight; none of them keeps its own list, and none tests a scheme
string's prefix: :func:`engine_of_scheme` says whose codec family a scheme is.

An engine evalkit only models (SGLang, TensorRT-LLM: profiles and dtypes, no backend) is declared the
same way without a backend; ``run --engine`` and grids list the engines that have one (:func:`choices`).

Hooks are ``"module:function"`` strings, imported only when used, so declaring an engine imports
nothing heavy and an engine that is not installed is still known (and refused in one line when
used). More engines come from the modules named in ``EVALKIT_ENGINES`` (comma-separated) or the
``evalkit.engines`` entry-point group, which call :func:`register_engine` (as tests do with a
test-only engine).

Scale-out. An engine's own parallelism and sizing options (vLLM's ``tensor_parallel_size``,
``pipeline_parallel_size``, ``distributed_executor_backend``, ``max_model_len``,
``gpu_memory_utilization``; llama.cpp's threads and context) are declared as :attr:`Engine.options`
with their defaults; a grid gives them under ``engine_options:`` and a run records the ones it sets
in its run id (they can change the engine's numbers: another reduction order across ranks).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evalkit.errors import EvalkitError
from evalkit.runtime.plugins import import_once, plugin_modules

if TYPE_CHECKING:  # the profiles import the KV formats (torch): the registry is read without them
    from evalkit.engines.profiles import EngineProfile
    from evalkit.kv.scheme import Scheme

EMULATION = "emulation"  # evalkit's own emulation: not an engine, the default everywhere
PLUGINS_ENV = "EVALKIT_ENGINES"  # comma-separated modules that register engines
ENTRY_POINTS = "evalkit.engines"
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass
class Plan:
    """What an engine makes of a grid's (or a run's) request, before anything runs: the schemes as
    it runs them (:class:`~evalkit.kv.scheme.Scheme` values, each once) and the problems found, each ``(key, message)`` with ``key``
    the grid path it belongs to (``("schemes",)``, ``("models", 0)``, ``("engine_options", "x")``)."""

    schemes: list = field(default_factory=list)  # Scheme values
    problems: list[tuple[tuple, str]] = field(default_factory=list)

    def problem(self, key: tuple, message: str) -> None:
        self.problems.append((key, message))


@dataclass(frozen=True)
class Option:
    """One scale-out or sizing option of an engine: its name, type, default and what it does."""

    name: str
    type: type
    default: Any
    help: str

    def coerce(self, value):
        if self.type is int and isinstance(value, bool) or not isinstance(value, self.type):
            if self.type is float and isinstance(value, int) and not isinstance(value, bool):
                return float(value)
            if self.type is str and value is None:
                return None
            raise EvalkitError(f"engine option {self.name}={value!r} must be a {self.type.__name__}: {self.help}")
        return value


@dataclass(frozen=True)
class Engine:
    """A real engine, as declared in ``evalkit/engines/<name>/engine.py`` (see the module docstring).

    ``package``: the importable module that provides it (``vllm``, ``llama_cpp``); ``install``: the
    one-line fix when it is missing; ``backend``: ``"module:callable"`` returning the
    :class:`~evalkit.evals.backend.Backend` for given engine options (None: evalkit models the engine
    but does not run it); ``plan``: ``"module:callable"`` ``(schemes, models, engine_profile, options)
    -> Plan`` for what the declaration cannot say (None: the declared dtypes decide); ``devices``: where
    it runs; ``versions``: per released version, newest first, the ``kv_cache_dtype`` values it takes
    (:class:`~evalkit.engines.declaration.EngineVersion`); ``conformance`` / ``capacity``:
    ``"module:callable"`` ``(args) -> exit code`` for ``conformance --engine`` / ``capacity --engine``
    (None: refused, or for ``capacity`` its declared dtypes counted); ``profiles``: its
    :class:`~evalkit.engines.profiles.EngineProfile` objects; ``codec_family``: the prefix of its codec
    family (``vllm`` for ``vllm:<dtype>``); ``family_profile``: what the report's "runs on" column names
    for that family's schemes (default: the engine's name); ``distributions``: the package names its
    result rows carry as their backend (``llama-cpp-python 0.3.36``), when they are not a profile's;
    ``setting``: ``"module:callable"`` ``(scheme text) -> str``, the operator's flags for one of its
    family's schemes; ``order``: where its profiles stand among others' in listings and the report;
    ``options``: its scale-out options."""

    name: str
    package: str
    install: str
    description: str
    backend: str | None = None
    plan: str | None = None
    devices: tuple[str, ...] = ("cpu",)
    conformance: str | None = None
    capacity: str | None = None
    profiles: tuple = ()
    options: tuple[Option, ...] = ()
    aliases: tuple[str, ...] = ()
    versions: tuple = ()
    codec_family: str | None = None
    family_profile: str | None = None
    distributions: tuple[str, ...] = ()
    setting: str | None = None
    order: int = 100

    @property
    def runnable(self) -> bool:
        """Whether evalkit runs through it (it has a backend), rather than only modelling it."""
        return self.backend is not None

    @property
    def family_label(self) -> str:
        """The "runs on" name of its codec family's schemes."""
        return self.family_profile or self.name

    def installed(self) -> bool:
        """Whether the engine's package can be imported here (nothing is imported)."""
        try:
            return importlib.util.find_spec(self.package) is not None
        except (ImportError, ValueError):
            return False

    def require(self) -> None:
        """EvalkitError (one line) unless the engine is installed."""
        if not self.installed():
            raise EvalkitError(f"engine {self.name} is not installed (no {self.package} module): {self.install}")

    def hook(self, what: str):
        """The callable behind hook ``what`` (``backend``, ``plan``, ``conformance``, ``capacity``,
        ``setting``). ``plan`` is :meth:`plan_for`: the declaration's checks, then the engine's own."""
        if what == "plan" and self.runnable:
            return self.plan_for
        if what in ("backend", "plan") and not self.runnable:
            profiles = ", ".join(p.name for p in self.profiles)
            measure = f" (measure its numerics with --engine-profile {profiles})" if profiles else ""
            raise EvalkitError(
                f"evalkit models engine {self.name} but does not run it{measure}: run with one of "
                f"{', '.join(engine_names())}"
            )
        path = getattr(self, what)
        if path is None:
            raise EvalkitError(
                f"engine {self.name} has no `{what}` command: use one of the engines that do ({_with(what)})"
            )
        return resolve(path)

    def plan_for(self, schemes: list, models: list, engine_profile: str | None, options: dict) -> Plan:
        """The plan of a grid or a run (``schemes``: Scheme values, parsed where they entered): the validator (:mod:`evalkit.engines.declaration`) refuses models on
        devices the engine does not declare; then the engine's ``plan`` hook, or, without one, the schemes
        its newest version's declared ``kv_cache_dtype`` values run (an engine profile refused: it has none)."""
        from evalkit.engines.declaration import device_problems, scheme_problems

        problems = device_problems(self, models)
        if self.plan is not None:
            out = resolve(self.plan)(schemes, models, engine_profile, options)
        else:
            out = Plan()
            if engine_profile is not None:
                out.problem(
                    ("engine_profile",), f"engine {self.name} runs its declared kv_cache_dtypes: drop the profile"
                )
            out.schemes, refused = scheme_problems(self, schemes)
            for message in refused:
                out.problem(("schemes",), message)
        out.problems[:0] = problems
        return out

    def cache_type(self, scheme) -> str | None:
        """The name of this engine's own cache type that ``scheme`` (a Scheme) is, when it is one of its codec
        family's (``int8_per_token_head`` for ``vllm:int8_per_token_head+skip=0``), or None."""
        from evalkit.kv.codec import family_of

        family = family_of(scheme.recipe)
        if family is None or self.codec_family is None or family.prefix != self.codec_family:
            return None
        return family.cache_type(scheme)

    def option_values(self, given: dict | None) -> dict:
        """The engine options a run sets (only those given, coerced), refusing an unknown one in one line."""
        given = dict(given or {})
        known = {o.name: o for o in self.options}
        unknown = sorted(set(given) - set(known))
        if unknown:
            names = ", ".join(known) or "none"
            raise EvalkitError(f"engine {self.name} has no option {unknown[0]!r}: its options are {names}")
        return {k: known[k].coerce(v) for k, v in sorted(given.items())}


def resolve(path: str):
    """The object named by ``"module:attr"``."""
    module, _, attr = path.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


#: name -> Engine registered in this process (built-ins, plugins, tests)
_REGISTRY: dict[str, Engine] = {}
_loaded: set[str] = set()


def register_engine(engine: Engine) -> Engine:
    """Make ``engine`` known by its name (and aliases). The same declaration again is a no-op; another
    under a taken name is refused."""
    if not _NAME.match(engine.name) or engine.name == EMULATION:
        raise EvalkitError(
            f"engine name {engine.name!r} must be lower-case letters, digits and _ and not {EMULATION!r}"
        )
    for name in (engine.name, *engine.aliases):
        if _REGISTRY.get(name, engine) != engine:
            raise EvalkitError(f"engine {name!r} is registered twice: rename one")
    for name in (engine.name, *engine.aliases):
        _REGISTRY[name] = engine
    return engine


def unregister_engine(name: str) -> None:
    """Forget an engine registered at run time (tests)."""
    engine = _REGISTRY.pop(name, None)
    for alias in engine.aliases if engine else ():
        _REGISTRY.pop(alias, None)


def _builtin_modules() -> list[str]:
    """The declaration modules of the built-in engines: ``evalkit/engines/<name>/engine.py``."""
    here = Path(__file__).resolve().parent
    return [
        f"evalkit.engines.{d.name}.engine"
        for d in sorted(here.iterdir())
        if d.is_dir() and (d / "engine.py").is_file() and _NAME.match(d.name)
    ]


def _load() -> None:
    import_once(
        [*_builtin_modules(), *plugin_modules(PLUGINS_ENV, ENTRY_POINTS)],
        _loaded,
        "engine",
        f"built in, from {PLUGINS_ENV} or the {ENTRY_POINTS} entry points",
    )


def engines() -> dict[str, Engine]:
    """name -> Engine for every engine known here (aliases left out), in registration order."""
    _load()
    return {e.name: e for e in _REGISTRY.values()}


def engine_names() -> list[str]:
    """Every engine evalkit runs through (it has a backend), in alphabetical order: messages and listings
    read the same whichever engine module a process happened to import first."""
    return sorted(n for n, e in engines().items() if e.runnable)


def choices() -> tuple[str, ...]:
    """What ``--engine`` and a grid's ``engine:`` accept: the emulation, then every engine it runs through."""
    return (EMULATION, *engine_names())


def in_order() -> list[Engine]:
    """Every declared engine, in the order its profiles are listed (``order``, then name)."""
    return sorted(engines().values(), key=lambda e: (e.order, e.name))


def profiles() -> dict:
    """Profile name -> :class:`~evalkit.engines.profiles.EngineProfile`, from every engine's declaration, in
    :func:`in_order`; a name two engines declare is refused."""
    out: dict = {}
    for e in in_order():
        for p in e.profiles:
            if out.get(p.name, p) is not p:
                raise EvalkitError(f"engine profile {p.name!r} is declared twice (engine {e.name}): rename one")
            out[p.name] = p
    return out


def engine_of_profile(name: str) -> Engine | None:
    """The engine that declares profile ``name``, or None."""
    return next((e for e in in_order() if any(p.name == name for p in e.profiles)), None)


def engine_of_scheme(scheme) -> Engine | None:
    """The engine whose codec family ``scheme`` (a Scheme) belongs to (``vllm:<dtype>``: vLLM), or None
    (evalkit's own schemes, or a family no engine declares)."""
    from evalkit.kv.codec import family_of

    family = family_of(scheme.recipe)
    if family is None:
        return None
    return next((e for e in in_order() if e.codec_family == family.prefix), None)


def family_labels() -> dict[str, Engine]:
    """ "runs on" label -> engine, for engines known by their codec family alone (no profile of their own,
    llama.cpp)."""
    return {e.family_label: e for e in in_order() if e.codec_family and not e.profiles}


def engine_of_distribution(backend: str) -> Engine | None:
    """The engine whose result rows carry ``backend`` (``llama-cpp-python 0.3.36``), or None."""
    head = str(backend).split()[0] if backend else ""
    return next((e for e in in_order() if head in e.distributions), None)


def get_engine(name: str) -> Engine:
    """The engine called ``name`` (or an alias), or EvalkitError (one line) naming the known ones."""
    _load()
    if name not in _REGISTRY:
        raise EvalkitError(f"unknown engine {name!r}: use one of {', '.join(choices())}")
    return _REGISTRY[name]


def _with(what: str) -> str:
    return ", ".join(e.name for e in engines().values() if getattr(e, what) is not None) or "none"


class _Profiles(Mapping):
    """Every engine profile, read from the engines' declarations (each engine's folder declares its own,
    :func:`evalkit.engines.registry.profiles`) each time it is read, so an engine registered later (a
    plugin, a test-only engine) is in it; in the engines' listing order."""

    def _table(self) -> dict:
        return profiles()

    def __getitem__(self, name: str) -> EngineProfile:
        return self._table()[name]

    def __iter__(self):
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        return f"PROFILES({', '.join(self)})"


PROFILES: Mapping[str, EngineProfile] = _Profiles()


def get_profile(name: str) -> EngineProfile:
    """The engine profile called ``name`` (SchemeError listing the names otherwise)."""
    from evalkit.errors import SchemeError

    table = dict(PROFILES)
    try:
        return table[name]
    except KeyError:
        raise SchemeError(f"unknown engine profile {name!r}: use one of {', '.join(table)}") from None


def apply_profile(scheme: Scheme | str, name: str | None, *, out_dir: str | Path | None = None) -> Scheme:
    """``scheme`` (a Scheme or its string) as engine ``name`` runs it
    (:meth:`~evalkit.engines.profiles.EngineProfile.apply`); no profile: the scheme as given."""
    from evalkit.kv.scheme import parse_scheme

    scheme = parse_scheme(scheme) if isinstance(scheme, str) else scheme
    return scheme if not name else get_profile(name).apply(scheme, out_dir=out_dir)
