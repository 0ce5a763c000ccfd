"""`evalkit schemes`: formats, granularities, scale sources and dtypes, named schemes, with bytes per cached element."""

from __future__ import annotations

import textwrap

from evalkit.cli import COMMANDS
from evalkit.errors import SchemeError
from evalkit.kv.codec import families
from evalkit.kv.formats import FORMATS, SCALE_DTYPE_HELP
from evalkit.kv.memory import bytes_per_element
from evalkit.kv.scheme import GRANULARITY_HELP, NAMED_SCHEMES, SCALE_HELP, GranularityKind, ScaleSource, Scheme

EXAMPLE_GRANULARITIES = ["tensor", "head", "block16", "token", "group16", "group32"]
GRAMMAR = (
    "FORMAT/GRANULARITY/SCALES[+scale_dtype=e4m3|e8m0][+tensor_scale=fp32][+recipe=sglang][+scales=PATH][+rounding=rtz|rna]"
    "[+skip=0,5|sliding][+attn=fa3][+rope=bf16], or NAME[+skip=...][+attn=fa3][+rope=bf16], or "
    "vllm:<kv_cache_dtype>[+skip=...] (see --engine vllm), or auto (the baseline), bf16, fp16"
)


def add_parser(sub):
    p = sub.add_parser("schemes", help=COMMANDS["schemes"])
    p.add_argument(
        "--head-dim", type=int, default=64, help="head_dim used for the bytes-per-element column (default 64)"
    )
    p.add_argument(
        "--engine",
        choices=("vllm",),
        default=None,
        help="list the installed engine's own kv_cache_dtypes: the vllm:<dtype> scheme modelling each (or why "
        "none does), its bytes per token on --model as the engine allocates them, and the kernel it was read from",
    )
    p.add_argument(
        "--model",
        default=None,
        help="with --engine: a preset (capacity --list-presets), the embedded model (default), a folder or hub id "
        "(only its config is read)",
    )
    p.add_argument("--json", action="store_true", help="with --engine: print the table as JSON")
    p.set_defaults(handler=run)


def _cell(text: str, head_dim: int) -> str:
    """Bytes per element of a scheme string, or '-' where the scheme does not exist (FP4 needs group
    scales) or its group does not divide head_dim."""
    try:
        scheme = Scheme.parse(text)
        granularity = scheme.granularity
        if granularity.kind is GranularityKind.GROUP and head_dim % granularity.size:
            return f"{'-':>10}"
        return f"{bytes_per_element(scheme, head_dim):>10.4g}"
    except SchemeError:
        return f"{'-':>10}"


def run(args) -> int:
    if args.engine:
        return run_engine(args)
    if args.model or args.json:
        raise SchemeError("--model and --json go with --engine vllm: add --engine vllm, or drop them")
    if args.head_dim < 1:
        raise SchemeError(f"--head-dim must be a positive number of channels, got {args.head_dim}")
    print(f"Scheme string: {GRAMMAR}\n")
    print("Formats (scale dtypes each takes):")
    for f in FORMATS.values():
        dtypes = "" if f.is_identity else f"  [scales: {', '.join(d.value for d in f.scale_dtypes)}]"
        print(f"  {f.name:<14} {f.description}{dtypes}")
    print("\nGranularities (elements sharing one scale):")
    for kind, text in GRANULARITY_HELP.items():
        label = kind.value + ("<N>" if kind in (GranularityKind.BLOCK, GranularityKind.GROUP) else "")
        print(f"  {label:<14} {text}")
    print("\nScale sources:")
    for src, text in SCALE_HELP.items():
        print(f"  {src.value:<14} {text}")
    print("\nScale dtypes (+scale_dtype=; e4m3 and e8m0 scales are per group<N> and dynamic only):")
    for dtype, text in SCALE_DTYPE_HELP.items():
        print(f"  {dtype.value:<14} {text}")
    print("\nNamed schemes (the name is the canonical string; the long form parses to the same scheme):")
    for name, named in NAMED_SCHEMES.items():
        print(f"  {name:<14} {named.description}\n  {'':<14} = {named.long_form()}")
    print(
        f"\nBytes per cached element (data + scales at their storage size, head_dim {args.head_dim}; "
        "tensor/head scales are per sequence, so their overhead per token tends to 0; "
        "'-': not a valid scheme, or a group that does not divide head_dim):"
    )
    print(f"  {'format':<14}" + "".join(f"{g:>10}" for g in EXAMPLE_GRANULARITIES))
    print(f"  {'auto':<14}" + f"{bytes_per_element(Scheme(), args.head_dim):>10.4g}" + "  (baseline; bf16, fp16 alike)")
    for name, fmt in FORMATS.items():
        if fmt.is_unscaled:
            continue
        print(
            f"  {name:<14}"
            + "".join(_cell(f"{name}/{g}/{ScaleSource.DYNAMIC.value}", args.head_dim) for g in EXAMPLE_GRANULARITIES)
        )
    print()
    for name, named in NAMED_SCHEMES.items():
        print(
            f"  {name:<14}"
            + _cell(name, args.head_dim)
            + f"  ({named.format} in group{named.group}, {named.scale_dtype.value} scales"
            + (" + one fp32 per tensor" if named.tensor_scale else "")
            + ")"
        )
    print_families()
    return 0


def print_families() -> None:
    """Every registered codec family (:mod:`evalkit.kv.codec`): its prefix, engine, grammar and names."""
    print("\nEngine cache types (a codec family per engine, PREFIX:NAME; bytes per token: capacity --schemes):")
    for prefix, family in families().items():
        print(f"  {prefix + ':':<14} {family.engine}: {family.grammar}")
        names = textwrap.wrap(", ".join(family.names()), 100)
        print("\n".join(f"  {'':<14} {line}" for line in names))


def _engine_layout(model: str | None):
    """(label, KVLayout) of --model: a preset, the embedded model (its preset), or a folder / hub id's config."""
    from evalkit.models.info import kv_layout
    from evalkit.models.loading import DEFAULT_MODEL, embedded_name, model_source
    from evalkit.models.presets import PRESETS, config_namespace

    name = model or DEFAULT_MODEL
    preset = embedded_name(name) or name
    if preset in PRESETS:
        return f"{name} ({PRESETS[preset]['hub_id']})", kv_layout(config_namespace(PRESETS[preset]["config"]))
    from transformers import AutoConfig

    path, local_only = model_source(name)
    try:
        return name, kv_layout(AutoConfig.from_pretrained(path, local_files_only=local_only))
    except (OSError, ValueError) as exc:
        raise SchemeError(f"could not read the config of {name!r}: {str(exc).splitlines()[0]}") from None


def run_engine(args) -> int:
    """``schemes --engine vllm``: every kv_cache_dtype of the installed vLLM, as evalkit models it."""
    import json

    from evalkit.engines.vllm.dtypes import rows
    from evalkit.engines.vllm.kernel import check_vllm_available

    check_vllm_available()
    label, layout = _engine_layout(args.model)
    import vllm

    table = rows(layout)
    if args.json:
        out = {"engine": "vllm", "version": vllm.__version__, "model": label, "dtypes": [r.to_dict() for r in table]}
        print(json.dumps(out, indent=1))
        return 0
    print(f"vLLM {vllm.__version__} kv_cache_dtypes on {label} (bytes per token: all layers, as vLLM allocates):")
    print(f"  {'kv_cache_dtype':<20} {'vLLM B/tok':>10} {'evalkit':>10}  scheme, or why none")
    for r in table:
        ours = f"{r.evalkit_bytes_per_token:>10.0f}" if r.evalkit_bytes_per_token is not None else f"{'-':>10}"
        theirs = f"{r.vllm_bytes_per_token:>10}" if r.vllm_bytes_per_token is not None else f"{'-':>10}"
        print(f"  {r.kv_cache_dtype:<20} {theirs} {ours}  {r.scheme or r.reason}")
        print(f"  {'':<20} {'':>21}  kernel: {r.source} {r.function}")
    return 0
