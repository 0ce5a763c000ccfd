"""`evalkit schemes`: formats, granularities and scale sources, with bytes per cached element."""

from __future__ import annotations

from evalkit.kv.formats import FORMATS
from evalkit.memory import bytes_per_element
from evalkit.kv.scheme import GRANULARITY_HELP, SCALE_HELP, Granularity, GranularityKind, ScaleSource, Scheme

EXAMPLE_GRANULARITIES = ["tensor", "head", "block16", "token", "group32"]


def add_parser(sub):
    p = sub.add_parser("schemes", help="list KV formats, granularities and scale sources")
    p.add_argument("--head-dim", type=int, default=64, help="head_dim used for the bytes-per-element column (default 64)")
    p.set_defaults(handler=run)


def run(args) -> int:
    print("Scheme string: FORMAT/GRANULARITY/SCALES[+scales=PATH][+skip=0,5|sliding][+attn=fa3][+rope=bf16], or bf16\n")
    print("Formats:")
    for f in FORMATS.values():
        print(f"  {f.name:<14} {f.description}")
    print("\nGranularities (elements sharing one scale):")
    for kind, text in GRANULARITY_HELP.items():
        label = kind.value + ("<N>" if kind in (GranularityKind.BLOCK, GranularityKind.GROUP) else "")
        print(f"  {label:<14} {text}")
    print("\nScale sources:")
    for src, text in SCALE_HELP.items():
        print(f"  {src.value:<14} {text}")
    print(f"\nBytes per cached element (data + float32 scale overhead, head_dim {args.head_dim}; "
          "tensor/head scales are per layer, so their overhead per token tends to 0):")
    header = f"  {'format':<14}" + "".join(f"{g:>10}" for g in EXAMPLE_GRANULARITIES)
    print(header)
    print(f"  {'bf16':<14}" + f"{bytes_per_element(Scheme(), args.head_dim):>10.4g}" + "  (baseline)")
    for name, fmt in FORMATS.items():
        if fmt.is_identity:
            continue
        cells = []
        for g in EXAMPLE_GRANULARITIES:
            scheme = Scheme(name, Granularity.parse(g), ScaleSource.DYNAMIC)
            cells.append(f"{bytes_per_element(scheme, args.head_dim):>10.4g}")
        print(f"  {name:<14}" + "".join(cells))
    return 0
