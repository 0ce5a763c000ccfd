"""`evalkit schemes`: formats, granularities, scale sources and dtypes, named schemes, with bytes per cached element."""

from __future__ import annotations

import textwrap

from evalkit.cli import COMMANDS
from evalkit.errors import SchemeError

EXAMPLE_GRANULARITIES = ["tensor", "head", "block16", "token", "group16", "group32"]
GRAMMAR = (
    "FORMAT/GRANULARITY/SCALES[+scale_dtype=e4m3|e8m0][+tensor_scale=fp32][+recipe=sglang][+scales=PATH][+rounding=rtz|rna]"
    "[+skip=0,5|sliding][+attn=fa3[:acc1|:acc2]][+rope=bf16], or NAME[+skip=...][+attn=fa3][+rope=bf16], or "
    "vllm:<kv_cache_dtype>[+skip=...] (see --engine vllm), or auto (the baseline), bf16, fp16"
)


def add_parser(sub):
    p = sub.add_parser("schemes", help=COMMANDS["schemes"])
    p.add_argument(
        "--head-dim", type=int, default=64, help="head_dim used for the bytes-per-element column (default 64)"
    )
    p.add_argument(
        "--engine",
        default=None,
        help="list an engine's own kv_cache_dtypes as its folder declares them (vllm, llamacpp, sglang, ...): the "
        "scheme modelling each (or why none does), its bytes per token on --model, and the source it was read in; "
        "with vLLM installed, vLLM's own allocation beside evalkit's",
    )
    p.add_argument(
        "--engine-version", default=None, help="with --engine: the declared version to list (default: the newest)"
    )
    p.add_argument(
        "--engine-profile",
        default=None,
        help="list an engine profile's kv_cache_dtypes (vllm-cpu, vllm-cuda, sglang, ...): the scheme each is, "
        "what is not modelled and why, and the profile's facts with their sources",
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
    from evalkit.kv.memory import bytes_per_element
    from evalkit.kv.scheme import GranularityKind, Scheme

    try:
        scheme = Scheme.parse(text)
        granularity = scheme.granularity
        if granularity.kind is GranularityKind.GROUP and head_dim % granularity.size:
            return f"{'-':>10}"
        return f"{bytes_per_element(scheme, head_dim):>10.4g}"
    except SchemeError:
        return f"{'-':>10}"


def run(args) -> int:
    if args.engine and args.engine_profile:
        raise SchemeError("--engine and --engine-profile list different tables: give one of them")
    if args.engine_profile:
        return run_profile(args)
    if args.engine:
        return run_engine(args)
    if args.model or args.json or args.engine_version:
        raise SchemeError("--model, --json and --engine-version go with --engine NAME: add --engine vllm, or drop them")
    if args.head_dim < 1:
        raise SchemeError(f"--head-dim must be a positive number of channels, got {args.head_dim}")
    # the KV tables here, not at import: they import torch, which `schemes --help` never needs
    from evalkit.kv.formats import FORMATS, SCALE_DTYPE_HELP
    from evalkit.kv.memory import bytes_per_element
    from evalkit.kv.named_schemes import NAMED_SCHEMES
    from evalkit.kv.scheme import Scheme
    from evalkit.kv.scheme_parts import GRANULARITY_HELP, SCALE_HELP, GranularityKind, ScaleSource

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
    from evalkit.kv.codec import families

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


def _declared_engine(name: str):
    """The engine called ``name`` when it declares kv_cache_dtype values; SchemeError (one line) otherwise."""
    from evalkit.engines.registry import get_engine, in_order

    declaring = [e.name for e in in_order() if e.versions]
    if name not in declaring:
        engine = get_engine(name)  # an unknown name: one line naming the engines
        raise SchemeError(f"engine {engine.name} declares no kv_cache_dtype values: use one of {', '.join(declaring)}")
    return get_engine(name)


def run_engine(args) -> int:
    """``schemes --engine NAME``: every kv_cache_dtype the engine's version declares, as evalkit models it;
    vLLM's own table (its allocation beside evalkit's) when vLLM is installed and no version is named."""
    engine = _declared_engine(args.engine)
    if engine.name == "vllm" and args.engine_version is None and engine.installed():
        return run_vllm(args)
    return run_declared(args, engine)


def run_declared(args, engine) -> int:
    """The declaration's table: name, scheme (or why none), bytes per token on --model counted by evalkit, source."""
    import json

    from evalkit.engines.declaration import version_of
    from evalkit.kv.memory import bytes_per_token
    from evalkit.kv.scheme import parse_scheme

    version = version_of(engine, args.engine_version)
    label, layout = _engine_layout(args.model)
    rows = []
    for d in version.kv_cache_dtypes:
        per_token = None
        if d.modelled:
            try:
                per_token = float(bytes_per_token(layout, parse_scheme(d.scheme)))
            except SchemeError as exc:  # a cache type this model's attention does not take (MLA rows, head sizes)
                per_token, note = None, str(exc)
            else:
                note = d.note
        else:
            note = f"not modelled: {d.note}"
        rows.append({"kv_cache_dtype": d.name, "scheme": d.scheme, "bytes_per_token": per_token, "note": note})
        rows[-1]["source"] = d.source
    if args.json:
        out = {"engine": engine.name, "version": version.version, "model": label, "dtypes": rows}
        out["renamed"] = dict(version.renamed)
        print(json.dumps(out, indent=1))
        return 0
    print(
        f"{engine.name} {version.version} kv_cache_dtypes, as declared in evalkit/engines/{engine.name}/ "
        f"(bytes per token on {label}: all layers, counted by evalkit):"
    )
    print(f"  {'kv_cache_dtype':<20} {'B/token':>10}  scheme, or why none")
    for r in rows:
        size = f"{r['bytes_per_token']:>10.0f}" if r["bytes_per_token"] is not None else f"{'-':>10}"
        print(f"  {r['kv_cache_dtype']:<20} {size}  {r['scheme'] or r['note']}")
        print(f"  {'':<20} {'':>10}  source: {r['source']}")
    for old, new in version.renamed:
        print(f"  {old:<20} {'-':>10}  not taken by {engine.name} {version.version}: use {new}")
    return 0


def run_profile(args) -> int:
    """``schemes --engine-profile NAME``: the profile's kv_cache_dtypes (the scheme each is; those not modelled,
    and why; names an earlier release used), then its facts with their sources."""
    from evalkit.engines.registry import get_profile

    if args.model or args.json or args.engine_version:
        raise SchemeError("--model, --json and --engine-version go with --engine NAME, not --engine-profile: drop them")
    profile = get_profile(args.engine_profile)
    print(f"{profile.name}: {profile.description}")
    print(f"  {'kv_cache_dtype':<16} scheme (no checkpoint scales), or why none")
    for d in profile.kv_cache_dtypes:
        print(f"  {d.name:<16} {profile.scheme_for(d.name)}")
    for name, why in profile.not_modelled:
        print(f"  {name:<16} not modelled: {why}")
    for old, new in profile.renamed:
        print(f"  {old:<16} not taken by {profile.release or profile.name}: use {new}")
    print(profile.summary().split("\n", 1)[1] if profile.facts or profile.attention_paths else "")
    return 0


def run_vllm(args) -> int:
    """``schemes --engine vllm`` with vLLM installed: every kv_cache_dtype of the installed vLLM, as evalkit
    models it, beside vLLM's own allocation."""
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
