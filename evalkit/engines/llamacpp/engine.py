"""llama.cpp, declared as an engine (:mod:`evalkit.engines.registry`).

Local users run llama.cpp with ``--cache-type-k/-v`` one of ``f32 f16 bf16 q8_0 q4_0 q4_1 iq4_nl q5_0
q5_1``. evalkit names each pair as a scheme, ``llamacpp:<k>[/<v>]`` (:mod:`evalkit.kv.codecs.llamacpp.family`,
ggml's blocks exactly as the CPU cache write stores them), which the emulation runs through its storage
cache and ``--engine llamacpp`` runs through llama.cpp itself (llama-cpp-python, built from source by
pip: ``pip install -e ".[llamacpp]"``) on the same GGUF weights:
``run --engine llamacpp --schemes llamacpp:q8_0`` (the baseline is llama.cpp's f16 cache),
``conformance --engine llamacpp`` (ggml's quantizers against evalkit's encoder byte for byte, then
llama.cpp's perplexity change against the emulation's), ``capacity --engine llamacpp`` (llama.cpp's own
KV buffer against evalkit's bytes per token).

What it refuses, in one line, before anything loads: a scheme that is not a llama.cpp cache type (the
engine runs llama.cpp's kernels, not evalkit's formats), a model that is not a GGUF file (the embedded
model, a ``.gguf`` path, or a folder holding one), a device other than the CPU, a quantized V cache with
``flash_attn`` off (llama.cpp's own rule: a V block needs the non-transposed layout of flash attention).

Options (in the run id when set): ``n_threads`` (default 2), ``n_ctx`` (default: the longest request,
padded to 256 as llama.cpp pads it), ``n_batch`` (default 512) and ``flash_attn`` (default true, for the
baseline as for every scheme, so that a change is the cache's alone).
"""

from __future__ import annotations

from evalkit.engines.declaration import CacheType, EngineVersion
from evalkit.engines.registry import Engine, Option, Plan, register_engine

PREFIX = "llamacpp:"
BASELINE_TYPES = ("f16", "f16")  # llama.cpp's default cache: the engine's unquantized baseline
QUANTIZED = ("q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
DEFAULTS = {"n_threads": 2, "n_ctx": None, "n_batch": 512, "flash_attn": True}


def cache_types(scheme) -> tuple[str, str]:
    """``(type_k, type_v)`` llama.cpp runs for ``scheme`` (a Scheme or its string): ``auto`` (the
    unquantized baseline) is llama.cpp's default f16 cache, ``bf16`` and ``fp16`` its bf16 and f16
    types; anything but ``llamacpp:<k>[/<v>]`` is refused in one line."""
    from evalkit.errors import SchemeError
    from evalkit.kv.scheme import parse_scheme

    text = str(parse_scheme(str(scheme)))
    if text == "auto":
        return BASELINE_TYPES
    if text in ("bf16", "fp16"):
        return ("bf16", "bf16") if text == "bf16" else ("f16", "f16")
    head = text.split("+", 1)[0]
    if not head.startswith(PREFIX) or "+" in text:
        raise SchemeError(
            f"engine llamacpp runs llama.cpp's own KV cache types, not {text}: write llamacpp:<k>[/<v>] with "
            f"types f16, bf16, {', '.join(QUANTIZED)} (e.g. llamacpp:q8_0 or llamacpp:q8_0/q4_0)"
        )
    k, _, v = head[len(PREFIX) :].partition("/")
    return k, v or k


def check_types(type_k: str, type_v: str, flash_attn: bool) -> None:
    """llama.cpp's own refusals for a cache pair (one line): a quantized V needs flash attention."""
    from evalkit.errors import EvalkitError

    if type_v in QUANTIZED and not flash_attn:
        raise EvalkitError(
            f"llama.cpp needs flash attention for a quantized V cache ({type_v}): drop flash_attn=false "
            "(--engine-option flash_attn=true), or store V as f16"
        )


def plan(schemes: list, models: list, engine_profile: str | None, options: dict) -> Plan:
    """The schemes (:class:`~evalkit.kv.scheme.Scheme` values) as llama.cpp runs them (unchanged); a scheme,
    model or option it cannot honour is a problem."""
    from evalkit.errors import EvalkitError

    out = Plan()
    settings = {**DEFAULTS, **options}
    if engine_profile is not None:
        out.problem(
            ("engine_profile",),
            f"engine llamacpp runs llama.cpp's own cache types (llamacpp:<k>[/<v>]), not profile {engine_profile}: drop it",
        )
    for i, m in enumerate(models):
        if m.device_map is not None:  # the device itself: the declaration's validator (evalkit.engines.declaration)
            out.problem(
                ("models", i), f"engine llamacpp runs llama-cpp-python's CPU build: drop device_map for {m.name}"
            )
        try:
            from evalkit.engines.llamacpp.gguf import gguf_path

            gguf_path(m.name)
        except EvalkitError as exc:
            out.problem(("models", i), str(exc))
    for scheme in schemes:
        try:
            k, v = cache_types(scheme)
            check_types(k, v, settings["flash_attn"])
            out.schemes.append(scheme)
        except EvalkitError as exc:
            out.problem(("schemes",), str(exc))
    out.schemes = list(dict.fromkeys(out.schemes))
    return out


def setting(text: str) -> str:
    """llama.cpp's flags for scheme ``text``: ``--cache-type-k q8_0 --cache-type-v q4_0 --flash-attn on``
    (the unquantized baseline is its default f16 cache)."""
    k, v = cache_types(text)
    fa = " --flash-attn on" if v in QUANTIZED else ""
    return f"--cache-type-k {k} --cache-type-v {v}{fa}"


# llama.cpp's cache types (--cache-type-k/-v; a pair writes llamacpp:<k>/<v>), as llama-cpp-python 0.3.36 takes them
_SOURCE = "ggml/include/ggml.h (ggml_type), llama-cpp-python 0.3.36 (type_k, type_v)"
VERSIONS = (
    EngineVersion(
        "0.3.36",
        ("cpu",),
        (
            CacheType("f16", "auto", "llama.cpp's default cache, the engine's unquantized baseline", _SOURCE),
            *(
                CacheType(t, f"{PREFIX}{t}", "ggml's block, as the CPU cache write stores it", _SOURCE)
                for t in ("f32", "bf16", *QUANTIZED)
            ),
        ),
    ),
)

ENGINE = register_engine(
    Engine(
        name="llamacpp",
        package="llama_cpp",
        install="pip install -e '.[llamacpp]' (builds llama-cpp-python from source, about 5 min on 2 cores)",
        description="llama.cpp (llama-cpp-python): perplexity, decode, generation and lm-eval through llama.cpp's own KV cache",
        backend="evalkit.engines.llamacpp.backend:from_options",
        plan="evalkit.engines.llamacpp.engine:plan",
        devices=("cpu",),
        conformance="evalkit.engines.llamacpp.conformance:run_cli",
        capacity="evalkit.engines.llamacpp.capacity:run_cli",
        versions=VERSIONS,
        codec_family=PREFIX.rstrip(":"),
        family_profile="llama.cpp",
        distributions=("llama-cpp-python",),
        setting="evalkit.engines.llamacpp.engine:setting",
        order=30,
        options=(
            Option("n_threads", int, DEFAULTS["n_threads"], "CPU threads llama.cpp computes with"),
            Option("n_ctx", int, None, "the context llama.cpp allocates (default: the longest request)"),
            Option("n_batch", int, DEFAULTS["n_batch"], "tokens per llama_decode call"),
            Option("flash_attn", bool, True, "flash attention (a quantized V cache needs it)"),
        ),
        aliases=("llama.cpp", "llama_cpp"),
    )
)
