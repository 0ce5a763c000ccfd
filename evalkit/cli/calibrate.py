"""`evalkit calibrate`: static K/V scales from data, from a vLLM or ModelOpt checkpoint, or to a vLLM one.

    python -m evalkit calibrate --model M --corpus stdlib-docs --samples 32 --seq-len 512 \\
        --granularity head --method amax --out calibration/NAME.safetensors
    python -m evalkit calibrate --recipe calibration/smollm2-135m-head-amax.yaml
    python -m evalkit calibrate --import-vllm CKPT_DIR --out calibration/imported.safetensors
    python -m evalkit calibrate --import-modelopt MODELOPT_EXPORT_DIR --out calibration/imported.safetensors
    python -m evalkit calibrate ... --export-vllm OUT_DIR [--with-weights]
    python -m evalkit calibrate --scales calibration/NAME.safetensors --export-vllm OUT_DIR

Settings come from the defaults, then the ``--recipe`` YAML file, then the command line. The
scheme that uses the result is printed last (``fp8_e4m3/<granularity>/static+scales=<out>``).
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

from evalkit.cli import COMMANDS
from evalkit.cli.common import add_model_arguments, load_from_args
from evalkit.errors import EvalkitError

DEFAULTS = {
    "corpus": "stdlib-docs",
    "samples": 32,
    "seq_len": 512,
    "granularity": "tensor",
    "method": "amax",
    "format": "fp8_e4m3",
    "batch_size": 4,
    "eval_corpus": "embedded",
    "out": None,
    "model": None,
}


def add_parser(sub):
    p = sub.add_parser("calibrate", help=COMMANDS["calibrate"])
    add_model_arguments(p)
    p.set_defaults(model=None)
    p.add_argument(
        "--recipe",
        type=Path,
        default=None,
        help="YAML recipe with any of: model, corpus, samples, seq_len, granularity, method, format, out",
    )
    p.add_argument(
        "--corpus",
        default=None,
        help="calibration text: stdlib-docs (default; disjoint from the embedded eval text), embedded, file:PATH, hf:...",
    )
    p.add_argument("--samples", type=int, default=None, help="number of sequences (default 32)")
    p.add_argument("--seq-len", dest="seq_len", type=int, default=None, help="tokens per sequence (default 512)")
    p.add_argument(
        "--granularity",
        choices=["tensor", "head"],
        default=None,
        help="one scale per layer (tensor) or per layer and KV head",
    )
    p.add_argument("--method", default=None, help="amax | percentile:P (e.g. percentile:99.99) | mse")
    p.add_argument("--format", default=None, help="storage format the scales are for (default fp8_e4m3)")
    from evalkit.cli.scales_flags import add_scales_arguments

    add_scales_arguments(p)  # with --scales: what a table without its sidecar was made for
    p.add_argument(
        "--calib-batch-size", dest="batch_size", type=int, default=None, help="sequences per forward pass (default 4)"
    )
    p.add_argument(
        "--eval-corpus",
        dest="eval_corpus",
        default=None,
        help="evaluation text to check for overlap (default embedded; 'none' to skip)",
    )
    p.add_argument("--out", type=Path, default=None, help="scale table to write (calibration/NAME.safetensors)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out / --export-vllm folder")
    p.add_argument(
        "--import-vllm",
        dest="import_vllm",
        type=Path,
        default=None,
        help="read the scales from this vLLM / llm-compressor checkpoint folder instead of calibrating",
    )
    p.add_argument(
        "--import-modelopt",
        dest="import_modelopt",
        type=Path,
        default=None,
        help="read the FP8 k/v scales of this NVIDIA ModelOpt export (hf_quant_config.json, k_proj.k_scale / "
        "v_proj.v_scale) instead of calibrating",
    )
    p.add_argument(
        "--scales",
        type=Path,
        default=None,
        help="start from this existing scale table (e.g. to --export-vllm it) instead of calibrating",
    )
    p.add_argument(
        "--export-vllm",
        dest="export_vllm",
        type=Path,
        default=None,
        help="also write the scales as a vLLM checkpoint folder (config.json + k_scale/v_scale tensors)",
    )
    p.add_argument(
        "--with-weights",
        action="store_true",
        help="with --export-vllm: save the model weights too (a complete checkpoint)",
    )
    p.set_defaults(handler=run)


def settings(args) -> dict:
    cfg = dict(DEFAULTS)
    if args.recipe is not None:
        import yaml

        if not args.recipe.is_file():
            raise EvalkitError(f"recipe {args.recipe} does not exist")
        recipe = yaml.safe_load(args.recipe.read_text()) or {}
        unknown = set(recipe) - set(DEFAULTS) - {"description"}
        if unknown:
            raise EvalkitError(f"recipe {args.recipe}: unknown keys {sorted(unknown)}; allowed: {sorted(DEFAULTS)}")
        cfg.update({k: v for k, v in recipe.items() if k in DEFAULTS})
    for key in DEFAULTS:
        value = getattr(args, key, None)
        if value is not None:
            cfg[key] = value
    if cfg["model"] is None:
        cfg["model"] = "embedded"
    if cfg["eval_corpus"] in ("none", ""):
        cfg["eval_corpus"] = None
    if cfg["out"] is None and not args.export_vllm:
        raise EvalkitError("--out is required: where to write the scale table, e.g. calibration/NAME.safetensors")
    cfg["out"] = None if cfg["out"] is None else Path(cfg["out"])
    return cfg


def run(args: argparse.Namespace) -> int:
    from evalkit.kv.scale_table import save_scale_table, sidecar_path

    cfg = settings(args)
    out = cfg["out"]
    if out is not None and out.suffix != ".safetensors":
        raise EvalkitError(f"--out {out} must end in .safetensors")
    if out is not None and (out.exists() or sidecar_path(out).exists()) and not args.force:
        raise EvalkitError(f"{out} already exists: choose another name or pass --force to overwrite it")
    sources = [f for f, v in (("--scales", args.scales), ("--import-vllm", args.import_vllm),
                              ("--import-modelopt", args.import_modelopt)) if v is not None]  # fmt: skip
    if len(sources) > 1:
        raise EvalkitError(f"give one of {', '.join(sources)}, not {len(sources)}")
    if args.scales is None and _declared_flags(args):
        raise EvalkitError(
            "--scales-model/--scales-format describe a table read with --scales: add --scales or drop them"
        )
    if args.export_vllm and args.export_vllm.exists() and any(args.export_vllm.iterdir()) and not args.force:
        raise EvalkitError(f"{args.export_vllm} exists and is not empty: choose another folder or pass --force")
    from evalkit.sweep.preflight import check_model_device, check_writable

    check_writable(out, "--out", kind="file", fix="pass --out a .safetensors path in a folder you can write")
    check_writable(args.export_vllm, "--export-vllm")
    check_model_device(args)
    if args.import_vllm is not None:
        from evalkit.scales.vllm_io import import_vllm

        table = import_vllm(args.import_vllm)
        lm = None
    elif args.import_modelopt is not None:
        from evalkit.scales.modelopt_io import import_modelopt

        table = import_modelopt(args.import_modelopt)
        lm = None
    elif args.scales is not None:
        from evalkit.kv.scale_table import load_scale_table

        args.model = cfg["model"]
        lm = load_from_args(args)
        table = load_scale_table(args.scales, lm.layout, config_hash=lm.config_hash, declared=_declared(args))
    else:
        from evalkit.data.corpus_check import check_corpus_params
        from evalkit.scales.calibrate import calibrate

        check_corpus_params(cfg, "calibrate")  # --corpus / --eval-corpus: one line, before the model loads
        args.model = cfg["model"]
        lm = load_from_args(args)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            table = calibrate(
                lm,
                corpus=cfg["corpus"],
                samples=int(cfg["samples"]),
                seq_len=int(cfg["seq_len"]),
                granularity=cfg["granularity"],
                method=str(cfg["method"]),
                fmt=cfg["format"],
                batch_size=int(cfg["batch_size"]),
                eval_corpus=cfg["eval_corpus"],
            )
        for w in caught:
            print(f"evalkit: warning: {w.message}")
    from evalkit.scales.calibrate import table_stats

    if out is not None:
        save_scale_table(out, table)
        print(f"wrote {out} ({table_stats(table)}) and {sidecar_path(out).name}")
    if args.export_vllm:
        from evalkit.scales.vllm_io import export_vllm

        if lm is None:
            args.model = cfg["model"] if args.model is None else args.model
            lm = load_from_args(args)
        config = json.loads(lm.model.config.to_json_string())
        export_vllm(
            table,
            args.export_vllm,
            config,
            model=lm.model if args.with_weights else None,
            tokenizer=lm.tokenizer if args.with_weights else None,
            force=args.force,
        )
        print(f"exported vLLM scales to {args.export_vllm}")
    if out is not None:
        print(f"scheme: {table.meta.get('format', 'fp8_e4m3')}/{table.granularity}/static+scales={out}")
    return 0


def _declared_flags(args) -> bool:
    return args.scales_model is not None or args.scales_format is not None


def _declared(args):
    """``--scales-model``/``--scales-format`` as a :class:`evalkit.kv.scale_table.Declared` (None without them)."""
    from evalkit.cli.scales_flags import declared

    pair = declared(args)
    if pair is None:
        return None
    from evalkit.kv.scale_table import Declared
    from evalkit.models.loading import model_config_hash

    return Declared(pair[0], pair[1], model_config_hash(pair[0]))
