"""`evalkit schemes`: formats, granularities, scale sources and dtypes, named schemes, with bytes per cached element."""

from __future__ import annotations

from evalkit.cli import COMMANDS
from evalkit.errors import SchemeError
from evalkit.kv.formats import FORMATS, SCALE_DTYPE_HELP
from evalkit.kv.memory import bytes_per_element
from evalkit.kv.scheme import GRANULARITY_HELP, NAMED_SCHEMES, SCALE_HELP, GranularityKind, ScaleSource, Scheme

EXAMPLE_GRANULARITIES = ["tensor", "head", "block16", "token", "group16", "group32"]
GRAMMAR = (
    "FORMAT/GRANULARITY/SCALES[+scale_dtype=e4m3|e8m0][+tensor_scale=fp32][+recipe=sglang][+scales=PATH][+rounding=rtz|rna]"
    "[+skip=0,5|sliding][+attn=fa3][+rope=bf16], or NAME[+skip=...][+attn=fa3][+rope=bf16], or bf16"
)


def add_parser(sub):
    p = sub.add_parser("schemes", help=COMMANDS["schemes"])
    p.add_argument(
        "--head-dim", type=int, default=64, help="head_dim used for the bytes-per-element column (default 64)"
    )
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
    print(f"  {'bf16':<14}" + f"{bytes_per_element(Scheme(), args.head_dim):>10.4g}" + "  (baseline)")
    for name, fmt in FORMATS.items():
        if fmt.is_identity:
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
    return 0
