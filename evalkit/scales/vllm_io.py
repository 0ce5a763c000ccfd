"""Static KV scales in and out of the checkpoint format vLLM loads (llm-compressor / compressed-tensors).

What the engines read (checked in vLLM's and compressed-tensors' loading code):

- Tensors, one pair per attention layer, on the attention module: ``model.layers.{i}.self_attn.k_scale``
  and ``...v_scale`` (vLLM's ``maybe_remap_kv_scale_name`` maps them to ``...self_attn.attn.k_scale``;
  it also accepts ModelOpt's ``...self_attn.k_proj.k_scale`` / ``v_proj.v_scale`` and the deprecated
  single ``...kv_scale``, which serves K and V).
- Shapes: strategy ``tensor``: one value (compressed-tensors writes shape (1,); vLLM's default
  loader fills a one-element parameter from any one-element tensor). Strategy ``attn_head``: one
  per KV head; llm-compressor writes (num_kv_heads, 1, 1), which vLLM flattens
  (``CompressedTensorsKVCacheMethod`` TP-aware loader). We write float32, so no scale is rounded.
- Meaning: the cache stores ``fp8 = saturate(x / scale)`` and reads ``x = fp8 * scale``
  (vLLM ``scaled_vec_conversion``: ``float_to_fp8(x / scale)``), the convention evalkit uses.
- ``config.json`` -> ``quantization_config``: ``quant_method: compressed-tensors`` with
  ``kv_cache_scheme`` = compressed-tensors ``QuantizationArgs`` as llm-compressor dumps them:
  ``{"num_bits": 8, "type": "float", "symmetric": true, "strategy": "tensor" | "attn_head",
  "dynamic": false, ...}``. vLLM accepts only num_bits 8, type float, symmetric, tensor/attn_head.
- A checkpoint without these tensors runs with scale 1.0 in vLLM (the silent failure this module
  refuses: importing it is an error).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from evalkit.errors import EvalkitError, ScaleError
from evalkit.kv.scale_table import ScaleTable
from evalkit.models.info import config_hash, kv_layout

SCALES_FILE = "kv_cache_scales.safetensors"
PROVENANCE_FILE = "evalkit_kv_scales.json"
STRATEGY = {"tensor": "tensor", "head": "attn_head"}
_SCALE_NAME = re.compile(r"^(?P<module>.*)\.(?P<kind>k_scale|v_scale|kv_scale)$")


def kv_cache_scheme(granularity: str) -> dict:
    """The ``kv_cache_scheme`` entry exactly as llm-compressor writes it (QuantizationArgs dump)."""
    return {
        "num_bits": 8,
        "type": "float",
        "symmetric": True,
        "group_size": None,
        "strategy": STRATEGY[granularity],
        "block_structure": None,
        "dynamic": False,
        "actorder": None,
        "observer": "minmax",
        "observer_kwargs": {},
    }


def quantization_config(granularity: str) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": "dense",
        "config_groups": {},
        "ignore": [],
        "kv_cache_scheme": kv_cache_scheme(granularity),
        "quantization_status": "frozen",
    }


def attention_prefixes(model=None, num_layers: int | None = None) -> list[str]:
    """Checkpoint name of each layer's attention module, in layer order."""
    if model is not None:
        found = {}
        for name, module in model.named_modules():
            idx = getattr(module, "layer_idx", None)
            if idx is not None and "attention" in type(module).__name__.lower() and idx not in found:
                found[idx] = name
        if found:
            return [found[i] for i in sorted(found)]
    return [f"model.layers.{i}.self_attn" for i in range(num_layers)]


def scale_tensors(table: ScaleTable, prefixes: list[str]) -> dict[str, torch.Tensor]:
    if len(prefixes) != table.k_scale.shape[0]:
        raise ScaleError(
            f"the scale table has {table.k_scale.shape[0]} layers but the model has {len(prefixes)} attention layers"
        )
    out = {}
    for i, prefix in enumerate(prefixes):
        for which, t in (("k", table.k_scale), ("v", table.v_scale)):
            s = t[i].float().contiguous()
            out[f"{prefix}.{which}_scale"] = s.reshape(1) if s.dim() == 0 else s.reshape(-1, 1, 1)
    return out


def export_vllm(
    table: ScaleTable, out_dir: str | Path, config: dict, *, model=None, tokenizer=None, force: bool = False
) -> Path:
    """Write ``out_dir`` as a vLLM-loadable folder: config.json with the kv_cache_scheme and the scales.

    With ``model`` (and ``tokenizer``), the weights are saved too, giving a complete checkpoint.
    """
    fmt = table.meta.get("format", "fp8_e4m3")
    if fmt != "fp8_e4m3":
        raise EvalkitError(
            f"vLLM loads static KV scales for fp8_e4m3 only, this table was calibrated for {fmt}: recalibrate with --format fp8_e4m3"
        )
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not force:
        raise EvalkitError(f"{out} exists and is not empty: choose another folder or pass --force")
    out.mkdir(parents=True, exist_ok=True)
    if model is not None:
        model.save_pretrained(out)
        if tokenizer is not None:
            tokenizer.save_pretrained(out)
    tensors = scale_tensors(table, attention_prefixes(model, table.k_scale.shape[0]))
    save_file(tensors, str(out / SCALES_FILE), metadata={"format": "pt"})
    index = out / "model.safetensors.index.json"
    if index.is_file():  # sharded: vLLM loads only files named in the index
        data = json.loads(index.read_text())
        data.setdefault("weight_map", {}).update({name: SCALES_FILE for name in tensors})
        index.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    cfg = dict(config)
    cfg["quantization_config"] = quantization_config(table.granularity)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / PROVENANCE_FILE).write_text(json.dumps(table.meta, indent=2, sort_keys=True) + "\n")
    return out


def _layer_of(module_name: str) -> int | None:
    nums = re.findall(r"\.(\d+)(?=\.)", "." + module_name + ".")
    return int(nums[-1]) if nums else None


def read_checkpoint_scales(folder: Path) -> dict[int, dict[str, torch.Tensor]]:
    """{layer: {"k": tensor, "v": tensor}} from every safetensors file of a checkpoint folder."""
    found: dict[int, dict[str, torch.Tensor]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            for name in fh.keys():
                m = _SCALE_NAME.match(name)
                if not m:
                    continue
                layer = _layer_of(m.group("module"))
                if layer is None:
                    continue
                t = fh.get_tensor(name).float().flatten()
                kinds = ("k", "v") if m.group("kind") == "kv_scale" else (m.group("kind")[0],)
                for kind in kinds:
                    found.setdefault(layer, {}).setdefault(kind, t)
    return found


def import_vllm(folder: str | Path) -> ScaleTable:
    """Read the static KV scales of a vLLM / llm-compressor checkpoint folder into a ScaleTable."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise EvalkitError(
            f"{folder} is not a checkpoint folder (no config.json): give the folder holding config.json and *.safetensors"
        )
    raw = json.loads((folder / "config.json").read_text())
    qcfg = raw.get("quantization_config") or {}
    scheme = qcfg.get("kv_cache_scheme") or {}
    if scheme and (scheme.get("type") != "float" or scheme.get("num_bits") != 8 or not scheme.get("symmetric", True)):
        raise EvalkitError(f"{folder}: kv_cache_scheme {scheme} is not the symmetric 8-bit float scheme vLLM supports")
    config, layout = checkpoint_config(folder)
    found = read_checkpoint_scales(folder)
    if not found:
        raise EvalkitError(
            f"checkpoint {folder} holds no k_scale/v_scale tensors, so vLLM would run an FP8 KV cache with scale 1.0: "
            "calibrate with `python -m evalkit calibrate` or evaluate fp8_e4m3/tensor/unit to see what that costs"
        )
    table = checked_table(folder, raw, config, layout, found, "vLLM")
    granularity = table.granularity
    strategy = scheme.get("strategy")
    if strategy and strategy != STRATEGY[granularity]:
        raise EvalkitError(
            f"checkpoint {folder}: kv_cache_scheme says strategy {strategy!r} but the scales are {granularity}-shaped"
        )
    table.meta["kv_cache_scheme"] = scheme or None
    return table


def checkpoint_config(folder: Path):
    """(transformers config, KVLayout) of a checkpoint folder's config.json, or one line naming the problem."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise EvalkitError(
            f"{folder}/config.json cannot be read as a transformers config ({str(exc).splitlines()[0]})"
        ) from None
    return config, kv_layout(config)


def checked_table(folder: Path, raw: dict, config, layout, found: dict, engine: str) -> ScaleTable:
    """The FP8 scale table of a checkpoint's k/v scales ``found`` (:func:`read_checkpoint_scales`): every attention
    layer present, one value per layer (tensor) or per KV head (head), all finite and positive; else one line.
    ``engine`` names who would run the checkpoint with 1.0 where a scale is missing."""
    layers = layout.attention_layers or tuple(range(layout.num_layers))
    missing = [i for i in layers if "k" not in found.get(i, {}) or "v" not in found.get(i, {})]
    if missing:
        raise EvalkitError(
            f"checkpoint {folder} lacks k_scale or v_scale for layers {missing[:8]}{'...' if len(missing) > 8 else ''}: "
            f"{engine} would use 1.0 there; re-export complete scales"
        )
    sizes = {t.numel() for i in layers for t in found[i].values()}
    H = layout.num_kv_heads
    if sizes == {1}:
        granularity = "tensor"
    elif sizes == {H}:
        granularity = "head"
    else:
        raise EvalkitError(
            f"checkpoint {folder}: scale sizes {sorted(sizes)} are neither 1 (tensor) nor {H} (one per KV head)"
        )
    k = torch.stack([found[i]["k"].reshape(()) if granularity == "tensor" else found[i]["k"] for i in layers])
    v = torch.stack([found[i]["v"].reshape(()) if granularity == "tensor" else found[i]["v"] for i in layers])
    for name, t in (("k_scale", k), ("v_scale", v)):
        if not bool(torch.isfinite(t).all()) or not bool((t > 0).all()):
            raise EvalkitError(
                f"checkpoint {folder}: {name} holds zero, negative or non-finite values: re-export the scales"
            )
    meta = {
        "model": raw.get("_name_or_path") or str(folder),
        "config_hash": config_hash(config),
        "num_layers": layout.num_layers,
        "num_kv_heads": H,
        "granularity": granularity,
        "method": "imported",
        "format": "fp8_e4m3",
        "source": str(folder),
    }
    provenance = folder / PROVENANCE_FILE
    if provenance.is_file():
        meta["calibration"] = json.loads(provenance.read_text())
    return ScaleTable(k.float().contiguous(), v.float().contiguous(), meta)
