"""`evalkit models`: the embedded offline models and where their files are."""

from __future__ import annotations

from evalkit.errors import EvalkitError
from evalkit.models import _MARKER, EMBEDDED_ALIASES, EMBEDDED_MODELS, embedded_dense_dir, embedded_gguf


def add_parser(sub):
    p = sub.add_parser("models", help="list the embedded offline models and where their files are")
    p.set_defaults(handler=run)


def run(args) -> int:
    aliases = {}
    for alias, target in EMBEDDED_ALIASES.items():
        aliases.setdefault(target, []).append(alias)
    for name, info in EMBEDDED_MODELS.items():
        print(f"{name}  (also: {', '.join(aliases.get(name, []))})")
        print(f"  {info['description']}")
        print(f"  upstream: {info['hub_id']} via PyPI {info['pip']}")
        try:
            print(f"  gguf:     {embedded_gguf(name)}")
        except EvalkitError as exc:
            print(f"  gguf:     missing ({exc})")
        dense = embedded_dense_dir(name)
        state = "ready" if (dense / _MARKER).is_file() else "not converted yet (first load converts it, ~20 s)"
        print(f"  dense:    {dense} [{state}]")
    print("\nAny Hugging Face id or local model folder works too: --model ORG/NAME or --model ./folder")
    return 0
