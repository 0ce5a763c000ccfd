"""KV codec families: an engine's own cache types as schemes, found through one registry.

evalkit's scheme grammar (:mod:`evalkit.kv.scheme`) describes caches by format, granularity and scales.
An engine's own cache type is often more: a rotation, a codebook, K and V in different formats, one
packed slot per (token, head), or scales by a rule of its own. Such a type is a *codec*, and an engine's
codecs form a *family*, named in scheme strings by the family's prefix: ``vllm:int4_per_token_head``,
``llamacpp:q8_0/q4_0``. A family (a :class:`CodecFamily`) declares

- ``prefix``, ``engine`` and ``grammar``: how its schemes are written, and whose cache they model;
- :meth:`~CodecFamily.names` and :meth:`~CodecFamily.parse`: the names it accepts and the scheme each is
  (a :class:`~evalkit.kv.scheme.Scheme` whose ``recipe`` is one of the family's
  :class:`~evalkit.kv.formats.CodecRecipe`, which ``+recipe=<value>`` also names);
- :meth:`~CodecFamily.scheme_name` and :meth:`~CodecFamily.check`: the canonical string of such a scheme,
  and the one-line refusal of a recipe written with other formats or scales than its own;
- :meth:`~CodecFamily.check_layout`: the models its engine would not store it for (MLA, head sizes);
- :meth:`~CodecFamily.quantize`: the store itself, K or V (B, H, S, D) to a
  :class:`~evalkit.kv.quantize.Quantized`;
- :meth:`~CodecFamily.codec`: where the type stores packed slot bytes, the :class:`Codec` that says
  what it stores (its bytes per token and head, ``width``), how they read back (``decode``) and how the
  engine treats layers and prefills (see :mod:`evalkit.kv.codecs.slot`); None where the cache keeps codes
  and scales as evalkit's own schemes do;
- :meth:`~CodecFamily.query_rounding`: what its engine's attention does to Q, where that is modelled.

The families evalkit ships live in :mod:`evalkit.kv.codecs` (one folder per engine), imported the first
time this registry is asked; others come from the modules named in ``EVALKIT_CODECS`` or the
``evalkit.codecs`` entry points (:mod:`evalkit.runtime.plugins`), or are registered with
:func:`register_family` (as tests do with a test-only family). The grammar never names a family: it hands
a prefixed name to the family registered for the prefix, and asks the family of a recipe for the rest.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from evalkit.errors import EvalkitError
from evalkit.kv.formats import CodecRecipe, Recipe
from evalkit.runtime.plugins import import_once, plugin_modules

BUILTIN = "evalkit.kv.codecs"  # the package whose import registers the built-in families
PLUGINS_ENV = "EVALKIT_CODECS"  # comma-separated modules that register codec families
ENTRY_POINTS = "evalkit.codecs"
_PREFIX = re.compile(r"^[a-z][a-z0-9_]*$")


class CodecFamily:
    """One engine's codecs (see the module docstring). Subclass it and register an instance; the
    attributes and the methods that raise NotImplementedError are what a family must give.

    ``recipe_hint``: None to list the family's recipe values wherever ``+recipe=`` values are listed,
    or what such a listing says instead (a family with many). ``own_attention``: what its
    :meth:`query_rounding` models, for the refusal of ``+attn=fa3`` beside it."""

    prefix: str = ""  # scheme strings <prefix>:<name>
    engine: str = ""  # whose cache this is, in messages and listings (vLLM, llama.cpp)
    grammar: str = ""  # how its schemes are written, e.g. "vllm:<kv_cache_dtype>[+skip=...]"
    recipe_hint: str | None = None
    own_attention: str | None = None
    # bumped by hand when a commit means to change this family's numbers: re-keys only its runs
    # (evalkit.sweep.code_identity.components), its fingerprint group pinned under the new version
    numerics_version: int = 0

    def recipes(self) -> tuple[CodecRecipe, ...]:
        """Every recipe this family's schemes carry."""
        raise NotImplementedError

    def names(self) -> list[str]:
        """The names it accepts after ``<prefix>:``, for listings (``parse`` may refuse some, in one line)."""
        raise NotImplementedError

    def parse(self, name: str, options: dict) -> Any:
        """The Scheme of ``<prefix>:<name>``; ``options``: the Scheme fields of ``+skip=``, ``+attn=``,
        ``+rope=``. SchemeError, one line, for a name it does not model."""
        raise NotImplementedError

    def scheme_name(self, scheme) -> str:
        """The head of ``scheme``'s canonical string (``vllm:int8_per_token_head``)."""
        raise NotImplementedError

    def cache_type(self, scheme) -> str:
        """The engine's own name of the cache type ``scheme`` is (``int8_per_token_head`` for
        ``vllm:int8_per_token_head+skip=0``): its canonical head after ``<prefix>:``. Asked here (or through the
        engine registry's :meth:`~evalkit.engines.registry.Engine.cache_type`), never cut from a scheme string."""
        return self.scheme_name(scheme)[len(self.prefix) + 1 :]

    def check(self, scheme) -> None:
        """Refuse, in one line, a scheme carrying one of the recipes with formats, scales or rounding
        other than the recipe's own (the ``+recipe=`` long form)."""
        raise NotImplementedError

    def check_layout(self, scheme, is_mla: bool, head_dims: tuple[int, ...]) -> None:
        """Refuse, in one line, a model the engine would not store ``scheme`` for (``head_dims``: K and V
        head sizes, or on MLA the latent and RoPE widths)."""
        raise NotImplementedError

    def quantize(self, x, fmt, role: str):
        """The engine's store of K or V (``role`` ``"k"``/``"v"``) ``x`` (B, H, S, D) under ``fmt`` (the
        scheme's bound format): a :class:`~evalkit.kv.quantize.Quantized`."""
        raise NotImplementedError

    def codec(self, recipe: CodecRecipe):
        """The slot :class:`~evalkit.kv.codecs.slot.Codec` of ``recipe``, or None where the cache keeps
        codes and scales as evalkit's schemes do."""
        return None

    def query_rounding(self, scheme) -> Callable | None:
        """``(query (..., head_dim)) -> query`` as the engine's attention reads Q against ``scheme``'s cache,
        or None (Q as the model computed it)."""
        return None


_FAMILIES: dict[str, CodecFamily] = {}  # prefix -> family
_BY_RECIPE: dict[CodecRecipe, CodecFamily] = {}
_loaded: set[str] = set()
_ready = False  # the built-in and plugin modules are imported (once per process)


def register_family(family: CodecFamily) -> CodecFamily:
    """Make ``family`` known by its prefix and its recipes. The same family again is a no-op; another
    under a taken prefix, or claiming a taken or built-in recipe, is refused."""
    if not _PREFIX.match(family.prefix):
        raise EvalkitError(f"codec family prefix {family.prefix!r} must be lower-case letters, digits and _")
    if _FAMILIES.get(family.prefix) is family:
        return family
    if family.prefix in _FAMILIES:
        raise EvalkitError(f"codec family {family.prefix!r} is registered twice: rename one")
    recipes = family.recipes()
    core = {r.value for r in Recipe}
    for recipe in recipes:
        owner = _BY_RECIPE.get(recipe)
        if recipe.value in core or owner is not None:
            taken = "evalkit's own" if owner is None else f"family {owner.prefix!r}'s"
            raise EvalkitError(f"recipe {recipe.value!r} of family {family.prefix!r} is {taken}: rename it")
    _FAMILIES[family.prefix] = family
    _BY_RECIPE.update(dict.fromkeys(recipes, family))
    return family


def unregister_family(prefix: str) -> None:
    """Forget a family registered at run time (tests)."""
    family = _FAMILIES.pop(prefix, None)
    for recipe in family.recipes() if family else ():
        _BY_RECIPE.pop(recipe, None)


def _load() -> None:
    """Import the built-in families and the plugin modules, once (every lookup asks; after the first
    it costs one test)."""
    global _ready
    if _ready:
        return
    import_once(
        [BUILTIN, *plugin_modules(PLUGINS_ENV, ENTRY_POINTS)],
        _loaded,
        "codec family",
        f"built in, from {PLUGINS_ENV} or the {ENTRY_POINTS} entry points",
    )
    _ready = True


def families() -> dict[str, CodecFamily]:
    """prefix -> family for every family known here, by prefix: listings read the same whichever family
    module a process happened to import first."""
    _load()
    return dict(sorted(_FAMILIES.items()))


def family_for_prefix(prefix: str) -> CodecFamily | None:
    _load()
    return _FAMILIES.get(prefix)


def family_of(recipe) -> CodecFamily | None:
    """The family whose recipe ``recipe`` is; None for evalkit's own recipes (:class:`~evalkit.kv.formats.Recipe`)."""
    if isinstance(recipe, Recipe):
        return None
    _load()
    return _BY_RECIPE.get(recipe)


def recipe_named(value: str) -> CodecRecipe | None:
    """The family recipe whose value is ``value`` (what ``+recipe=`` writes), or None."""
    _load()
    return next((r for r in _BY_RECIPE if r.value == value), None)


def codec_for(recipe):
    """The slot codec of ``recipe`` (:meth:`CodecFamily.codec`), or None."""
    family = family_of(recipe)
    return None if family is None else family.codec(recipe)


def is_codec(recipe) -> bool:
    """Whether ``recipe`` stores an engine's packed slot bytes (it has a slot codec)."""
    return codec_for(recipe) is not None


def check_layout(scheme, is_mla: bool, head_dims: tuple[int, ...]) -> None:
    """The family's one-line refusal of a model its engine would not store ``scheme`` for (nothing for
    evalkit's own schemes)."""
    family = family_of(scheme.recipe)
    if family is not None:
        family.check_layout(scheme, is_mla, head_dims)
