"""``lmeval``: lm-evaluation-harness tasks under each KV scheme, on one loaded model, with flip rates.

    python -m evalkit run --eval lmeval --tasks evalkit_mmlu4,evalkit_passkey --limit 50 \\
        --schemes auto,fp8_e4m3/tensor/unit,int4/tensor/dynamic

The numbers are lm-eval's own (``simple_evaluate`` on an ``HFLM`` around the in-memory model; see
:mod:`evalkit.evals.lmeval.adapter`). ``prepare`` runs the baseline on the plain model (no hook), keeps
its per-item samples in memory and as JSON under the work folder (reused when model weights,
parameters, task files and library versions all match). ``evaluate`` runs the same tasks inside
``quantized_kv(model, scheme)`` and emits, per task (and filter):

* every lm-eval metric with its standard error: value, 95 % interval value ± 1.96·stderr (when
  lm-eval gives a stderr), the stderr itself in ``info``; for proportions (``acc``, ``acc_norm``,
  ``exact_match``: k of n items right) the Wilson interval instead, which stays inside [0, 1]
  where the normal interval of a small sample does not (8 items at 25 % gave [-0.07, 0.57]);
* ``flip_rate``, ``flip_right_to_wrong``, ``flip_wrong_to_right`` and ``gold_loglik_abs_delta``
  against the baseline's items (:mod:`evalkit.evals.lmeval.items`).

Metric names are ``<task>/<metric>`` (``[<filter>]`` appended when lm-eval's filter is not
``none``); ``labels`` hold task and filter. Every row's ``info`` carries the provenance needed to
reproduce it: lm-eval version, task name and version, n-shot, limit, number of items, batch size
and the task config lm-eval reports.

Batch size (``--lmeval-batch-size N|auto``, grid key ``batch_size``; default ``auto`` on CUDA, 8 on
CPU): every batch size gives each item its batch-size-1 log-likelihoods under every scheme (bit for
bit on CPU): padding is kept out of the KV scales and attention (:mod:`evalkit.evals.lmeval.batching`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, ClassVar

from evalkit.evals.backend import LmevalRequest, backend_of, stamp
from evalkit.evals.base import Criterion, Evaluation, MetricRow, ReportSpec, register_eval
from evalkit.evals.lmeval.params import DEFAULT_TASKS, LmEvalParams  # noqa: F401 (re-exported: they were declared here)


def _jsonable(obj):
    from lm_eval.utils import handle_non_serializable

    return json.loads(json.dumps(obj, default=handle_non_serializable))


@register_eval("lmeval")
class LmEvalEval(Evaluation):
    grows = "limit"
    request = "lmeval"
    Params = LmEvalParams
    summary_metrics: ClassVar[tuple[str, ...]] = ()
    report = ReportSpec(
        frames=("evalkit.evals.lmeval.report:frame",),
        displays=("evalkit.evals.lmeval.report:display",),
        criteria=(Criterion("{task} flips", "*/flip_rate", "max_flip_rate", True, "{task} flips", digits=1),),
        order=40,
    )

    @classmethod
    def workload(cls, params: dict[str, Any], facts, device: str = "cpu"):
        from evalkit.evals.lmeval.workload import lmeval_work

        return lmeval_work(params, facts, device)

    def canonical_params(self) -> dict[str, Any]:
        """The parameters, without ``chat_template`` while off: runs made before it existed keep their ids."""
        return {k: v for k, v in self.params.items() if not (k == "chat_template" and not v)}

    # ---- per model --------------------------------------------------------------------------

    def prepare(self, lm, workdir: Path) -> None:
        from evalkit.evals.lmeval.adapter import resolve_tasks
        from evalkit.evals.lmeval.items import items_from_results

        if self.params.get("chat_template"):
            from evalkit.evals.generation.serving import require_chat_template

            require_chat_template(lm, "lmeval")

        # like `lm_eval --model_args pretrained=...`, the model's path reaches the tasks as metadata
        metadata = {"pretrained": str(lm.path), **self.params["metadata"]}
        self._tasks = resolve_tasks(self.params["tasks"], tuple(self.params["include"]), metadata)
        backend = backend_of(self)
        self.request = LmevalRequest(batch_size=self.params.get("batch_size"))
        backend.prepare_lmeval(self.request, lm)
        self._model = lm.model
        if (
            not backend.capabilities.reusable_baseline
        ):  # the engine's own baseline run, in memory (flip rates against it)
            results = self._run(lm, None)
            self.baseline_items = items_from_results(results)
            self.baseline_summary = _jsonable({k: v for k, v in results.items() if k != "samples"})
            return
        from evalkit.evals.lmeval import baseline_cache as cache
        from evalkit.evals.lmeval.adapter import include_paths

        key = cache.baseline_key(
            lm,
            format=BASELINE_FORMAT,
            params=self.canonical_params(),
            task_folders=include_paths(self.params["include"]),
        )
        self.baseline_path = cache.baseline_file(workdir, "lmeval", key)
        stored = cache.read_baseline(self.baseline_path, key, {"items": dict, "summary": dict})
        if stored is not None:
            self.baseline_items = stored["items"]
            self.baseline_summary = stored["summary"]
            return
        results = self._run(lm, None)
        self.baseline_items = items_from_results(results)
        self.baseline_summary = _jsonable({k: v for k, v in results.items() if k != "samples"})
        payload = {
            "items": self.baseline_items,
            "summary": self.baseline_summary,
            "samples": _jsonable(results["samples"]),
        }
        cache.write_baseline(self.baseline_path, key, payload)

    def _run(self, lm, scheme) -> dict:
        """lm-eval's evaluator on the backend's lm-eval model for ``scheme`` (None: the baseline run)."""
        from evalkit.evals.lmeval.adapter import run_lm_eval

        p = self.params
        with backend_of(self).lmeval_model(self.request, lm, scheme) as model:
            self._batch_size = model.batch_size
            chat = {"apply_chat_template": True} if p.get("chat_template") else {}  # off: the call as before it
            return run_lm_eval(
                model,
                self._tasks,
                num_fewshot=p["num_fewshot"],
                limit=p["limit"],
                bootstrap_iters=p["bootstrap_iters"],
                **chat,
            )

    # ---- per scheme -------------------------------------------------------------------------

    def evaluate(self, lm, scheme, artifacts: Path | None = None) -> list[MetricRow]:
        from evalkit.evals.lmeval.items import items_from_results

        self.require_prepared(hasattr(self, "_model") and self._model is lm.model)  # lm.model: None for an engine
        results = self._run(lm, scheme)
        items = items_from_results(results)
        if artifacts is not None:
            artifacts = Path(artifacts)
            artifacts.mkdir(parents=True, exist_ok=True)
            (artifacts / "lmeval_samples.json").write_text(
                json.dumps({"scheme": str(scheme), "items": items, "samples": _jsonable(results["samples"])})
            )
        params = {**self.params, "batch_size": self._batch_size}  # the one used: device default resolved
        rows = metric_rows(results, params) + flip_rows(results, items, self.baseline_items, params)
        return stamp(not_measured_under(scheme, results, rows), backend_of(self))


ONE_FORWARD_TYPES = ("loglikelihood", "loglikelihood_rolling", "multiple_choice")


def not_measured_under(scheme, results: dict, rows: list[MetricRow]) -> list[MetricRow]:
    """``rows`` with those of one-forward tasks (log-likelihoods, multiple choice) marked "not measured by
    this protocol" (no value, no interval) when ``scheme``'s engine attends a first write from the raw
    K/V: such a task reads no quantized value, and its 0-flip, baseline-equal rows would pass a budget
    vacuously. Generation tasks (``generate_until``) read the cache in decode and keep their numbers."""
    from evalkit.kv.scheme import one_forward_reads_raw

    if not one_forward_reads_raw(scheme):
        return rows
    types = {task: (cfg or {}).get("output_type") for task, cfg in results.get("configs", {}).items()}
    why = (
        f"not measured by this protocol: {scheme} attends a sequence's first write (this task's one forward per "
        "request) from the raw K/V, so no quantized value is read"
    )
    out = []
    for r in rows:
        task = r.metric.split("/", 1)[0]
        if types.get(task) in ONE_FORWARD_TYPES:
            r = MetricRow(r.metric, math.nan, None, None, labels=r.labels, info={**r.info, "not_measured": why})
        out.append(r)
    return out


BASELINE_FORMAT = 1  # bump when the cached baseline's items or summary change shape


# ---- rows ------------------------------------------------------------------------------------


def _metric_name(task: str, metric: str, filt: str) -> str:
    return f"{task}/{metric}" if filt == "none" else f"{task}/{metric}[{filt}]"


def leaf_tasks(results: dict, task: str) -> list[str]:
    """The leaf tasks under a task or group name (a leaf is its own only member)."""
    subtasks = results.get("group_subtasks", {}).get(task)
    if not subtasks:
        return [task]
    return [leaf for sub in subtasks for leaf in leaf_tasks(results, sub)]


def provenance(results: dict, task: str, params: dict) -> dict[str, Any]:
    from evalkit.evals.lmeval.adapter import lm_eval_version

    leaves = leaf_tasks(results, task)
    n_items = sum(int(results.get("n-samples", {}).get(t, {}).get("effective", 0)) for t in leaves)
    info = {
        "lm_eval_version": lm_eval_version(),
        "task": task,
        "task_version": results.get("versions", {}).get(task),
        "n_shot": results.get("n-shot", {}).get(task),
        "limit": params["limit"],
        "n_items": n_items,
        "batch_size": params["batch_size"],
    }
    if params.get("chat_template"):
        info["chat_template"] = True
    if task in results.get("configs", {}):
        info["config"] = _jsonable(results["configs"][task])
    else:
        info["subtasks"] = leaves
    return info


PROPORTIONS = ("acc", "acc_norm", "exact_match")


def proportion_ci(value: float, n: int, low, high) -> tuple[float | None, float | None]:
    """Wilson 95 % interval when ``value`` is k/n for whole k; else the normal one clipped to [0, 1]."""
    from evalkit.evals.stats import binomial_ci

    k = value * n
    if n > 0 and abs(k - round(k)) < 1e-6 * n:
        return binomial_ci(int(round(k)), n)
    if low is None:
        return None, None
    return max(0.0, low), min(1.0, high)


def metric_rows(results: dict, params: dict) -> list[MetricRow]:
    rows = []
    for task, metrics in results["results"].items():
        info = provenance(results, task, params)
        for key, value in metrics.items():
            if "," not in key or "_stderr," in key or not isinstance(value, (int, float)):
                continue
            metric, filt = key.split(",", 1)
            stderr = metrics.get(f"{metric}_stderr,{filt}")
            stderr = float(stderr) if isinstance(stderr, (int, float)) and math.isfinite(stderr) else None
            low, high = (value - 1.96 * stderr, value + 1.96 * stderr) if stderr is not None else (None, None)
            if metric in PROPORTIONS:
                low, high = proportion_ci(float(value), info["n_items"], low, high)
            rows.append(
                MetricRow(
                    _metric_name(task, metric, filt),
                    float(value),
                    low,
                    high,
                    labels={"task": task, "filter": filt},
                    info={
                        **info,
                        "stderr": stderr,
                        "lm_eval_metric": key,
                        "higher_is_better": results.get("higher_is_better", {}).get(task, {}).get(metric),
                    },
                )
            )
    return rows


def flip_rows(results: dict, items: dict, baseline: dict, params: dict) -> list[MetricRow]:
    from evalkit.evals.lmeval.items import compare_items

    rows = []
    for task in results["results"]:
        leaves = leaf_tasks(results, task)
        if any(t not in items or t not in baseline for t in leaves):
            continue
        ours = [dict(i, task=t) for t in leaves for i in items[t]]
        base = [dict(i, task=t) for t in leaves for i in baseline[t]]
        if len(leaves) > 1:  # doc ids repeat across subtasks: make them unique within the group
            for group in (ours, base):
                for i in group:
                    i["doc_id"] = f"{i['task']}:{i['doc_id']}"
        info = provenance(results, task, params)
        for filt, stats in compare_items(base, ours).items():
            for stat, (value, low, high, extra) in stats.items():
                rows.append(
                    MetricRow(
                        _metric_name(task, stat, filt),
                        value,
                        None if math.isnan(low) else low,
                        None if math.isnan(high) else high,
                        labels={"task": task, "filter": filt},
                        info={**info, **extra},
                    )
                )
    return rows
