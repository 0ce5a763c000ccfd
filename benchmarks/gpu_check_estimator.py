"""gpu_check's section 6: the sweep dry run's estimator against what the real-size model measures here.

The dry run's facts of the real-size config (:mod:`evalkit.models.facts`) against the model built; its real probe
(:mod:`evalkit.sweep.speed_probe`), run on that model in memory, and its ``--assume-device h200`` datasheet
estimate (:mod:`evalkit.sweep.throughput`) against the prefill measured here and every decode arm section 4
timed; the datasheet is judged (within :data:`ESTIMATE_FACTOR`) on an H200 only.
Imported by benchmarks/gpu_check.py.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import torch
from gpu_check_models import REAL_PRESET, ensure_real, unique_params

if TYPE_CHECKING:
    from gpu_check_budget import Section
    from gpu_check_models import Context

ESTIMATE_FACTOR = 1.5  # the datasheet estimate within this factor of the measured time (judged on an H200)


def real_facts(ctx: Context, model):
    """The dry run's facts (evalkit.models.facts: the parameter count from the config on the meta
    device) for the real-size config, loaded as here."""
    from evalkit.models.facts import ModelFacts, _from_config

    facts = ModelFacts(
        name=f"{REAL_PRESET} (random weights{'' if ctx.cuda else ', CPU stand-in'})",
        dtype_bytes=float(model.dtype.itemsize),
        weights_local=True,
        source="gpu_check's model in memory",
    )
    _from_config(facts, dict(ctx.sizes.real))
    return facts


def estimator(sec: Section, ctx: Context) -> None:
    from evalkit.integration.install import quantized_kv
    from evalkit.models import loading as models
    from evalkit.models.info import config_hash, kv_layout
    from evalkit.models.presets import get_preset
    from evalkit.sweep import speed_probe as P
    from evalkit.sweep import throughput as T
    from evalkit.sweep.workload import Forwards

    model = ensure_real(ctx)
    if model is None:
        sec.skip("dry-run estimate vs measured", ctx.real_error)
        return
    facts = real_facts(ctx, model)
    built = unique_params(model)
    figures = {
        "params": facts.params,
        "layers": facts.layers,
        "attn_width": facts.attn_width,
        "kv_width": facts.kv_width,
        "params_of_built_model": built,
    }
    ok = facts.params == built and facts.layers == model.config.num_hidden_layers
    if ctx.cuda:  # the preset's published count, which the dry run uses for a model that is not cached
        published = get_preset(REAL_PRESET)["params"]
        figures["preset_published_params"] = published
        ok &= abs(built / published - 1) < 0.01
    sec.check("dry-run facts of the real-size model match the built model", ok, figures)
    if not sec.fits(1.0):
        sec.cut(["dry-run estimate (probe and --assume-device h200) vs measured"])
        return
    # the dry run's real probe, on the model in memory
    loaded = models.LoadedModel(
        model, None, facts.name, "in memory", config_hash(model.config), kv_layout(model.config)
    )
    t = time.perf_counter()
    probes = {c: P.probe_model(loaded, facts, compiled=c) for c in (False, True)}  # both decode paths
    probe_s = time.perf_counter() - t
    sheets = {c: T.datasheet(facts, "h200", compiled=c) for c in (False, True)}
    probe, sheet = probes[True], sheets[True]
    # measured prefill: one forward of the prefill length under the probe's scheme, timed as the probe times its own
    head = model.get_output_embeddings()
    g = torch.Generator(device=ctx.device).manual_seed(5)
    ids = torch.randint(10, head.out_features, (1, ctx.sizes.prefill), device=ctx.device, generator=g)
    with torch.inference_mode(), quantized_kv(model, P.PROBE_SCHEME):
        model.base_model(input_ids=ids, use_cache=False)  # warm-up at the full length (the first call is not warm)
        ctx.sync()
        t = time.perf_counter()
        hidden = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
        for chunk in hidden.split(1024, dim=1):  # the head over every position (the estimator counts its FLOPs), in
            head(chunk).float()  # pieces so that no (tokens x vocabulary) tensor is held at once
        ctx.sync()
        t_prefill = time.perf_counter() - t
        del hidden
    measured = [("prefill", Forwards(1, 1, ctx.sizes.prefill, 0.0), t_prefill, False, None)]
    for run in ctx.speed_runs:  # every decode arm: the compiled ones priced on the compiled path
        compiled = "compiled" in run["arm"]
        length = run["context"] + ctx.sizes.warmup + ctx.sizes.steps + 4
        stored = None
        if run.get("scheme"):
            from evalkit.kv.memory import bytes_per_element
            from evalkit.kv.scheme import parse_scheme

            stored = bytes_per_element(parse_scheme(run["scheme"]), facts.head_dim or 128)
        measured.append(
            (
                f"{run['arm']}: step at {run['context']} context, batch {run['batch']}",
                Forwards(1, run["batch"], 1, run["context"] + ctx.sizes.warmup + ctx.sizes.steps / 2, length),
                run["step_ms"] / 1e3,
                compiled,
                stored,
            )
        )
    device_name = torch.cuda.get_device_name(ctx.device) if ctx.cuda else "cpu"
    judged = ctx.cuda and "H200" in device_name
    rows = []
    for what, fw, secs, compiled, stored in measured:
        p_sheet = sheets[compiled].seconds(fw, facts, stored)
        p_probe = probes[compiled].seconds(fw, facts, stored)
        rows.append(
            {
                "what": what,
                "measured_s": secs,
                "datasheet_h200_s": p_sheet,
                "probe_s": p_probe,
                "datasheet_vs_measured": p_sheet / secs,
                "probe_vs_measured": p_probe / secs,
            }
        )
    finite = all(
        math.isfinite(r["datasheet_h200_s"]) and math.isfinite(r["probe_s"]) and r["probe_s"] > 0 for r in rows
    )
    within = all(1 / ESTIMATE_FACTOR <= r["datasheet_vs_measured"] <= ESTIMATE_FACTOR for r in rows)
    ok = finite and (within or not judged)
    reason = "" if judged else f"not judged: the datasheet estimate is for an H200, this is {device_name}"
    if judged and not within:
        reason = f"the datasheet estimate is off by more than {ESTIMATE_FACTOR:g}x somewhere"
    for r in rows:
        print(
            f"      {r['what']:38s} measured {r['measured_s'] * 1e3:10.2f} ms, h200 datasheet {r['datasheet_h200_s'] * 1e3:10.2f} ms, "
            f"probe {r['probe_s'] * 1e3:10.2f} ms",
            flush=True,
        )
    sec.check(
        "dry-run estimate (probe and --assume-device h200) vs measured",
        ok,
        {
            "rows": rows,
            "judged": judged,
            "factor": ESTIMATE_FACTOR,
            "device": device_name,
            "probe": {
                "description": probe.description,
                "flops": probe.flops,
                "bandwidth": probe.bandwidth,
                "seconds": probe_s,
            },
            "datasheet": {
                "description": sheet.description,
                "flops": sheet.flops,
                "bandwidth": sheet.bandwidth,
                "overhead_s": sheet.overhead,
            },
        },
        reason,
    )
