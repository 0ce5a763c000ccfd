"""gpu_check's sections 1 and 3: the identity scheme and every scale source through the storage path.

1. under ``bf16`` the logits of a padded batch and a greedy ``generate()`` equal the plain model's bit for bit;
3. every scale source (dynamic, static from the shipped calibration tables, unit) over every granularity, the
   4-bit formats and the named schemes: a padded teacher-forced decode runs, every tensor the cache keeps is on
   the device, the stored bytes decode to what attention reads, the logits are finite and close to the
   baseline's (mean KL under :data:`KL_LIMIT`).

Imported by benchmarks/gpu_check.py, which runs them on its embedded model (:mod:`gpu_check_models`).
"""

from __future__ import annotations

import time
import traceback
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from gpu_check_budget import Section
    from gpu_check_models import Context

CALIBRATION = {"tensor": "smollm2-135m-tensor-amax.safetensors", "head": "smollm2-135m-head-amax.safetensors"}
KL_LIMIT = 0.5  # nats: mean KL(baseline || scheme) over the real positions of the storage section


def identity(sec: Section, ctx: Context) -> None:
    from evalkit import quantized_kv

    model = ctx.embedded()
    ids, mask = ctx.padded_batch(model.config.vocab_size)
    n = ctx.sizes.generate
    kwargs = dict(attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=2)
    with torch.inference_mode():
        t = time.perf_counter()
        ref = model(ids, attention_mask=mask).logits
        gen = model.generate(ids, **kwargs)
        with quantized_kv(model, "bf16"):
            out = model(ids, attention_mask=mask).logits
            gen2 = model.generate(ids, **kwargs)
        ctx.sync()
        t = time.perf_counter() - t
    shape = {
        "batch": ids.shape[0],
        "tokens": ids.shape[1],
        "padded_rows": int((mask == 0).any(-1).sum()),
        "layers": model.config.num_hidden_layers,
        "dtype": "bfloat16",
    }
    diff = float((ref.float() - out.float()).abs().max())
    sec.check(
        "identity: logits of a padded batch bit-exact under bf16",
        torch.equal(ref, out),
        {**shape, "max_abs_diff": diff},
        seconds=t,
    )
    sec.check(
        f"identity: greedy generate() of {n} tokens bit-exact under bf16",
        torch.equal(gen, gen2),
        {**shape, "new_tokens": n, "tokens_differing": int((gen != gen2).sum())},
    )


def storage_schemes() -> list[str]:
    from evalkit.kv.scheme import NAMED_SCHEMES, parse_scheme

    schemes = [
        "fp8_e4m3/tensor/dynamic",
        "fp8_e4m3/head/dynamic",
        "fp8_e4m3/block16/dynamic",
        "fp8_e4m3/token/dynamic",
        "fp8_e5m2/group32/dynamic",
        "fp8_e4m3/tensor/unit",
        "fp8_e4m3/head/unit",
        "fp8_e4m3/block16/unit",
        f"fp8_e4m3/tensor/static+scales=calibration/{CALIBRATION['tensor']}",
        f"fp8_e4m3/head/static+scales=calibration/{CALIBRATION['head']}",
        "int8/token/dynamic",
        "int4_asym/group32/dynamic",
        "fp8_e4m3fnuz/head/dynamic",
        "fp8_e4m3/head/dynamic+attn=fa3",
        "fp4_e2m1/group16/dynamic",
        *NAMED_SCHEMES,
        "fp8_e4m3/tensor/dynamic+rounding=rtz",
        "fp8_e5m2/head/dynamic+rounding=rna",
        "int8/token/dynamic+rounding=rtz",
    ]
    usable = []
    for s in schemes:
        try:
            parse_scheme(s)
            usable.append(s)
        except Exception:  # noqa: BLE001 - a format or option this version does not have
            pass
    return usable


def shipped_table(scheme, layout):
    """The shipped static table a scheme names, cut to the model's layers (the 2-layer CPU model)."""
    from evalkit.data.resources import resolve_calibration_file
    from evalkit.kv.scale_table import ScaleTable, load_scale_table

    path = resolve_calibration_file(scheme.static_path)
    table = load_scale_table(path, granularity=scheme.granularity.kind.value)
    n = layout.num_layers
    return ScaleTable(table.k_scale[:n].clone(), table.v_scale[:n].clone(), table.meta), path


def scheme_label(text: str) -> str:
    return (text.split("+scales=")[0] + ("+scales=<shipped table>" if "+scales=" in text else "")) + ": through storage"


def schemes_through_storage(sec: Section, ctx: Context) -> None:
    from evalkit import quantized_kv
    from evalkit.integration.hf_compat import cache_inputs, output_cache
    from evalkit.kv.scheme import ScaleSource, parse_scheme
    from evalkit.models.info import kv_layout

    model = ctx.embedded()
    layout = kv_layout(model.config)
    ids, mask = ctx.padded_batch(model.config.vocab_size)
    prefill = ids.shape[1] - ctx.sizes.decode
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        ref = model(ids, attention_mask=mask, position_ids=pos).logits.float()
    real = mask.bool()
    schemes = storage_schemes()
    last = 0.0
    for i, text in enumerate(schemes):
        if not sec.fits(last):
            sec.cut([scheme_label(s) for s in schemes[i:]])
            return
        t = time.perf_counter()
        try:
            scheme = parse_scheme(text)
            table, extra = None, {}
            if scheme.scales is ScaleSource.STATIC:
                table, path = shipped_table(scheme, layout)
                extra = {"table": path.name, "table_layers_used": layout.num_layers}
            with torch.inference_mode(), quantized_kv(model, scheme, scale_table=table):
                out = model(
                    ids[:, :prefill], attention_mask=mask[:, :prefill], position_ids=pos[:, :prefill], use_cache=True
                )
                cache, logits = output_cache(out), [out.logits.float()]
                for step in range(prefill, ids.shape[1]):
                    out = model(
                        ids[:, step : step + 1],
                        attention_mask=mask[:, : step + 1],
                        position_ids=pos[:, step : step + 1],
                        **cache_inputs(model, cache),
                    )
                    logits.append(out.logits.float())
            logits = torch.cat(logits, dim=1)
            stores = [st for layer in cache.storage_layers() for st in (layer.k, layer.v)]
            devices = sorted(
                {
                    tt.device.type
                    for st in stores
                    for tt in (st.codes, st.values, st.scale, st.zero, st.fixed, st.tensor_scale)
                    if tt is not None
                }
            )
            exact = True
            for st in stores:
                sel = real[:, None, -st.values.shape[2] :, None].expand_as(st.values)
                exact &= torch.equal(st.decoded().to(st.values.dtype)[sel], st.values[sel])
            lp, lq = torch.log_softmax(ref[real].double(), -1), torch.log_softmax(logits[real].double(), -1)
            kl = float((lp.exp() * (lp - lq)).sum(-1).mean())
            top1 = float((ref[real].argmax(-1) == logits[real].argmax(-1)).double().mean())
            finite = bool(torch.isfinite(logits[real]).all())
            ctx.sync()
            ok = devices == [ctx.device.type] and exact and finite and kl < KL_LIMIT
            last = time.perf_counter() - t
            sec.check(
                scheme_label(text),
                ok,
                {
                    "devices": devices,
                    "decoded_equals_values": bool(exact),
                    "finite": finite,
                    "mean_kl_nats": kl,
                    "kl_limit": KL_LIMIT,
                    "top1_agreement": top1,
                    "engine_bytes": cache.nbytes(),
                    "prefill": prefill,
                    "decode_steps": ctx.sizes.decode,
                    **extra,
                },
                "" if ok else f"devices {devices}, decoded == values: {bool(exact)}, finite: {finite}, KL {kl:.4f}",
                seconds=last,
            )
        except Exception as exc:  # noqa: BLE001 - report and go on
            traceback.print_exc()
            last = time.perf_counter() - t
            sec.check(scheme_label(text), False, reason=f"{type(exc).__name__}: {exc}", seconds=last)
