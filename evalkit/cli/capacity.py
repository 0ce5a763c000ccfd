"""`evalkit capacity`: KV tokens and concurrent sequences that fit, per KV scheme, per GPU and per deployment.

    python -m evalkit capacity --preset kimi-k2 --gpu h200 --gpus 8 --tensor-parallel 8 --context 32k
    python -m evalkit capacity --preset kimi-k2 --gpu h200 --gpus 16 --data-parallel 16 --expert-parallel 16
    python -m evalkit capacity --preset llama-3.1-70b --gpu h200 --tensor-parallel 2 --context 32k
    python -m evalkit capacity --config path/config.json --gpu-memory 80GiB --weights-bytes 16GB
    python -m evalkit capacity --model Qwen/Qwen3-32B --gpu h100   (reads the config only)
    python -m evalkit capacity --list-gpus

    python -m evalkit capacity --engine vllm --model embedded [--kv-cache-dtypes auto,fp8_e4m3]
        [--budget-gib 2] [--context 2048] [--load] [--format table|md|csv|json] [--out DIR]

Memory per GPU: ``--gpu NAME`` takes it from the GPU table (:mod:`evalkit.planning.gpus`: the total the CUDA
runtime reports, which vLLM multiplies by the utilization: 139.81 GiB on an H200, not its "141 GB"), and
marks each scheme with whether vLLM 0.33 runs its ``kv_cache_dtype`` on that GPU; ``--gpu-memory SIZE``
overrides the memory (``141GiB`` is binary, ``141GB`` decimal: 7 % apart). Neither: 80 GiB.

Deployment: ``--tensor-parallel``, ``--pipeline-parallel``, ``--data-parallel`` and ``--expert-parallel``
(1, or TP x DP as vLLM's ``--enable-expert-parallel`` spreads experts); ``--gpus`` must equal TP x PP x DP
(given alone, it is read as ``--tensor-parallel``). Each rank's KV budget is its GPU's memory at
``--utilization`` less its weights (sharded as vLLM shards them) and a reserve for activations and CUDA
graphs estimated as vLLM's profiler sizes them (``--max-num-batched-tokens``, ``--max-num-seqs``; vLLM's
``serve`` defaults for the GPU) or given with ``--reserve SIZE``. Tokens and sequences are reported per
rank and for the deployment (:mod:`evalkit.planning.capacity`). ``--vllm-version 0.32|0.33|0.34`` counts
as that release sizes its cache (:mod:`evalkit.planning.vllm_sizing`): whole blocks of its default block
size (16; 64 from 0.34), its ``gpu_memory_utilization`` default (0.92; from 0.34 1.0 with the extensible
KV cache, which keeps ``max(1 GiB, 0.75 x the activation peak)`` free instead); without it the count is
evalkit's plain one (no blocks, ``--utilization`` 0.9).

Weights: ``--weights-bytes SIZE``, else the preset's (or ``--params``) parameter count times
``--weights-dtype`` (default: the dtype the preset's weights ship in), else for a local model
folder the size of its ``*.safetensors`` files; spread over the ranks in the proportions of the model's parts.

``--engine vllm`` measures instead of counting (:mod:`evalkit.engines.vllm.serving`): one in-process
vLLM engine per ``kv_cache_dtype`` on the ``--model`` folder with ``--budget-gib`` of KV cache and
``max_model_len`` = ``--context``; the tokens its allocator fits and its maximum concurrency, next to
evalkit's bytes per token and their ratio (over 1 % flagged with the term that explains it); with
``--load`` also the requests it admits at once and its prefill and decode tokens/s. ``--out DIR``
writes the rows (``serving.jsonl``, results-store metric records) and the table (``serving.csv``).
Before any engine starts (each takes 30-60 s): ``--out`` must be writable, the model's config.json
must parse, ``--context`` must fit its ``max_position_embeddings`` and ``--budget-gib`` the memory
available; each problem is one line (exit 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from evalkit.cli import COMMANDS
from evalkit.cli.capacity_count import DEFAULT_SCHEMES, MLA_SCHEMES  # noqa: E402  (the help text names them)
from evalkit.errors import EvalkitError


def add_parser(sub):
    p = sub.add_parser("capacity", help=COMMANDS["capacity"])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help="a published model config (see --list-presets)")
    src.add_argument("--config", type=Path, help="a config.json file")
    src.add_argument("--model", help="a Hugging Face id or local folder: only its config is read")
    src.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    src.add_argument(
        "--list-gpus", action="store_true", help="list the GPU table (memory, compute, vLLM kv_cache_dtypes) and exit"
    )
    eng = p.add_argument_group("measured by the engine (--engine vllm, --engine llamacpp)")
    eng.add_argument(
        "--engine",
        default=None,
        help="measure capacity from the engine itself (vllm: admission and speed from vLLM's allocator; llamacpp: "
        "llama.cpp's own KV buffer; --model is the folder or embedded)",
    )
    eng.add_argument(
        "--kv-cache-dtypes",
        default=None,
        help="comma-separated kv_cache_dtype values "
        "(default: auto,fp8_e4m3,fp8_e5m2, those the engine's profile lists)",
    )
    eng.add_argument("--budget-gib", type=float, default=2.0, help="KV cache budget per engine in GiB (default 2)")
    eng.add_argument(
        "--dtype", default=None, help="the model dtype the engine runs (default bfloat16: auto then stores BF16)"
    )
    eng.add_argument("--load", action="store_true", help="also measure admission under load and prefill/decode speed")
    eng.add_argument(
        "--decode-tokens", type=int, default=None, help="tokens generated per request under --load (default 16)"
    )
    eng.add_argument(
        "--format", choices=("table", "md", "csv", "json"), default=None, help="output format (default table)"
    )
    eng.add_argument("--out", type=Path, default=None, help="folder for serving.jsonl (rows) and serving.csv (table)")
    p.add_argument(
        "--gpu",
        default=None,
        help="the GPU (h100, h200, b200, mi300x ...: --list-gpus): its memory as CUDA reports it, and which "
        "kv_cache_dtypes vLLM runs there",
    )
    p.add_argument(
        "--gpu-memory",
        default=None,
        help="memory per GPU, overriding --gpu's: 141GiB (binary) or 141GB (decimal) (default: --gpu's, else 80GiB)",
    )
    dep = p.add_argument_group("deployment (as vLLM takes it)")
    dep.add_argument(
        "--gpus", type=int, default=None, help="GPUs in all: TP x PP x DP (alone: read as --tensor-parallel)"
    )
    dep.add_argument("--tensor-parallel", type=int, default=None, help="tensor-parallel size (default 1)")
    dep.add_argument("--pipeline-parallel", type=int, default=None, help="pipeline-parallel size (default 1)")
    dep.add_argument("--data-parallel", type=int, default=None, help="data-parallel size (default 1)")
    dep.add_argument(
        "--expert-parallel", type=int, default=None, help="1 (off) or TP x DP: vLLM's --enable-expert-parallel"
    )
    dep.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="vLLM's, for the reserve (default: vllm serve's)"
    )
    dep.add_argument("--max-num-seqs", type=int, default=None, help="vLLM's, for the reserve (default: vllm serve's)")
    dep.add_argument(
        "--reserve",
        default=None,
        help="activations + CUDA graphs per GPU, e.g. 4GiB, instead of the estimate (vLLM's log gives it)",
    )
    p.add_argument("--weights-bytes", default=None, help="weight footprint of the whole model, e.g. 1.03TB")
    p.add_argument(
        "--weights-dtype", default=None, help="bf16 | fp8 | int8 | int4: weights = parameters x bytes per weight"
    )
    p.add_argument(
        "--params", default=None, help="parameter count for --weights-dtype, e.g. 32.8e9 (presets know theirs)"
    )
    p.add_argument(
        "--context", default=None, help="tokens per sequence, e.g. 32k (default; 2048 with --engine), 128k, 4096"
    )
    p.add_argument(
        "--utilization",
        type=float,
        default=None,
        help="fraction of GPU memory the engine may use (default 0.9; with --vllm-version, that release's default)",
    )
    p.add_argument(
        "--vllm-version",
        default=None,
        help="count as this vLLM release sizes its cache (0.32, 0.33, 0.34): its block size, its "
        "gpu_memory_utilization default and, from 0.34, the extensible KV cache (default: the plain count)",
    )
    p.add_argument(
        "--schemes", default=None, help=f"comma-separated schemes (default: {DEFAULT_SCHEMES}; MLA: {MLA_SCHEMES})"
    )
    p.add_argument("--trust-remote-code", action="store_true", help="for --model configs that need code from the hub")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from evalkit.models.presets import PRESETS

    if args.list_presets:
        for name, p in PRESETS.items():
            print(f"{name:15} {p['hub_id']:32} source: {p['source']}")
        return 0
    from evalkit.cli.capacity_count import count, list_gpus

    if args.list_gpus:
        return list_gpus()
    engine_only = {
        "--kv-cache-dtypes": args.kv_cache_dtypes,
        "--dtype": args.dtype,
        "--load": args.load or None,
        "--decode-tokens": args.decode_tokens,
        "--format": args.format,
        "--out": args.out,
    }
    counted_only = {
        "--gpu": args.gpu,
        "--gpus": args.gpus,
        "--tensor-parallel": args.tensor_parallel,
        "--pipeline-parallel": args.pipeline_parallel,
        "--data-parallel": args.data_parallel,
        "--expert-parallel": args.expert_parallel,
        "--max-num-batched-tokens": args.max_num_batched_tokens,
        "--max-num-seqs": args.max_num_seqs,
        "--reserve": args.reserve,
        "--vllm-version": args.vllm_version,
        "--utilization": args.utilization,
    }
    if args.engine:
        from evalkit.engines.registry import get_engine

        engine = get_engine(args.engine)
        if engine.capacity is None and engine.versions:  # nothing to measure with: count what it declares
            return count_declared(args, engine, engine_only)
        given = [flag for flag, value in counted_only.items() if value is not None]
        if given:
            raise EvalkitError(
                f"{given[0]} sizes a counted deployment; --engine measures one engine on this machine: drop {given[0]}"
            )

        return get_engine(args.engine).hook("capacity")(args)
    given = [flag for flag, value in engine_only.items() if value is not None]
    if given:
        raise EvalkitError(f"{given[0]} is for measuring with an engine: add --engine vllm, or drop {given[0]}")
    return count(args)


def count_declared(args: argparse.Namespace, engine, engine_only: dict) -> int:
    """``capacity --engine NAME`` for an engine with no measuring command: the counted table over the
    schemes its newest version's ``kv_cache_dtype`` values map to (its folder's declaration)."""
    from evalkit.cli.capacity_count import count
    from evalkit.engines.declaration import declared_schemes, version_of

    given = [flag for flag, value in engine_only.items() if value is not None]
    if given:
        raise EvalkitError(f"{given[0]} is for measuring with an engine; {engine.name} is counted: drop {given[0]}")
    if args.schemes is not None:
        raise EvalkitError(
            f"--schemes and --engine {engine.name}: the engine's declared dtypes are the schemes: drop one"
        )
    runs = declared_schemes(engine)
    pairs = ", ".join(f"{name} = {scheme}" for scheme, name in runs.items())
    if not args.json:  # JSON output stays one document
        print(f"engine {engine.name} {version_of(engine).version} (counted from its declaration): {pairs}")
    args.schemes = ",".join(runs)
    return count(args)
