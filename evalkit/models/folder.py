"""What evalkit reads about a model from its folder and config, never its weights.

Planning (capacity counts, the dry run's sizing) and the checks made before a model loads (pre-flight)
need the same few facts between their steps: the config's fields (:func:`load_config`: a preset, a
config.json, or a model's own config), where a model's folder is (:func:`model_folder`), how its
weights are stored and how large they are (:func:`weights_source`), and its attention as the config
describes it (:class:`Arch`, :func:`model_arch`). They live here, with the model, so that no layer
below the command line has to call back up into it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from evalkit.errors import EvalkitError
from evalkit.models.info import KVLayout


def load_config(args) -> tuple[dict, str, dict | None]:
    """(config fields, label, preset or None)."""
    from evalkit.models.presets import get_preset

    if args.preset:
        preset = get_preset(args.preset)
        return preset["config"], f"{args.preset} ({preset['hub_id']})", preset
    if args.config:
        try:
            return json.loads(args.config.read_text()), str(args.config), None
        except FileNotFoundError:
            raise EvalkitError(f"config file {args.config} does not exist") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise EvalkitError(f"{args.config} is not a JSON config: {exc}") from None
    from evalkit.models.loading import model_source

    path, local_only = model_source(args.model)  # a missing folder or an offline uncached id: one line, at once
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(path, trust_remote_code=args.trust_remote_code, local_files_only=local_only)
    except (OSError, ValueError) as exc:
        raise EvalkitError(
            f"could not read the config of {args.model!r}: {str(exc).splitlines()[0]} "
            "(check the name, or use --config FILE / --preset NAME offline)"
        ) from None
    return cfg.to_dict(), args.model, None


def model_folder(name: str) -> Path:
    from evalkit.models.loading import embedded_dense_dir, embedded_name

    embedded = embedded_name(name)
    return embedded_dense_dir(embedded) if embedded else Path(name)


def weights_source(args, preset, fields, arch) -> tuple[str | None, int | None, int | None, str]:
    """(dtype of the decoder linears, block size of their scales, total bytes given, how they were found)."""
    from evalkit.models.presets import DTYPE_BYTES, weights_bytes
    from evalkit.units import format_bytes, parse_bytes

    dtype = args.weights_dtype or (preset or {}).get("weights_dtype")
    if dtype is not None and dtype not in DTYPE_BYTES:
        weights_bytes(1, dtype)  # one line naming the dtypes
    block = (preset or {}).get("weight_block") if dtype == (preset or {}).get("weights_dtype") else None
    shipped = str(fields.get("torch_dtype") or fields.get("dtype") or "")
    if args.weights_bytes:
        n = parse_bytes(args.weights_bytes)
        return dtype or shipped or None, block, n, f"{format_bytes(n)} (given)"
    params = float(args.params) if args.params else None
    if params is None and arch is None and (preset or {}).get("params") and dtype:  # parts not modelled: the total
        params = float(preset["params"])
    if params and dtype:
        n = weights_bytes(params, dtype)
        return dtype, block, n, f"{format_bytes(n)} ({params / 1e9:,.1f}B params x {dtype})"
    folder = model_folder(args.model) if args.model else None
    files = list(folder.glob("*.safetensors")) if folder is not None and folder.is_dir() else []
    if files:
        n = sum(f.stat().st_size for f in files)
        return dtype or shipped or "bf16", block, n, f"{format_bytes(n)} (size of {len(files)} safetensors file(s))"
    dtype = dtype or (shipped if shipped in DTYPE_BYTES else None)
    if arch is not None and dtype:
        scales = f" + one float32 scale per {block}x{block} block" if block else ""
        rest = "BF16" if DTYPE_BYTES[dtype] < 2 else dtype
        parts = "embeddings, LM head, norms, router" if arch.experts else "embeddings, LM head, norms"
        return dtype, block, None, f"decoder linears {dtype}{scales}; {parts} {rest}"
    raise EvalkitError(
        "the weight footprint is unknown: give --weights-bytes SIZE, or --params N with --weights-dtype bf16|fp8|int4"
    )


@dataclass(frozen=True)
class Arch:
    """A model's attention as its config describes it: its KV layout and whether it is sparse, or why
    there is none (``fatal``: the config is here but the run would refuse it too)."""

    name: str
    source: str
    layout: KVLayout | None = None
    sparse: bool = False
    why: str = ""
    fatal: bool = False
    latent: int = 0  # kv_lora_rank in the config: a latent cache, whether or not evalkit reads the type as MLA

    def describe(self) -> str:
        lay = self.layout
        if lay.is_mla:
            kind = "sparse (index_topk)" if self.sparse else "dense"
            return f"{lay.model_type}: {kind} multi-head latent attention, latent {lay.mla_latent_dim} + RoPE key {lay.mla_rope_dim}"
        v = f", V {lay.v_head_dim}" if lay.v_head_dim != lay.head_dim else ""
        return f"{lay.model_type}: {lay.num_kv_heads} KV heads of head_dim {lay.head_dim}{v}"


def model_arch(name: str) -> Arch:
    """The architecture of model ``name`` from its config, without weights or the network."""
    from evalkit.models.facts import read_config, sparse_attention, text_fields
    from evalkit.models.info import kv_layout
    from evalkit.models.presets import config_namespace

    config, source = read_config(name)
    if config is None:
        return Arch(name, source, why=source)
    try:
        layout = kv_layout(config_namespace(config))
    except EvalkitError as exc:
        return Arch(name, source, why=str(exc), fatal=True)
    except (TypeError, ValueError, ZeroDivisionError) as exc:  # a config.json missing the fields that size attention
        return Arch(name, source, why=f"its config ({source}) does not describe its attention ({exc})", fatal=True)
    latent = int(text_fields(config).get("kv_lora_rank") or 0)
    return Arch(name, source, layout, sparse_attention(config), latent=latent)
