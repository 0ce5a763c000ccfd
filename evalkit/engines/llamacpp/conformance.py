"""``conformance --engine llamacpp``: evalkit's llama.cpp schemes held against llama.cpp itself.

Kernel level: ggml's own CPU quantizers (the ``from_float`` of each cache type, which the KV-cache
write calls, reached through ctypes: :mod:`evalkit.engines.llamacpp.ggml_lib`) and evalkit's encoder
(:mod:`evalkit.kv.codecs.llamacpp.ggml_blocks`) are fed the same float32 rows: synthetic rows (several magnitudes,
exact ties, zeros, tiny and fp16-overflowing values) and the embedded model's own post-RoPE K and V
(captured from the emulation's storage cache). Their bytes are compared block by block and every
difference is reported by class.

End to end: on the same windows of a corpus, per scored token t,

* ``d_eng(t)``: llama.cpp with the scheme's cache minus llama.cpp with its f16 cache (flash attention
  on in both), from llama.cpp's own full-vocabulary logits on the GGUF's own weights;
* ``d_emu(t)``: evalkit's emulation (the transformers model on the GGUF's dequantized weights, in
  float32, K/V through the ``llamacpp:`` scheme) minus that model unquantized;
* ``d_s(t)`` per noise seed: the emulation on a weight copy moved by a few ulps, against that copy's
  own unquantized run.

The gap ``Δppl_emu - Δppl_eng`` and the per-token r with paired block-bootstrap intervals, the noise
quantiles and the verdict are :mod:`evalkit.evals.paired_stats`' rule, as for vLLM
(:mod:`evalkit.engines.conformance_e2e`, whose token store this writes too). KL and top-1 agreement
are given for both sides: llama.cpp's KL is exact (full vocabulary), the emulation's the 2 KB
summary's estimate. The engine's weights are Q4_1 and its attention accumulates differently (Q
converted to K's dot type, an FP16 V accumulator with an f16 V cache), so the two baselines differ:
``baseline_nll_gap`` says by how much; what is held equal is the *change* the cache makes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from evalkit.engines.conformance_table import COMPARISON_HEADERS, comparison_cells
from evalkit.errors import EvalkitError
from evalkit.evals import paired_stats as ps

DEFAULT_SCHEMES = ("llamacpp:q8_0", "llamacpp:q4_0")
REPORT_FORMAT = "evalkit llamacpp conformance 1"
NOISE_SEEDS = 20


def schemes_of(text) -> list[str]:
    """The quantized llama.cpp schemes of ``--schemes`` (canonical strings), refusing others in one line."""
    from evalkit.engines.llamacpp.engine import BASELINE_TYPES, cache_types
    from evalkit.kv.scheme import parse_schemes

    out = []
    for s in parse_schemes(text):
        if cache_types(s) != BASELINE_TYPES:
            out.append(str(s))
    if not out:
        raise EvalkitError("conformance --engine llamacpp needs at least one quantized llamacpp:<k>[/<v>] scheme")
    return list(dict.fromkeys(out))


# -- kernel level -----------------------------------------------------------------------------------
def kernel_section(schemes: list[str], model_rows: dict[str, np.ndarray] | None, seed: int = 0) -> list[dict]:
    """Per cache type the schemes use for K or V: ggml's bytes against evalkit's, by row source."""
    from evalkit.engines.llamacpp import ggml_lib
    from evalkit.engines.llamacpp.engine import cache_types

    types = list(dict.fromkeys(t for s in schemes for t in cache_types(s)))
    sources = {"synthetic": ggml_lib.synthetic_rows(seed=seed)}
    for role, rows in (model_rows or {}).items():
        sources[f"model {role.upper()}"] = rows
    out = []
    for name, rows in sources.items():
        for row in ggml_lib.kernel_conformance(types, rows):
            out.append({"rows": name, **row})
    return out


def model_rows(lm, corpus: str, length: int, max_rows: int = 4096) -> dict[str, np.ndarray]:
    """Post-RoPE K and V rows (one per token and layer, all KV heads), float32, as a KV cache receives
    them: the unquantized model's own cache after the first ``length`` tokens of ``corpus``."""
    import torch

    from evalkit.data.corpus import load_corpus, tokenize_corpus

    ids = tokenize_corpus(load_corpus(corpus), lm.tokenizer, None)[:length]
    rows = {"k": [], "v": []}
    with torch.inference_mode():
        cache = lm.model(input_ids=ids[None].to(lm.device), use_cache=True).past_key_values
    layers = [(layer.keys, layer.values) for layer in cache.layers] if hasattr(cache, "layers") else list(cache)
    for k, v in layers:
        for role, x in (("k", k), ("v", v)):  # (1, H, S, D) -> one row per token: H * D values, head-major
            rows[role].append(x[0].permute(1, 0, 2).reshape(x.shape[2], -1).float().cpu().numpy())
    return {r: np.concatenate(x)[:max_rows] for r, x in rows.items()}


# -- end to end -------------------------------------------------------------------------------------
def end_to_end(
    schemes: list[str],
    *,
    model: str = "embedded",
    corpus: str = "embedded",
    windows: int = 4,
    length: int = 512,
    noise_seeds=tuple(range(1, NOISE_SEEDS + 1)),
    ulps: float = 1.0,
    settings=None,
    tokens_path: Path | None = None,
    workdir: Path | None = None,
    n_threads: int = 2,
    progress=None,
    lm=None,
) -> list[dict[str, Any]]:
    """One row per scheme (see the module docstring)."""

    from evalkit.engines.conformance_e2e import Settings, _change, noise_changes, prepared_emulation, save_tokens
    from evalkit.engines.llamacpp.backend import LlamaCppBackend
    from evalkit.engines.llamacpp.engine import cache_types
    from evalkit.evals.perplexity.evaluation import PerplexityEval
    from evalkit.kv.scheme import parse_scheme
    from evalkit.models.loading import cache_root, load_model

    say = progress or (lambda text: None)
    settings = settings or Settings()
    if len(tuple(noise_seeds)) < 2:
        raise EvalkitError("conformance needs at least 2 noise seeds for a noise quantile (default 20)")
    backend = LlamaCppBackend(n_threads=n_threads)
    lm = lm or load_model(model, dtype="float32")
    backend.check_model(lm)
    workdir = Path(workdir) if workdir is not None else cache_root() / "work"
    params = dict(corpus=corpus, window=length, stride=length, max_windows=windows, bootstrap_samples=100)
    parsed = [parse_scheme(s) for s in schemes]

    say("emulation baseline")
    emu = prepared_emulation(params, workdir, lm)
    emu_scores = [emu.token_scores(lm, s) for s in parsed]
    per = [{"profile": _change(sc)} for sc in emu_scores]
    noise = noise_changes(lm, parsed, noise_seeds, ulps, params, workdir, say)
    say("llama.cpp: f16 baseline and each scheme")
    eng = PerplexityEval(params, backend=backend)
    eng.prepare(lm, workdir)
    ids = ps.block_ids(emu.offsets, settings.block)
    rows = []
    try:
        for i, (s, sc) in enumerate(zip(parsed, emu_scores)):
            say(f"{s}: llama.cpp")
            e = eng.token_scores(lm, s)
            per[i]["engine"] = _change(e)
            per[i]["noise"] = noise[i]
            q_gap, q_r, gaps, rs = ps.noise_quantiles(per[i]["profile"], per[i]["noise"])
            boot = ps.BlockBootstrap(ids, settings.resamples, settings.seed)
            c = ps.compare(per[i]["profile"], per[i]["engine"], q_gap, q_r, boot, settings.tolerance).as_dict()
            k, v = cache_types(s)
            base_gap = float((e.base_nll.double() - sc.base_nll.double()).mean())
            rows.append(
                {
                    "scheme": str(s),
                    "type_k": k,
                    "type_v": v,
                    "engine_dppl_pct": round(ps.dppl_pct(per[i]["engine"]), 4),
                    "emulation_dppl_pct": round(ps.dppl_pct(per[i]["profile"]), 4),
                    **{key: (round(val, 4) if isinstance(val, float) else val) for key, val in c.items()},
                    "engine_kl": round(float(e.kl.double().mean()), 6),
                    "emulation_kl": round(float(sc.kl.double().mean()), 6),
                    "engine_top1": round(float(e.agree.double().mean()), 4),
                    "emulation_top1": round(float(sc.agree.double().mean()), 4),
                    "noise_seeds": len(per[i]["noise"]),
                    "noise_gaps_pp": [round(float(g), 4) for g in gaps],
                    "noise_rs": [round(float(r), 4) for r in rs],
                    "baseline_nll_gap": float(f"{base_gap:.3g}"),
                    "engine": f"{backend.name} (f16 baseline, flash attention, {n_threads} threads)",
                }
            )
    finally:
        backend.close()
    if tokens_path is not None:
        meta = {"noise_seeds": [int(s) for s in noise_seeds], "ulps": ulps, "dtype": "float32", "windows": windows}
        save_tokens(Path(tokens_path), [str(s) for s in parsed], per, emu.offsets, settings, meta)
    return rows


# -- the command ------------------------------------------------------------------------------------
def run_cli(args: argparse.Namespace) -> int:
    """``conformance --engine llamacpp [--schemes S,...] [--kernel-only] [--out DIR] [--from DIR]``."""
    if args.stored is not None:
        sys.stdout.write(render(load_report(args.stored), args.output_format))
        return 0
    if getattr(args, "kernel", "cpu") != "cpu":
        raise EvalkitError("--kernel triton runs vLLM's Triton stores: drop it for --engine llamacpp")
    text = args.schemes or ",".join(DEFAULT_SCHEMES)  # --schemes not given: llama.cpp's own
    schemes = schemes_of(text)
    if args.windows < 1 or args.length < 16 or args.noise_seeds < 2 or not args.noise_ulps > 0:
        raise EvalkitError(
            f"--windows {args.windows} --length {args.length} --noise-seeds {args.noise_seeds} "
            f"--noise-ulps {args.noise_ulps}: give at least 1 window of 16 tokens, 2 noise seeds and ulps above 0"
        )
    if args.dtype != "float32":
        raise EvalkitError("--engine llamacpp holds the float32 emulation of the GGUF against it: drop --dtype")
    from evalkit.runtime.folders import check_writable  # noqa: I001 (this order keeps the hashed normalised source)
    from evalkit.engines.llamacpp import runtime
    from evalkit.engines.llamacpp.gguf import gguf_path

    check_writable(args.out, "--out")
    runtime.require()
    gguf_path(args.model)  # a model llama.cpp cannot load: one line, before any work
    from evalkit.models.loading import load_model

    lm = load_model(args.model, dtype="float32")
    kernel = kernel_section(schemes, model_rows(lm, args.corpus, args.length), seed=args.seed)
    e2e, status = None, "skipped (--kernel-only)"
    if not args.kernel_only:
        tokens = args.out / "conformance_tokens.safetensors" if args.out else None
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
        e2e = end_to_end(
            schemes,
            model=args.model,
            corpus=args.corpus,
            windows=args.windows,
            length=args.length,
            noise_seeds=tuple(range(1, args.noise_seeds + 1)),
            ulps=args.noise_ulps,
            tokens_path=tokens,
            lm=lm,
            progress=lambda t: print(f"evalkit: {t}", file=sys.stderr, flush=True),
        )
        status = "measured"
    report = {
        "format": REPORT_FORMAT,
        "engine": "llamacpp",
        "engine_version": runtime.version(),
        "schemes": schemes,
        "model": args.model,
        "corpus": args.corpus,
        "windows": args.windows,
        "length": args.length,
        "noise_seeds": args.noise_seeds,
        "noise_ulps": args.noise_ulps,
        "kernel": kernel,
        "end_to_end": e2e,
        "end_to_end_status": status,
        "platform": _platform(),
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "conformance.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    sys.stdout.write(render(report, args.output_format))
    return 0


def _platform() -> dict:
    from evalkit.runtime.numerics import platform_record

    return platform_record()


def load_report(folder: Path) -> dict:
    path = Path(folder) / "conformance.json"
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise EvalkitError(
            f"{path} cannot be read ({exc}): re-run `evalkit conformance --engine llamacpp --out DIR`"
        ) from None
    if report.get("format") != REPORT_FORMAT:
        raise EvalkitError(f"{path} is not a llama.cpp conformance report: read it with the --engine that wrote it")
    return report


KERNEL_HEADERS = ("rows", "type", "blocks", "byte-equal", "differences by class")
E2E_HEADERS = (*COMPARISON_HEADERS, "KL engine / emulation", "top-1 engine / emulation")


def kernel_cells(row: dict) -> list[str]:
    classes = "; ".join(f"{name}: {n}" for name, n in sorted(row["differences"].items())) or "none"
    return [row["rows"], row["type"], f"{row['blocks']:,}", f"{row['equal']:,}", classes]


def e2e_cells(row: dict) -> list[str]:
    return [
        *comparison_cells(row),
        f"{row['engine_kl']:.4f} / {row['emulation_kl']:.4f}",
        f"{row['engine_top1']:.3f} / {row['emulation_top1']:.3f}",
    ]


def _md(headers, rows) -> list[str]:
    return [
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def render(report: dict, fmt: str = "table") -> str:
    """The kernel table and the end-to-end table (``table``/``md`` the same Markdown), or JSON/CSV."""
    if fmt == "json":
        return json.dumps(report, indent=1, sort_keys=True) + "\n"
    if fmt == "csv":
        import csv
        import io

        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(("rows", "type", "blocks", "equal", "differences"))
        for row in report["kernel"]:
            w.writerow((row["rows"], row["type"], row["blocks"], row["equal"], json.dumps(row["differences"])))
        return buf.getvalue()
    out = [
        f"Kernel: ggml's CPU from_float ({report['engine_version']}) against evalkit's encoder, the same float32 rows, "
        "bytes compared block by block (32 values a block).",
        "",
        *_md(KERNEL_HEADERS, [kernel_cells(r) for r in report["kernel"]]),
        "",
        f"End to end: {report['end_to_end_status']}",
    ]
    e2e = report.get("end_to_end")
    if e2e:
        first = e2e[0]
        out[-1] += (
            f"; {first['n_tokens']:,} scored tokens ({report['windows']} windows of {report['length']}), "
            f"{first['engine']}. Gap = emulation Δppl − llama.cpp Δppl (each against its own unquantized run), "
            "r = per-token correlation of the NLL changes, each with a 95 % paired block bootstrap; noise: the "
            f"emulation on {report['noise_seeds']} weight copies moved by {report['noise_ulps']:g} ulp; the verdict "
            "is evalkit.evals.paired_stats' rule. llama.cpp's KL is exact (full vocabulary)."
        )
        out += ["", *_md(E2E_HEADERS, [e2e_cells(r) for r in e2e])]
        gaps = ", ".join(f"{r['scheme']} {r['baseline_nll_gap']:+.3g}" for r in e2e)
        out += ["", f"Baselines: llama.cpp f16 minus emulation float32 mean NLL per token: {gaps} nats."]
    return "\n".join(out) + "\n"
