"""The entries a grid file lists, each parsed and checked where it stands: ``models`` (names or
mappings of model settings; a local folder must exist now), ``schemes`` (strings, or ``expand:``
products of formats, granularities and scale sources) and ``evals`` (each eval's parameters, once
per seed; their corpus files are checked by the grid, :func:`evalkit.data.corpus_check.corpus_problems`).

Kept apart from :mod:`evalkit.sweep.grid`, which reads the file, checks its top-level keys and the
engine settings, and expands the entries parsed here into runs. Every problem is raised (or, inside
``doc.collecting()``, recorded) as ``FILE:LINE: KEY: what is wrong`` from the YAML node marks, so a
grid's problems are listed together before anything runs. :func:`grid_schemes` gives, with the
schemes, the entry each comes from, for problems found after parsing (an engine profile's refusal);
:func:`scheme_entries` reads the same map off a grid file for the pre-flight report.
"""

from __future__ import annotations

import dataclasses

from evalkit.errors import EvalkitError
from evalkit.kv.scheme import Scheme, declare_scales, parse_schemes
from evalkit.models.decode_path import DECODE_PATHS
from evalkit.sweep.located_yaml import GridError, Located
from evalkit.sweep.spec import ModelSpec, canonical_json

MODEL_KEYS = (
    "name",
    "dtype",
    "device",
    "device_map",
    "attn_implementation",
    "trust_remote_code",
    "gpus",
    "decode_path",
)
EXPAND_KEYS = ("formats", "granularities", "scales", "options")


def _strings(doc: Located, value, path: tuple, what: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise doc.error(path, f"give {what} as a non-empty list of strings")
    return value


def grid_models(doc: Located, value) -> list[ModelSpec]:
    if not isinstance(value, list) or not value:
        raise doc.error(("models",), "give a non-empty list of models, e.g. [embedded]")
    out = []
    for i, m in enumerate(value):
        with doc.collecting():
            out.append(_model(doc, m, ("models", i)))
    return list(dict.fromkeys(out))


def _model(doc: Located, m, path: tuple) -> ModelSpec:
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
    if spec.decode_path not in DECODE_PATHS:
        raise doc.error(
            path + ("decode_path",), f"decode_path is one of {', '.join(DECODE_PATHS)}, not {spec.decode_path!r}"
        )
    if spec.gpus and "device" not in m and "device_map" not in m:  # GPUs asked for: the model goes on them
        spec = dataclasses.replace(spec, **({"device": "cuda"} if spec.gpus == 1 else {"device_map": "auto"}))
    _check_folder(doc, spec.name, path + ("name",) if "name" in m else path)
    return spec


def _check_folder(doc: Located, name: str, path: tuple) -> None:
    """A model named as a local folder (starting with '.', '/' or '~') must exist now, not when its
    first run starts mid-sweep; hub ids and embedded names are the loader's to check."""
    from evalkit.models.loading import embedded_name, is_path_like, local_folder

    if not embedded_name(name) and is_path_like(name):
        try:
            local_folder(name)
        except EvalkitError as exc:
            raise doc.error(path, str(exc)) from None


def _parse_schemes(doc: Located, text, path: tuple) -> list[Scheme]:
    """A scheme string (an entry, or an expansion's product): one scheme, or several separated by commas (``run --schemes A,B`` as written;
    :func:`~evalkit.kv.scheme.parse_schemes` splits only where a scheme starts, so ``skip=0,5`` stays whole)."""
    if not isinstance(text, str):
        raise doc.error(path, f"a scheme is a string like fp8_e4m3/head/dynamic, got {text!r}")
    try:
        schemes = parse_schemes(text)
    except EvalkitError as exc:
        raise doc.error(path, str(exc)) from None
    if not schemes:
        raise doc.error(path, f"the scheme entry {text!r} names no scheme: write one like fp8_e4m3/head/dynamic")
    return schemes


def grid_schemes(doc: Located, value, scales: tuple[str, str] | None = None) -> tuple[list[Scheme], dict[str, tuple]]:
    """The grid's schemes as :class:`~evalkit.kv.scheme.Scheme` values, each once, in the order given, and
    the key path of the entry that gives each (canonical string -> path, as :func:`scheme_entries`), so that
    a problem found later (an engine profile's refusal) names that entry's line: a scheme string is parsed
    here, once, and travels as a value from here on."""
    if not isinstance(value, list) or not value:
        raise doc.error(("schemes",), "give a non-empty list of schemes (strings or {expand: ...})")
    out: list[Scheme] = []
    entries: dict[str, tuple] = {}
    for i, item in enumerate(value):
        with doc.collecting():
            parsed = _scheme_item(doc, item, ("schemes", i))
            out.extend(parsed)
            for scheme in parsed:
                entries.setdefault(str(scheme), _entry_path(item, i))
    if scales is not None and out:  # --scales-model/--scales-format: on every static scheme
        try:
            declared = declare_scales(out, *scales)
        except EvalkitError as exc:
            raise doc.error(("schemes",), str(exc)) from None
        entries.update({str(d): entries[str(s)] for s, d in zip(out, declared) if str(s) in entries})
        out = declared
    return list(dict.fromkeys(out)), entries


def scheme_entries(doc: Located) -> dict[str, tuple]:
    """Canonical scheme string -> the key path of the ``schemes`` entry that gives it, so that a problem
    found after parsing (:mod:`evalkit.sweep.preflight`) names that entry's line; an entry that does not
    parse gives none (parsing the grid reports it)."""
    entries = doc.value.get("schemes") if isinstance(doc.value, dict) else None
    out: dict[str, tuple] = {}
    for i, item in enumerate(entries if isinstance(entries, list) else []):
        try:
            for scheme in _scheme_item(doc, item, ("schemes", i)):
                out.setdefault(str(scheme), _entry_path(item, i))
        except GridError:
            continue  # recorded where the grid is parsed, not here
    return out


def _entry_path(item, i: int) -> tuple:
    """The key path of the ``schemes`` entry ``item`` at position ``i`` (an expansion's ``expand`` key)."""
    return ("schemes", i) + (("expand",) if isinstance(item, dict) else ())


def _scheme_item(doc: Located, item, path: tuple) -> list[Scheme]:
    """The schemes of one entry of ``schemes`` (a string of one scheme or several, or an expansion)."""
    out: list[Scheme] = []
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
                    out.extend(_parse_schemes(doc, f"{f}/{g}/{s}{options}", epath))
    else:
        out.extend(_parse_schemes(doc, item, path))
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


def grid_evals(doc: Located, value, seeds: list[int] | None) -> list[tuple[str, str, str]]:
    """(eval name, canonical params JSON, full params JSON) per eval and seed."""
    if not isinstance(value, dict) or not value:
        raise doc.error(("evals",), "give a mapping of eval name to its parameters, e.g. {perplexity: {window: 256}}")
    out = []
    for name, params in value.items():
        with doc.collecting():
            out.extend(_eval_entry(doc, name, params, seeds))
    return out


def _eval_entry(doc: Located, name, params, seeds: list[int] | None) -> list[tuple[str, str, str]]:
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
        out.append((name, canonical_json(ev.canonical_params()), canonical_json(ev.params)))
    return out
