"""``longcontext``: lm-eval's RULER and LongBench v2 under each KV scheme, every score per context length,
each paired item by item with the baseline.

    python -m evalkit run --eval longcontext                       # the offline stand-ins (tasks/longcontext)
    python -m evalkit run --eval longcontext --longcontext-tasks ruler,longbench2 \\
        --longcontext-lengths 4k,8k,16k,32k,64k,128k --longcontext-limit 50 --model meta-llama/Llama-3.1-8B-Instruct

lm-eval builds the tasks once per model (RULER generates its items with the model's tokenizer at
every length of ``lengths``, lm-eval's ``max_seq_lengths`` metadata) and runs them with its own
evaluator on the backend's lm-eval model (the emulation's ``HFLM`` inside ``quantized_kv``, as the
``lmeval`` eval; :mod:`evalkit.evals.lmeval.adapter`). ``limit`` takes the first N documents of each
task **at each length** (:func:`evalkit.evals.longcontext.items.select_documents`). The baseline's
per-item scores are cached on disk (keyed by the weights, parameters, task files and library
versions), as the lmeval eval caches its own.

Rows, for every leaf task, every group asked for (its leaves' items pooled), at each length and over
all lengths (``labels``: task, length; :mod:`evalkit.evals.longcontext.paired` says how each is
computed):

* ``<task>/score``: the mean per-item score (RULER's share of expected values found, LongBench v2's
  accuracy), 95 % interval; ``info`` holds lm-eval's own aggregate of that length for a leaf task;
* ``<task>/score_diff``: mean paired difference from the baseline, 95 % interval (Tango's score
  interval for 0/1 scores, else Student's t over items), its test and p-value in ``info`` (exact
  McNemar for 0/1 scores, else the paired t test);
* ``<task>/p_value``: that p-value as a row of its own, **per cell**, and in its info ``p_holm``, Holm's
  adjustment over the run's cells of one leaf task at one length (``holm_family`` cells: about 100 for
  the GPU preset's tasks x lengths), for a reader who scans them all; ``<task>/discordance``: share of
  items whose score changed (Wilson interval), the measured ``p_disc`` of :mod:`evalkit.planning.decision`.

The ``all`` length pools a task's items over its lengths: every (document, length) is one item, so a
document asked at several lengths counts once per length, as independent (``pooled`` in the info).

Under a scheme whose engine attends a first write from the raw K/V (TurboQuant, UltraQuant), a
one-forward task (LongBench v2's log-likelihoods) reads no quantized value: its rows are marked not
measured, as the lmeval eval marks them (:func:`evalkit.evals.lmeval.evaluation.not_measured_under`).

``prefix_cache_hit`` serves the generated items (RULER) with prefix caching, as vLLM does by default: each
prompt reads the 16-token blocks it shares with an earlier prompt of the run from the quantized cache
(:mod:`evalkit.evals.lmeval.prefix_hits`; RULER's items at one length share the instructions and the
haystack up to where they differ); the rows say so (``info["prefill"]``). Log-likelihood tasks keep
their one forward.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, ClassVar

from evalkit.errors import EvalkitError
from evalkit.evals.backend import LmevalRequest, backend_of, stamp
from evalkit.evals.base import Evaluation, MetricRow, ReportSpec, register_eval
from evalkit.evals.longcontext.items import length_order, pair, records_from_results, select_documents
from evalkit.evals.longcontext.longbench2 import PUBLISHED_MAX_LEN
from evalkit.evals.longcontext.paired import compare, finite, holm
from evalkit.evals.longcontext.params import LongContextParams  # noqa: F401 (re-exported: it was declared here)

BASELINE_FORMAT = 1


@register_eval("longcontext")
class LongContextEval(Evaluation):
    grows = "limit"
    numerics_version = 1  # 1: Tango + exact McNemar for 0/1 tasks, paired t otherwise; Holm across cells
    request = "lmeval"  # lm-eval's RULER / LongBench v2 through lm-eval's model
    Params = LongContextParams
    summary_metrics: ClassVar[tuple[str, ...]] = ()
    report = ReportSpec(
        frames=("evalkit.evals.longcontext.report:frame",),
        displays=("evalkit.evals.longcontext.report:display",),
        plots=("evalkit.evals.longcontext.plots:longcontext_figures",),
        order=45,
    )

    @classmethod
    def workload(cls, params: dict[str, Any], facts, device: str = "cpu"):
        from evalkit.evals.longcontext.workload import longcontext_work

        return longcontext_work(params, facts, device)

    # ---- per model --------------------------------------------------------------------------

    def canonical_params(self) -> dict[str, Any]:
        """The parameters, without ``prefix_cache_hit`` while it is off, ``chat_template`` while unset and
        ``longbench2_max_len`` at its published default: runs made before they existed keep their ids (unset
        leaves those runs' tasks as they were)."""
        from evalkit.evals.longcontext.longbench2 import PUBLISHED_MAX_LEN

        defaults = {"prefix_cache_hit": False, "chat_template": None, "longbench2_max_len": PUBLISHED_MAX_LEN}
        return {k: v for k, v in self.params.items() if not (k in defaults and v == defaults[k])}

    def _metadata(self, lm) -> dict:
        meta = {"pretrained": str(lm.path)}  # RULER sizes its items with this tokenizer
        if self.params["lengths"]:
            meta["max_seq_lengths"] = list(self.params["lengths"])
        if self.params.get("longbench2_max_len", PUBLISHED_MAX_LEN) != PUBLISHED_MAX_LEN:
            meta["longbench2_max_len"] = self.params["longbench2_max_len"]  # the published loaders' truncation
        return meta

    def prepare(self, lm, workdir: Path) -> None:
        from evalkit.evals.longcontext.tasks import load_tasks, resolve

        p = self.params
        longest = getattr(lm.config, "max_position_embeddings", None)
        too_long = [n for n in p["lengths"] or () if longest and n > longest]
        if too_long:  # lm-eval's HFLM would cut such prompts from the left, silently
            raise EvalkitError(
                f"longcontext length {too_long[0]} is above {lm.name}'s maximum context {longest}: drop it from lengths"
            )
        self._taskset = resolve(p["tasks"], tuple(p["include"]), self._metadata(lm))
        loaded = load_tasks(self._taskset, p["tasks"])
        self._loaded, self._groups = loaded["tasks"], loaded["groups"]
        per_leaf = {leaf: p["limits"][name] for name in p["limits"] for leaf in loaded["members"][name]}
        self._samples = select_documents(self._loaded, p["limit"], per_leaf)
        self._serve(lm)
        backend = backend_of(self)
        if p["prefix_cache_hit"] and not backend.capabilities.cache_reuse:
            raise EvalkitError(
                f"--longcontext-prefix-cache-hit is modelled on the emulation; backend {backend.name} serves with its "
                "own prefix cache: drop the flag or use --engine emulation"
            )
        self.request = LmevalRequest(batch_size=p["batch_size"], prefix_cache_hit=p["prefix_cache_hit"])
        backend.prepare_lmeval(self.request, lm)
        self._model = lm.model
        if not backend.capabilities.reusable_baseline:
            self.baseline = records_from_results(self._run(lm, None))
            return
        from evalkit.evals.lmeval import baseline_cache as cache
        from evalkit.evals.longcontext.tasks import TASKS_DIR

        folders = (TASKS_DIR, *p["include"])
        key = cache.baseline_key(lm, format=BASELINE_FORMAT, params=self.canonical_params(), task_folders=folders)
        path = cache.baseline_file(workdir, "longcontext", key)
        stored = cache.read_baseline(path, key, {"items": list})
        if stored is not None:
            self.baseline = stored["items"]
            return
        self.baseline = records_from_results(self._run(lm, None))
        cache.write_baseline(path, key, {"items": self.baseline})

    def _serve(self, lm) -> None:
        """Which tasks go through the chat template, and a check that the published LongBench v2 prompts fit
        (:mod:`evalkit.evals.longcontext.serving`)."""
        from evalkit.evals.longcontext.serving import chat_tasks, check_fit

        if self.params.get("chat_template"):
            from evalkit.evals.generation.serving import require_chat_template

            require_chat_template(lm, "longcontext")
        self._chat = chat_tasks(self._loaded, self.params.get("chat_template"), lm.tokenizer)
        if self.params.get("prefix_cache_hit") and self._chat and set(self._loaded) - self._chat:
            raise EvalkitError(  # two lm-eval calls would each count their own hits: the row would tell one
                "--longcontext-prefix-cache-hit with tasks both through the chat template and without it: run them "
                "apart (name the published LongBench v2 tasks in a run of their own) or pass --longcontext-chat-template"
            )
        check_fit(self._loaded, self._samples, self._chat, lm.tokenizer, lm.max_length, lm.name)

    def _run(self, lm, scheme) -> dict:
        from evalkit.evals.longcontext.serving import run_tasks

        max_len = self.params.get("longbench2_max_len", PUBLISHED_MAX_LEN)
        with backend_of(self).lmeval_model(self.request, lm, scheme) as model:
            self._batch_size = model.batch_size
            results = run_tasks(model, self._taskset, self._loaded, self._samples, self._chat, lm.tokenizer, max_len)
        if self.params["prefix_cache_hit"]:
            self._hits = list(model.last_hits or [])
        return results

    # ---- per scheme -------------------------------------------------------------------------

    def evaluate(self, lm, scheme, artifacts: Path | None = None) -> list[MetricRow]:
        from evalkit.evals.longcontext.tasks import to_json

        self.require_prepared(hasattr(self, "_model") and self._model is lm.model)  # lm.model: None for an engine
        results = self._run(lm, scheme)
        records = records_from_results(results)
        if artifacts is not None:
            Path(artifacts).mkdir(parents=True, exist_ok=True)
            (Path(artifacts) / "longcontext_items.json").write_text(
                json.dumps({"scheme": str(scheme), "items": records, "baseline": self.baseline})
            )
        info = {
            "lm_eval_version": _lm_eval_version(),
            **({"chat_template": sorted(self._chat)} if self._chat else {}),
            "lengths": self.params["lengths"],
            "limit": self.params["limit"],
            "batch_size": self._batch_size,
            "configs": {t: to_json(results["configs"][t]) for t in results.get("configs", {})},
        }
        if self.params["prefix_cache_hit"]:
            from evalkit.evals.lmeval.prefix_hits import hits_note

            info["prefill"] = hits_note(self._hits)
        rows = paired_rows(pair(self.baseline, records), self._groups, results, info)
        return stamp(not_measured(scheme, results, self._groups, rows), backend_of(self))


def _lm_eval_version() -> str:
    from evalkit.evals.lmeval.adapter import lm_eval_version

    return lm_eval_version()


# ---- rows ------------------------------------------------------------------------------------


def _lm_eval_value(results: dict, task: str, length: str) -> float | None:
    """lm-eval's own aggregate of leaf ``task`` at ``length``: RULER's metric named by that length; over
    ``all`` lengths of a task whose metric is not named by length (LongBench v2), its first metric."""
    metrics = results.get("results", {}).get(task, {})
    value = metrics.get(f"{length},none")
    if value is None and length == "all":
        names = [k for k in metrics if k.endswith(",none") and "_stderr" not in k and not k.split(",")[0].isdigit()]
        value = metrics[names[0]] if names else None
    return float(value) if isinstance(value, (int, float)) and value != -1 else None


def paired_rows(pairs, groups: dict, results: dict, info: dict) -> list[MetricRow]:
    """Rows of every leaf task and group, at each length and over all lengths (module docstring)."""
    by_task: dict[str, list] = {}
    for b, s in pairs:
        by_task.setdefault(b["task"], []).append((b, s))
    units = {t: [t] for t in by_task}
    for group in groups:
        leaves = _leaves(group, groups)
        if len(leaves) > 1 and all(t in by_task for t in leaves):
            units[group] = leaves
    rows = []
    for unit, leaves in units.items():
        unit_pairs = [p for t in leaves for p in by_task[t]]
        lengths = sorted({b["length"] for b, _ in unit_pairs}, key=length_order)
        for length in [*lengths, *(["all"] if len(lengths) > 1 else [])]:
            chosen = [(b, s) for b, s in unit_pairs if length in ("all", b["length"])]
            stats = compare([s["score"] for _, s in chosen], [b["score"] for b, _ in chosen])
            labels = {"task": unit, "length": length}
            extra = {**info, "n_items": stats.n, "binary": stats.binary, "subtasks": leaves}
            if length == "all":
                extra["pooled"] = "every length's items, each (document, length) one item"
            if unit in by_task:
                extra["lm_eval_value"] = _lm_eval_value(results, unit, length)
            extra["configs"] = {t: info["configs"].get(t) for t in leaves}
            rows += [
                MetricRow(f"{unit}/score", stats.score, *stats.score_ci, labels=labels, info=extra),
                MetricRow(
                    f"{unit}/score_diff",
                    stats.diff,
                    *stats.diff_ci,
                    labels=labels,
                    info={
                        **extra,
                        "baseline_score": stats.baseline,
                        "baseline_ci": list(stats.baseline_ci),
                        "test": stats.test,
                        "p_value": stats.p_value,
                        "right_to_wrong": stats.right_to_wrong,
                        "wrong_to_right": stats.wrong_to_right,
                    },
                ),
                MetricRow(
                    f"{unit}/p_value", stats.p_value, None, None, labels=labels, info={**extra, "test": stats.test}
                ),
                MetricRow(
                    f"{unit}/discordance",
                    stats.discordance,
                    *stats.discordance_ci,
                    labels=labels,
                    info={**extra, "n_changed": stats.right_to_wrong + stats.wrong_to_right},
                ),
            ]
    return [_finite(r) for r in _holm_rows(rows, set(by_task))]


def _holm_rows(rows: list[MetricRow], leaves: set) -> list[MetricRow]:
    """``p_holm`` and ``holm_family`` into the info of every p-value row of a leaf task at one length."""
    cells = [
        i
        for i, r in enumerate(rows)
        if r.metric.endswith("/p_value") and r.labels["task"] in leaves and r.labels["length"] != "all"
    ]
    adjusted = holm([rows[i].value for i in cells])
    for i, p in zip(cells, adjusted):
        r = rows[i]
        info = {**r.info, "p_holm": finite(p), "holm_family": len(cells)}
        rows[i] = MetricRow(r.metric, r.value, r.ci_low, r.ci_high, labels=r.labels, info=info)
    return rows


def _finite(row: MetricRow) -> MetricRow:
    return MetricRow(row.metric, row.value, finite(row.ci_low), finite(row.ci_high), labels=row.labels, info=row.info)


def _leaves(name: str, groups: dict) -> list[str]:
    members = groups.get(name)
    if not members:
        return [name]
    return [leaf for m in members for leaf in _leaves(m, groups)]


def not_measured(scheme, results: dict, groups: dict, rows: list[MetricRow]) -> list[MetricRow]:
    """``rows`` with those of one-forward tasks (and groups holding one) marked not measured when
    ``scheme``'s engine attends a first write from the raw K/V (see the module docstring)."""
    from evalkit.evals.lmeval.evaluation import ONE_FORWARD_TYPES
    from evalkit.kv.scheme import one_forward_reads_raw

    if not one_forward_reads_raw(scheme):
        return rows
    types = {t: (c or {}).get("output_type") for t, c in results.get("configs", {}).items()}
    why = (
        f"not measured by this protocol: {scheme} attends a sequence's first write (this task's one forward per "
        "request) from the raw K/V, so no quantized value is read"
    )
    out = []
    for r in rows:
        task = r.labels.get("task")
        if any(types.get(leaf) in ONE_FORWARD_TYPES for leaf in _leaves(task, groups)):
            r = MetricRow(r.metric, math.nan, None, None, labels=r.labels, info={**r.info, "not_measured": why})
        out.append(r)
    return out
