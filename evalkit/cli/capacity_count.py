"""`evalkit capacity` without ``--engine``: counted capacity per rank and per deployment, and the GPU table.

Reads the model (a preset, a config.json or a model's config), its weight footprint, the GPU and the
deployment from the flags (:mod:`evalkit.cli.capacity` lists them), sizes each rank's KV budget
(:mod:`evalkit.planning.deployment`) and prints one row per scheme (:mod:`evalkit.planning.capacity`), with
the lines that say how each figure was made. Every bad input is one line (exit 2) before anything is
counted.
"""

from __future__ import annotations

import argparse
import json
import math

from evalkit.errors import EvalkitError

DEFAULT_MEMORY = "80GiB"
DEFAULT_SCHEMES = (
    "auto,fp8_e4m3/tensor/dynamic,fp8_e4m3/head/dynamic,fp8_e4m3/block16/dynamic,mxfp8_e4m3,"
    "int4/group32/dynamic,nvfp4,sglang_fp4,mxfp4"
)
MLA_SCHEMES = (
    "auto,fp8_e4m3/tensor/dynamic,fp8_e4m3/group128/dynamic+rope=bf16,fp8_e4m3/token/dynamic,"
    "mxfp8_e4m3+rope=bf16,nvfp4+rope=bf16,nvfp4,sglang_fp4+rope=bf16,mxfp4+rope=bf16"
)
DSV4_SCHEMES = "auto,fp8_e4m3/tensor/dynamic,dsv4:fp8_ds_mla,dsv4:fp8_ds_mla_v41,mxfp8_e4m3"  # DeepSeek V4 layouts


def fitting(layout, schemes) -> tuple[list, list[str]]:
    """The default schemes this model's tensors can hold, and a note for each one left out."""
    from evalkit.errors import SchemeError
    from evalkit.kv.memory import check_layout_scheme

    keep, notes = [], []
    for scheme in schemes:
        try:
            check_layout_scheme(scheme, layout)
            keep.append(scheme)
        except SchemeError as exc:
            notes.append(f"{scheme} left out of the default list: {exc}")
    return keep, notes


def list_gpus() -> int:
    from evalkit.planning.gpus import GPUS
    from evalkit.planning.kv_backends import kv_support, runnable

    def dtypes(gpu, kind):
        support = [kv_support(gpu, d, kind=kind) for d in runnable(gpu, kind)]
        return ", ".join(s.dtype + (f" (with {s.needs})" if s.needs else "") for s in support)

    for gpu in GPUS.values():
        print(f"{gpu.key:7} {gpu.describe()}")
        print(f"        vLLM 0.33 kv_cache_dtype, standard attention (head_size 128): {dtypes(gpu, 'standard')}")
        print(f"        MLA (DeepSeek-V3, Kimi K2): {dtypes(gpu, 'mla')}")
        print(f"        source: {gpu.source}")
    print(
        "(a dtype's backend and conditions: evalkit/planning/kv_backends.py; memory figures: evalkit/planning/gpus.py)"
    )
    return 0


def _deployment_line(layout, arch, par) -> str:
    from evalkit.planning.parallel import kv_heads_per_rank, stage_layers

    text = f"deployment: {par.gpus} GPU(s), {par}: "
    if layout.is_mla:
        text += "each rank stores the whole MLA latent of every token its TP group serves"
        text += f" (replicated on the {par.tp} TP ranks)" if par.tp > 1 else ""
        text += f"; {par.dp} data-parallel ranks each hold their own requests' latents" if par.dp > 1 else ""
    else:
        heads = kv_heads_per_rank(layout.num_kv_heads, par.tp)
        text += f"each rank stores {heads} of the {layout.num_kv_heads} KV heads of its TP group's tokens"
        text += (
            f" (each head replicated on {par.tp // layout.num_kv_heads} ranks)" if par.tp > layout.num_kv_heads else ""
        )
        text += f"; {par.dp} replicas" if par.dp > 1 else ""
    if par.pp > 1:
        sizes = [len(r) for r in stage_layers(layout.num_layers, par.pp)]
        text += f"; {par.pp} pipeline stages of {'/'.join(map(str, sizes))} layers"
    if par.expert_parallel and arch is not None:
        text += f"; experts spread over {par.ep} ranks ({math.ceil(arch.experts / par.ep)} of {arch.experts} per rank)"
    return text


def _reserve_line(stage, dep) -> str:
    from evalkit.units import format_bytes as fb

    est = stage.estimate
    if est is None:
        given = dep.reserve is not None
        return (
            f"reserve per rank: {fb(stage.reserve)} ({'given' if given else 'not estimated: the config has no parts'})"
        )
    parts = f"forward {fb(est.forward)} [{dep.batch.tokens:,} batched tokens x {est.width:,} values x 2 B]"
    if est.sampler:
        parts += f", sampler {fb(est.sampler)} [{est.requests:,} sequences x {est.vocab:,} vocab x 14 B]"
    return (
        f"reserve per rank: max({parts}) + CUDA graphs {fb(est.graphs)} [forward at {est.largest_graph:,} tokens + "
        f"{est.floor_graphs} graphs x 1 MiB] = {fb(est.total)} ({est.total:,} B; estimated as vLLM's profiler "
        "sizes it, docs/sizing.md; --reserve SIZE takes vLLM's own)"
    )


def count(args: argparse.Namespace) -> int:
    from evalkit.kv.scheme import parse_schemes
    from evalkit.models.folder import load_config, weights_source
    from evalkit.models.info import kv_layout
    from evalkit.models.presets import config_namespace
    from evalkit.planning.capacity import format_ranks, layout_notes, parse_count, plan_ranks
    from evalkit.planning.deployment import Deployment, model_bytes, stages
    from evalkit.planning.gpus import get_gpu
    from evalkit.planning.parallel import make_parallel
    from evalkit.planning.reserve import Batch, serve_defaults
    from evalkit.planning.vllm_sizing import vllm_sizing
    from evalkit.planning.weights import Architecture, model_params
    from evalkit.units import format_bytes as fb
    from evalkit.units import parse_bytes

    context = parse_count(args.context or "32k")
    card = get_gpu(args.gpu) if args.gpu else None
    memory = parse_bytes(args.gpu_memory) if args.gpu_memory else (card.memory if card else parse_bytes(DEFAULT_MEMORY))
    par, par_note = make_parallel(
        args.tensor_parallel, args.pipeline_parallel, args.data_parallel, args.expert_parallel, args.gpus
    )
    for flag in ("max_num_batched_tokens", "max_num_seqs"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise EvalkitError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    fields, label, preset = load_config(args)
    layout = kv_layout(config_namespace(fields))
    if args.schemes:
        schemes, left_out = parse_schemes(args.schemes), []
    else:
        default = (
            DSV4_SCHEMES if layout.compress_ratios is not None else MLA_SCHEMES if layout.is_mla else DEFAULT_SCHEMES
        )
        schemes, left_out = fitting(layout, parse_schemes(default))
    arch = Architecture.from_config(fields)
    dtype, block, total, weights_note = weights_source(args, preset, fields, arch)
    tokens, seqs = serve_defaults(memory, card.name if card else "")
    batch = Batch(
        args.max_num_batched_tokens or tokens, args.max_num_seqs or seqs, 1024 if card and card.sm100_family else 512
    )
    reserve = parse_bytes(args.reserve) if args.reserve else None
    sizing = vllm_sizing(args.vllm_version) if args.vllm_version else None
    utilization = args.utilization if args.utilization is not None else (sizing.utilization if sizing else 0.9)
    dep = Deployment(memory, utilization, par, batch, reserve, sizing)
    plan = stages(dep, layout.num_layers, arch, dtype, block, total)
    rows = plan_ranks(layout, schemes, plan, par, context, card, sizing.block_size if sizing else 1)
    notes = ([par_note] if par_note else []) + left_out + layout_notes(layout, schemes)
    gpu_name = card.key.upper() if card else None
    notes += [f"{r.scheme} ({r.vllm_dtype}) on {gpu_name}: {r.vllm_reason}" for r in rows if r.vllm == "no"]
    fa2 = [r.scheme for r in rows if r.vllm and "FA2 path" in r.vllm]
    if fa2:
        notes.append(
            f"{', '.join(fa2)} on {gpu_name}: vLLM 0.33 stores nvfp4 off SM 10.x through FlashInfer's FA2 path (BF16 "
            "queries; flashinfer.py _nvfp4_kv_on_fa2, refused at head_size 64), not the SM100 TensorRT-LLM kernels"
        )
    other = [r.scheme for r in rows if r.vllm == "-"]
    if other:
        notes.append(f"not a vLLM kv_cache_dtype (SGLang, TensorRT-LLM or evalkit-only layouts): {', '.join(other)}")
    if args.json:
        from dataclasses import asdict

        out = {
            "model": label,
            "context": context,
            "gpu": card.key if card else None,
            "gpu_memory": memory,
            "utilization": utilization,
            "vllm_version": sizing.version if sizing else None,
            "block_size": sizing.block_size if sizing else None,
            "parallel": asdict(par),
            "batch": {"max_num_batched_tokens": batch.tokens, "max_num_seqs": batch.seqs},
            "stages": [
                {"stage": s.index, "layers": [s.layers.start, s.layers.stop], "weights_bytes": s.weights,
                 "reserve_bytes": s.reserve, "usable_bytes": s.usable, "margin_bytes": s.margin,
                 "kv_budget": s.kv_budget,
                 "reserve": asdict(s.estimate) if s.estimate else None}
                for s in plan
            ],
            "rows": [asdict(r) for r in rows],
            "notes": notes,
        }  # fmt: skip
        print(json.dumps(out, indent=1))
        return 0
    kind = (
        f"MLA: latent {layout.mla_latent_dim} + RoPE key {layout.mla_rope_dim} per token per layer"
        if layout.is_mla
        else f"{layout.num_kv_heads} KV heads x head_dim {layout.head_dim}"
    )
    print(f"model: {label}: {layout.num_layers} layers, {kind}")
    if card:
        memory_note = "" if not args.gpu_memory else f"; memory given: {fb(memory)}"
        print(f"GPU: {card.describe()}{memory_note}")
    else:
        print(f"GPU: {fb(memory)} each ({'given' if args.gpu_memory else 'the default'}; --gpu NAME takes a GPU's own)")
    print(_deployment_line(layout, arch, par))
    params = f"{model_params(arch):,} parameters; " if arch else ""
    whole = f" = {fb(model_bytes(arch, dtype, block))} in all" if arch and total is None else ""
    print(f"weights: {params}{weights_note}{whole}")
    for s in plan:
        where = f"stage {s.index} (layers {s.layers.start}-{s.layers.stop - 1}) " if par.pp > 1 else ""
        parts = ", ".join(f"{k} {fb(v)}" for k, v in s.parts.items())
        print(f"{where}weights per rank: {fb(s.weights)} ({s.weights:,} B){': ' + parts if parts else ''}")
        print(f"{where}{_reserve_line(s, dep)}")
        usable = f"ceil({memory / 2**30:.2f} GiB x {utilization:g})"
        if s.margin:
            usable = f"min({usable}, {memory / 2**30:.2f} GiB - margin {fb(s.margin)})"
        print(
            f"{where}KV budget per rank: {usable} = {fb(s.usable)} - weights "
            f"{fb(s.weights)} - reserve {fb(s.reserve)} = {fb(s.kv_budget)} ({s.kv_budget:,} B)"
        )
    blocks = f"; whole blocks of {sizing.block_size} tokens" if sizing else ""
    print(f"context {context:,} tokens; batch profiled: {batch.tokens:,} tokens, {batch.seqs:,} sequences{blocks}")
    if sizing:
        print(f"sizing: {sizing.describe()}")
    print()
    print(format_ranks(rows, context, card))
    if notes:
        print("\nNotes (bytes are data + each scale at its storage size; where engines lay it out differently):")
        for note in notes:
            print(f"- {note}")
    return 0
