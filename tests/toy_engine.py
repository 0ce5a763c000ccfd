"""A test-only engine, declared here and nowhere else, to show the engine registry at work.

``toy`` answers perplexity through evalkit's emulation under another name (so its rows are the
emulation's numbers, labelled ``toy-engine 1.0``) and takes one scale-out option (``workers``). Like a real
engine it loads the weights itself: evalkit hands it the weightless model handle
(:class:`evalkit.models.handle.ModelHandle`), and the backend loads the model from the handle's folder
through its own reference to the loader, taken when this module is imported (so a test can make evalkit's
own loader raise and see the run succeed). Everything
else is its declaration, which nothing in the package knows and nothing outside this file repeats:

- its device (the CPU) and its one version, ``1.0``, with the ``kv_cache_dtype`` values it takes, each
  mapped to the scheme that models it (``i8h`` is the test-only codec family's ``toy:i8h``,
  :mod:`tests.toy_codec`, whose prefix it declares as its own; ``int4`` is declared and not modelled);
- its engine profile, ``toy-cpu``: FP8 E4M3 per tensor, rounded toward zero, checkpoint scales or 1.0.

Like a GPU engine it is not bit-reproducible across realisations, and it declares the ``noise_floor`` option
that makes a grid (and ``run --engine toy``) add its noise floor run: its second realisation of ``auto`` moves
each scored token's NLL by seeded noise of :data:`REALISATION_NOISE` nat, as another batch composition moves
a GPU engine's log-probs, so that the floor is wide enough to hold a small scheme effect.

No plan and no capacity command: the registry's validator checks devices and schemes against the
declaration, and ``capacity --engine toy`` counts its declared dtypes. It shows up in ``run --engine``,
grids, ``schemes --engine toy``, ``schemes --engine-profile toy-cpu``, ``capacity --engine toy``, the
report's "runs on" column and pre-flight. Tests register it with :func:`registered` (the ``toy_engine``
fixtures).
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

from evalkit.engines.attention_paths import Fact
from evalkit.engines.declaration import CacheType, EngineVersion
from evalkit.engines.profiles import EngineProfile, KVDtype
from evalkit.engines.registry import Engine, Option, register_engine, unregister_engine
from evalkit.evals.backend import Capabilities
from evalkit.evals.emulation.backend import EmulationBackend
from evalkit.kv.codec import register_family
from evalkit.kv.formats import Rounding
from evalkit.models.loading import load_model as _engine_loads

from tests.toy_codec import TOY_FAMILY

DTYPES = (
    CacheType("auto", "auto", "unquantized", "tests/toy_engine.py"),
    CacheType(
        "fp8", "fp8_e4m3/tensor/dynamic", "FP8 E4M3, one scale per layer from the prefill", "tests/toy_engine.py"
    ),
    CacheType("int8", "int8/token/dynamic", "INT8 per token", "tests/toy_engine.py"),
    CacheType("i8h", "toy:i8h", "int8 codes and a float16 scale per token and head", "tests/toy_codec.py"),
    CacheType("int4", None, "the toy's INT4 store was never read", "tests/toy_engine.py"),
)
SCHEMES = tuple(d.scheme for d in DTYPES if d.scheme)
REALISATION_NOISE = 0.1  # nat per token: the spread of the toy's second realisation of auto (its noise floor)

TOY_PROFILE = EngineProfile(
    name="toy-cpu",
    description="the toy engine's FP8 cache, per tensor, rounded toward zero",
    kv_cache_dtypes=(KVDtype("auto", None), KVDtype("fp8_e4m3", "fp8_e4m3", Rounding.RTZ)),
    facts=(Fact("x / scale rounded toward zero", "tests/toy_engine.py"),),
)


class ToyBackend(EmulationBackend):
    """The emulation's numbers, labelled as the toy engine's, on weights the engine loads itself."""

    engine = "toy"

    def __init__(self, options: dict):
        super().__init__()
        self.options = options
        self.noise_floor = bool(options.get("noise_floor"))  # auto scored as a second realisation (stamped rows)
        self.capabilities = Capabilities("toy-engine 1.0", requests=frozenset({"logprobs"}))
        self._weights = None

    def check_eval(self, eval_name: str, params: dict, request: str | None) -> None:
        super(EmulationBackend, self).check_eval(eval_name, params, request)

    def check_model(self, lm) -> None:
        assert lm.model is None, "evalkit loaded the weights of an engine run"

    def _engine_model(self, handle):
        """The engine's own copy of the model the handle names (loaded once, as an engine does)."""
        if self._weights is None:
            loaded = _engine_loads(handle.path, dtype=handle.dtype, device=str(handle.device))
            self._weights = dataclasses.replace(loaded, name=handle.name)
        return self._weights

    def prepare(self, request, lm, workdir):
        super().prepare(request, self._engine_model(lm), workdir)

    def score(self, request, lm, scheme):
        scores = super().score(request, self._engine_model(lm), scheme)
        if self.noise_floor and scheme.is_identity:  # the second realisation of auto
            import torch

            noise = torch.randn(scores.nll.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
            info = {**scores.info, "engine_realisation": f"seeded noise of {REALISATION_NOISE} nat per token"}
            scores = dataclasses.replace(scores, nll=scores.nll + REALISATION_NOISE * noise, info=info)
        return scores


def backend(options: dict):
    return ToyBackend(options)


def conformance(args) -> int:
    print(f"toy conformance: schemes {args.schemes}")
    return 0


TOY_ENGINE = Engine(
    name="toy",
    package="json",
    install="nothing to install",
    description="a test-only engine",
    backend="tests.toy_engine:backend",
    conformance="tests.toy_engine:conformance",
    options=(
        Option("workers", int, 1, "worker count"),
        Option("noise_floor", bool, False, "the run is the toy's noise floor: auto against a second realisation"),
    ),
    devices=("cpu",),
    versions=(EngineVersion("1.0", ("cpu",), DTYPES),),
    profiles=(TOY_PROFILE,),
    codec_family=TOY_FAMILY.prefix,
)


@contextmanager
def registered():
    """The toy engine (and its codec family, which an earlier test's teardown may have taken away) registered
    for the block, forgotten after it."""
    register_family(TOY_FAMILY)
    register_engine(TOY_ENGINE)
    try:
        yield TOY_ENGINE
    finally:
        unregister_engine(TOY_ENGINE.name)
