"""A test-only engine, declared here and nowhere else, to show the engine registry at work.

``toy`` answers perplexity through evalkit's emulation under another name (so its rows are the
emulation's numbers, labelled ``toy-engine 1.0``). Like a real engine it loads the weights itself:
evalkit hands it the weightless model handle (:class:`evalkit.models.handle.ModelHandle`), and the
backend loads the model from the handle's folder through its own reference to the loader, taken when
this module is imported (so a test can make evalkit's own loader raise and see the run succeed). It runs
only on the CPU and only the schemes of
``SCHEMES``, takes one scale-out option (``workers``), and has conformance and capacity commands that
print what they were asked. Tests register it with :func:`evalkit.engines.registry.register_engine`
(the ``toy_engine`` fixture); nothing in the package knows it.
"""

from __future__ import annotations

import dataclasses

from evalkit.engines.registry import Engine, Option, Plan
from evalkit.evals.backend import Capabilities
from evalkit.evals.emulation.backend import EmulationBackend
from evalkit.models.loading import load_model as _engine_loads

SCHEMES = ("auto", "fp8_e4m3/tensor/dynamic", "int8/token/dynamic")


class ToyBackend(EmulationBackend):
    """The emulation's numbers, labelled as the toy engine's, on weights the engine loads itself."""

    engine = "toy"

    def __init__(self, options: dict):
        super().__init__()
        self.options = options
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
        return super().score(request, self._engine_model(lm), scheme)


def backend(options: dict):
    return ToyBackend(options)


def plan(schemes, models, engine_profile, options) -> Plan:
    from evalkit.kv.scheme import parse_scheme

    out = Plan()
    for i, m in enumerate(models):
        if m.device != "cpu":
            out.problem(("models", i), f"engine toy runs on the CPU only: run {m.name} on device cpu")
    for text in schemes:
        canonical = str(parse_scheme(text))
        if canonical in SCHEMES:
            out.schemes.append(canonical)
        else:
            out.problem(("schemes",), f"engine toy cannot run {canonical}: use one of {', '.join(SCHEMES)}")
    return out


def conformance(args) -> int:
    print(f"toy conformance: schemes {args.schemes}")
    return 0


def capacity(args) -> int:
    print(f"toy capacity: model {args.model}")
    return 0


TOY_ENGINE = Engine(
    name="toy",
    package="json",
    install="nothing to install",
    description="a test-only engine",
    backend="tests.toy_engine:backend",
    plan="tests.toy_engine:plan",
    conformance="tests.toy_engine:conformance",
    capacity="tests.toy_engine:capacity",
    options=(Option("workers", int, 1, "worker count"),),
)
