"""The evaluation registry: the built-in evaluations (subpackages of :mod:`evalkit.evals` holding an
``evaluation`` module, imported only when asked for), and others registered with :func:`register_eval`
by a module named in ``EVALKIT_EVALS`` or in the ``evalkit.evals`` entry-point group.

:func:`registry` gives name -> ``"module"`` or ``"module:Class"`` for every known eval; a sweep passes it
to its workers, so evals registered at run time resolve the same way there.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from pathlib import Path

from evalkit.errors import EvalkitError
from evalkit.runtime.plugins import entry_points_of, import_once, plugin_modules

# ---- registry ----------------------------------------------------------------------------------
PLUGINS_ENV = "EVALKIT_EVALS"  # comma-separated modules that register evaluations
ENTRY_POINTS = "evalkit.evals"  # entry-point group of installed packages' evaluation modules
PARAMS_ENTRY_POINTS = "evalkit.eval_params"  # name -> "module:ParamsClass": a plugin's flags, declared light
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

#: name -> "module:Class" of every evaluation registered in this process (tests may add entries)
_REGISTRY: dict[str, str] = {}
_loaded_plugins: set[str] = set()


def register_eval(name: str):
    """Class decorator: make an :class:`Evaluation` subclass the evaluation ``name`` (its flags are
    ``--<name>-<field>``). Registering the same class again is a no-op; another class under a
    taken name is refused."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise EvalkitError(f"eval name {name!r} must be lower-case letters, digits and _ (starting with a letter)")

    def decorate(cls):
        path = f"{cls.__module__}:{cls.__qualname__}"
        if _REGISTRY.get(name, path) != path:
            raise EvalkitError(f"eval {name!r} is registered twice ({_REGISTRY[name]} and {path}): rename one")
        params = cls.__dict__.get("Params") or getattr(cls, "Params", None)
        if params is not None:
            _bind(params, name)
        cls.name = name
        _REGISTRY[name] = path
        return cls

    return decorate


def _bind(params: type, name: str) -> type:
    """Make the Params dataclass ``params`` evaluation ``name``'s (its flags are ``--<name>-<field>``)."""
    bound = params.__dict__.get("eval_name")
    if bound not in (None, name):
        raise EvalkitError(f"{params.__name__} already belongs to eval {bound!r}: give {name!r} its own Params")
    params.eval_name = name
    return params


def _builtin() -> dict[str, str]:
    """name -> module of the built-in evaluations: the subpackages of evalkit.evals with an evaluation module."""
    here = Path(__file__).resolve().parent
    return {
        d.name: f"evalkit.evals.{d.name}.evaluation"
        for d in sorted(here.iterdir())
        if d.is_dir() and (d / "evaluation.py").is_file() and _NAME.match(d.name)
    }


def _load_plugins(skip: Iterable[str] = (), entries: list | None = None) -> None:
    """Import the modules named in EVALKIT_EVALS and the ``evalkit.evals`` entry points (each once; not the
    entry points named in ``skip``; ``entries``: that group's entry points when already read)."""
    import_once(
        plugin_modules(PLUGINS_ENV, ENTRY_POINTS, skip, entries),
        _loaded_plugins,
        "evaluation",
        f"from {PLUGINS_ENV} or the {ENTRY_POINTS} entry points",
    )


def registry() -> dict[str, str]:
    """name -> "module" (a built-in not imported yet) or "module:Class", for every evaluation known here:
    built-ins first (in folder order), then those registered by plugins or at run time."""
    _load_plugins()
    out = _builtin()
    out.update(_REGISTRY)
    return out


def eval_names() -> list[str]:
    return list(registry())


def get_eval(name: str, registry: dict[str, str] | None = None) -> type:
    """The evaluation class registered as ``name`` (in ``registry`` when given: a sweep passes the
    registry it started with to its workers, so evals registered at run time resolve the same way)."""
    known = globals()["registry"]() if registry is None else registry
    if name not in known:
        raise EvalkitError(f"unknown eval {name!r}: use one of {', '.join(known)}")
    path = known[name]
    if ":" in path:
        module, cls = path.split(":", 1)
        obj = importlib.import_module(module)
        for part in cls.split("."):
            obj = getattr(obj, part)
        return obj
    importlib.import_module(path)  # registers its evaluation
    if name not in _REGISTRY:
        raise EvalkitError(
            f"module {path} registers no eval {name!r}: decorate its class with @register_eval({name!r})"
        )
    return get_eval(name, {name: _REGISTRY[name]})


# ---- flags without the evaluation classes ------------------------------------------------------
def _light_params(name: str, module: str) -> type | None:
    """The one Params dataclass declared in ``module`` (a built-in's ``params.py``), or None when it
    declares no single one (the evaluation class then adds its flags)."""
    from evalkit.evals.params import Params

    mod = importlib.import_module(module)
    found = [v for v in vars(mod).values() if isinstance(v, type) and issubclass(v, Params) and v.__module__ == module]
    return _bind(found[0], name) if len(found) == 1 else None


def flag_declarations() -> dict[str, type]:
    """name -> what adds the evaluation's ``run`` flags (``.add_arguments(parser)``), in :func:`registry`'s
    order, importing no evaluation class that declares its flags light: a built-in's Params from its
    folder's ``params.py``, a plugin's Params from its ``evalkit.eval_params`` entry point (named as the
    evaluation). Plugins that declare none (``EVALKIT_EVALS`` modules, other entry points) are imported as
    :func:`registry` imports them, and their evaluation class adds its flags."""
    entries = entry_points_of(ENTRY_POINTS, PARAMS_ENTRY_POINTS)  # one scan of the installed metadata
    light = {ep.name: ep.value for ep in entries[PARAMS_ENTRY_POINTS]}
    _load_plugins(skip=light, entries=entries[ENTRY_POINTS])
    here = Path(__file__).resolve().parent
    out: dict[str, type] = {}
    for name, module in _builtin().items():
        has_params = (here / name / "params.py").is_file()
        params = _light_params(name, module.rsplit(".", 1)[0] + ".params") if has_params else None
        out[name] = params or get_eval(name, {name: module})
    for name, path in _REGISTRY.items():
        if name not in out:
            out[name] = get_eval(name, {name: path})
    for name, path in light.items():
        if name not in out:
            module, _, cls = path.partition(":")
            try:
                out[name] = _bind(getattr(importlib.import_module(module), cls), name)
            except (ImportError, AttributeError) as exc:
                raise EvalkitError(
                    f"the {PARAMS_ENTRY_POINTS} entry point {name} = {path!r} cannot be loaded "
                    f"({type(exc).__name__}: {exc}): fix the name or reinstall the package that declares it"
                ) from None
    return out
