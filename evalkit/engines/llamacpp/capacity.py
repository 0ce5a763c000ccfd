"""``capacity --engine llamacpp``: llama.cpp's own KV buffer against evalkit's bytes per token.

For each cache pair (``--kv-cache-dtypes``, e.g. ``f16,q8_0,q4_0,q8_0/q4_0``; a single type means K and
V alike) a llama.cpp context is created on the model's GGUF at ``--context`` tokens (llama.cpp pads it
to a multiple of 256 cells), and its KV buffer is read twice: from llama.cpp's own log line
(``llama_kv_cache: size = ... K (q8_0): ... V (q8_0): ...``) and computed from ggml's row size
(:mod:`evalkit.engines.llamacpp.context`). evalkit's count is ``bytes_per_token`` of the scheme
``llamacpp:<k>/<v>`` on the model's KV layout (:mod:`evalkit.kv.memory`) times the cells. The table
gives the three, whether they agree, and the capacity multiplier against f16 (tokens that fit in the
same memory).
"""

from __future__ import annotations

import argparse
import json

from evalkit.errors import EvalkitError

DEFAULT_TYPES = "f16,q8_0,q4_0,q8_0/q4_0"
DEFAULT_CONTEXT = 4096


def pairs(text: str | None) -> list[tuple[str, str]]:
    from evalkit.engines.llamacpp.cache_types import CACHE_TYPES

    out = []
    for item in (text or DEFAULT_TYPES).split(","):
        k, _, v = item.strip().partition("/")
        v = v or k
        for t in (k, v):
            if t not in CACHE_TYPES:
                raise EvalkitError(
                    f"--kv-cache-dtypes {item!r}: llama.cpp has no cache type {t!r}: use {', '.join(CACHE_TYPES)} "
                    "(K/V for a pair, e.g. q8_0/q4_0)"
                )
        out.append((k, v))
    return list(dict.fromkeys(out))


def measure(gguf, layout, types: list[tuple[str, str]], context: int, n_threads: int = 2) -> list[dict]:
    """One row per pair: llama.cpp's logged and computed KV bytes, evalkit's, and the multiplier vs f16."""
    from evalkit.engines.llamacpp.model import LlamaCppModel
    from evalkit.kv.memory import bytes_per_token
    from evalkit.kv.scheme import parse_scheme

    rows = []
    with LlamaCppModel.open(gguf, n_threads=n_threads) as model:
        for k, v in types:
            from evalkit.engines.llamacpp.engine import QUANTIZED

            with model.context(type_k=k, type_v=v, flash_attn=True, n_ctx=context, n_threads=n_threads) as ctx:
                got = ctx.kv_bytes()
            scheme = parse_scheme(f"llamacpp:{k}/{v}")
            per_token = bytes_per_token(layout, scheme)
            evalkit_bytes = int(per_token * got["cells"])
            logged = round(got["log_k"] + got["log_v"], 2) if "log_k" in got else None
            log_agrees = "log_k" in got and all(
                round(got[side] / 2**20, 2) == got[f"log_{side}"] for side in ("k", "v")
            )  # llama.cpp prints MiB with 2 decimals
            rows.append(
                {
                    "type_k": k,
                    "type_v": v,
                    "quantized": k in QUANTIZED or v in QUANTIZED,
                    "cells": got["cells"],
                    "llamacpp_bytes": got["k"] + got["v"],
                    "llamacpp_logged_mib": logged,
                    "log_agrees": log_agrees,
                    "evalkit_bytes": evalkit_bytes,
                    "bytes_per_token": float(per_token),
                    "equal": evalkit_bytes == got["k"] + got["v"],
                }
            )
    base = next((r["llamacpp_bytes"] for r in rows if (r["type_k"], r["type_v"]) == ("f16", "f16")), None)
    for r in rows:
        r["capacity_vs_f16"] = round(base / r["llamacpp_bytes"], 4) if base else None
    return rows


def table(rows: list[dict]) -> str:
    head = (
        "K/V",
        "cells",
        "llama.cpp KV MiB (its log)",
        "llama.cpp bytes (ggml rows)",
        "evalkit bytes",
        "equal",
        "B/token",
        "× f16",
    )
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        logged = "" if r["llamacpp_logged_mib"] is None else f"{r['llamacpp_logged_mib']:.2f}"
        logged += "" if r["log_agrees"] else " (differs)"
        mult = "" if r["capacity_vs_f16"] is None else f"{r['capacity_vs_f16']:.2f}"
        out.append(
            f"| {r['type_k']}/{r['type_v']} | {r['cells']:,} | {logged} | {r['llamacpp_bytes']:,} | "
            f"{r['evalkit_bytes']:,} | {'yes' if r['equal'] else 'NO'} | {r['bytes_per_token']:,.0f} | {mult} |"
        )
    return "\n".join(out)


def run_cli(args: argparse.Namespace) -> int:
    from evalkit.engines.llamacpp import runtime
    from evalkit.engines.llamacpp.gguf import gguf_path
    from evalkit.planning.capacity import parse_count

    if not args.model:
        raise EvalkitError("--engine llamacpp measures a GGUF model: use --model embedded, a .gguf file or its folder")
    types = pairs(args.kv_cache_dtypes)
    context = parse_count(args.context or str(DEFAULT_CONTEXT))
    runtime.require()
    gguf = gguf_path(args.model)
    from evalkit.models.loading import load_model

    layout = load_model(args.model, dtype="float32").layout
    rows = measure(gguf, layout, types, context)
    if args.json:
        print(json.dumps({"model": args.model, "context": context, "rows": rows}, indent=1))
    else:
        print(f"llama.cpp KV cache of {gguf.name} at {context:,} tokens ({runtime.version()}):\n")
        print(table(rows))
    return 0
