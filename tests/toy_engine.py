"""A test-only engine, declared here and nowhere else, to show the engine registry at work.

``toy`` answers perplexity through evalkit's emulation under another name (so its rows are the
emulation's numbers, labelled ``toy-engine 1.0``), runs only on the CPU and only the schemes of
``SCHEMES``, takes one scale-out option (``workers``), and has conformance and capacity commands that
print what they were asked. Tests register it with :func:`evalkit.engines.registry.register_engine`
(the ``toy_engine`` fixture); nothing in the package knows it.
"""

from __future__ import annotations

from evalkit.engines.registry import Engine, Option, Plan
from evalkit.evals.backend import Capabilities
from evalkit.evals.emulation.backend import EmulationBackend

SCHEMES = ("auto", "fp8_e4m3/tensor/dynamic", "int8/token/dynamic")


class ToyBackend(EmulationBackend):
    """The emulation's numbers, labelled as the toy engine's."""

    engine = "toy"

    def __init__(self, options: dict):
        super().__init__()
        self.options = options
        self.capabilities = Capabilities("toy-engine 1.0", requests=frozenset({"logprobs"}))

    def check_eval(self, eval_name: str, params: dict, request: str | None) -> None:
        super(EmulationBackend, self).check_eval(eval_name, params, request)


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
